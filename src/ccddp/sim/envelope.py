"""What a prediction rests on: the calibrated envelope, the assumed fields, the security
trade-off of a setting.

A profile says how far its measurements reach (``envelope_chains``,
``envelope_min_bytes``/``envelope_max_bytes``: the chains and message sizes its crypto
was measured or fitted over) and which of its values nothing measured (source ASSUMED).
A setting beyond the envelope extrapolates the model; a prediction whose answer moves
when an assumed value moves rests on that assumption. Both are said beside every
recommendation.

Example::

    hw = load_profile("paper-h100")
    outside_envelope(hw, Schedule("pipelined", chains=1024), n=8)
    # ['chains 1024 > 64, the most any measurement or fit behind paper-h100 used']
    rests_on(hw, lambda h: predict(h, wl, Schedule("naive"), 8)["cc_on_ms"])
    # [('dec_gbps', 0.07), ...]: the assumed fields the time moves with, and how much
"""

from __future__ import annotations

from typing import Any

from ccddp.errors import ConfigError
from ccddp.sim.profile import FIELDS, Source

# Settings whose gain rests on a field no schedule of the paper or of ccddp measured.
_MODEL_ONLY = {"mac_batch": "tag_us", "pad_budget_bytes": "xor_gbps"}


def outside_envelope(hw: Any, sched: Any, n: int) -> list[str]:
    """Why ``sched`` on ``n`` ranks goes beyond what ``hw``'s measurements cover (empty
    when it stays inside)."""
    if not sched.sealed:
        return []
    out = []
    chains = sched.chains_for(hw, n)
    if chains > hw.envelope_chains:
        out.append(f"chains {chains} > {hw.envelope_chains}, the most any measurement or "
                   f"fit behind {hw.name} used")
    if sched.segmented:
        seg = sched.segment_bytes
        if seg < hw.envelope_min_bytes or seg > hw.envelope_max_bytes:
            out.append(f"segment {seg / (1 << 20):g} MiB outside the "
                       f"{hw.envelope_min_bytes / (1 << 20):g}-"
                       f"{hw.envelope_max_bytes / (1 << 20):g} MiB the crypto of {hw.name} "
                       "was measured or fitted over")
    for setting, field in _MODEL_ONLY.items():
        if getattr(sched, setting) not in (0, 0.0, 1) and \
                hw.field(field).source is not Source.MEASURED:
            out.append(f"{setting} rests on {field}, which nothing measured for {hw.name}")
    return out


def security_tradeoff(sched: Any) -> str | None:
    """The security a setting gives up for speed, in one sentence (None: none)."""
    if sched.schedule == "group-key-allgather":
        return ("the group-key all-gather shares one key among all ranks: a compromised "
                "rank can forge any all-gather frame (per-link keys confine it to its links)")
    if sched.schedule == "native":
        return ("inside a node the gradients are protected by the CC system, not sealed by "
                "ccddp: plaintext on NVLink inside a fenced node (Hopper) or the hardware's "
                "link encryption (Blackwell)")
    if sched.mac_batch > 1:
        return ("batched MAC verifies several segments with one tag, after all of them "
                "arrived: a forged segment is caught before the collective returns, not "
                "before it is reduced")
    return None


def rests_on(hw: Any, predict_ms, *, threshold: float = 0.05,
             factor: float = 2.0) -> list[tuple[str, float]]:
    """The ASSUMED numeric fields of ``hw`` the quantity ``predict_ms(profile)`` moves with:
    each is halved and doubled (``factor``), and the largest relative change is kept if it
    exceeds ``threshold``. Largest first.

    Example::

        rests_on(hw, lambda h: predict(h, wl, sched, 8)["cc_on_ms"])
    """
    base = predict_ms(hw)
    out = []
    for f in FIELDS:
        if not f.recorded or f.kind not in ("float", "int") or \
                hw.field(f.name).source is not Source.ASSUMED:
            continue
        v = getattr(hw, f.name)
        if v == 0 or v == float("inf"):
            continue
        worst = 0.0
        for k in (1 / factor, factor):
            new = v * k
            if f.kind == "int":
                new = max(1, round(new))
            if f.check in ("frac", "unit"):
                new = min(new, 1.0)
            if f.check == "ge1":
                new = max(new, 1.0)
            try:
                changed = predict_ms(hw.replace(**{f.name: new}))
            except ConfigError:     # a value the profile rejects
                continue
            if base > 0:
                worst = max(worst, abs(changed / base - 1))
        if worst > threshold:
            out.append((f.name, worst))
    return sorted(out, key=lambda t: -t[1])


__all__ = ["outside_envelope", "security_tradeoff", "rests_on"]

"""The control plane under a host that rewrites what a rank receives.

Each test reproduces an attack as it was found against ccddp, playing the host below
ccddp at torch.distributed's own functions (``_hostile_host``):

- a rank pinned to an earlier session by replaying that session's setup messages to it
  -- within one process (a second group) and across two runs with the same persistent
  secret -- must not seal under any (key, nonce) pair it used before, and every rank must
  fail the setup with a ConfigError;
- a malicious pickle slipped into the per-rank records ``ccddp train`` gathers after the
  last step must never run, and the altered records must fail authentication;
- the package sends nothing through ``*_object`` collectives and unpickles nothing.
"""

from __future__ import annotations

import ast
import pathlib
from collections import Counter

import pytest

from _security_util import spawn

SECRET_HEX = "9c41d1a4f3be0a7d6c25e8b07f9e4a316d52c8e1b9a07f34e6d2c58b1a90f7e3"
VICTIM = 1
SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "ccddp"


def _sealed_by(rank: int, nonce_hex: str) -> bool:
    return int(nonce_hex[:8], 16) >> 16 == rank


class SetupReplay:
    """While recording, keeps every control-plane message this rank receives; while
    replaying, the k-th receive gets the k-th recorded message in every other rank's slot
    (this rank's own slot is left alone, as a host that cannot forge it would), wherever
    the recording holds a message of the same size."""

    def __init__(self, rank: int, n: int, recorded: list | None = None) -> None:
        self.rank, self.n = rank, n
        self.mode: str | None = None
        self.recorded: list = recorded if recorded is not None else []
        self.replayed = 0

    def __call__(self, kind: str, tensors) -> None:
        if kind == "irecv" or self.mode is None:
            return      # data frames are not this attack's business
        if self.mode == "record":
            self.recorded.append((kind, [t.clone() for t in tensors]))
            return
        if self.replayed >= len(self.recorded):
            return
        old_kind, old = self.recorded[self.replayed]
        self.replayed += 1
        if old_kind != kind or [t.shape for t in old] != [t.shape for t in tensors]:
            return      # a message the recording has no same-sized copy of: pass it on
        if kind == "broadcast":
            tensors[0].copy_(old[0])
        elif kind == "all_gather":
            for r, (t, o) in enumerate(zip(tensors, old)):
                if r != self.rank:
                    t.copy_(o)
        else:
            width = tensors[0].numel() // self.n
            for r in range(self.n):
                if r != self.rank:
                    tensors[0][r * width:(r + 1) * width].copy_(old[0][r * width:(r + 1) * width])


def _pinned_rank(rank, n, record_file, mode):
    """Group A is set up cleanly (the victim's host records its setup); then group B is set
    up with A's setup replayed to the victim -- in the same process (mode "process"), or
    in a second run that replays the first run's recording (mode "run1"/"run2")."""
    import torch

    from _hostile_host import HostileHost
    from ccddp.bench.reference import all_reduce
    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto.keys import GroupSecret

    log: list[tuple[str, str, str]] = []
    secret = GroupSecret.from_hex(SECRET_HEX)
    settings = CommSettings(segment_bytes=1024, timeout_s=5)
    replay = SetupReplay(rank, n, torch.load(record_file) if mode == "run2" and rank == VICTIM else None)
    host = HostileHost(replay).install()
    host.active = rank == VICTIM

    def group(name: str):
        return SecureGroup(settings, secret, recorder=lambda k, nonce: log.append((name, k.hex(), nonce.hex())),
                           transport=Transport.open(None, settings.timeout_s))

    outcome = {}
    if mode != "run2":
        replay.mode = "record"
        a = group("A")
        replay.mode = None
        x = torch.ones(4096)
        all_reduce(x, a)
        outcome["A"] = bool((x == n).all())
        if mode == "run1" and rank == VICTIM:
            torch.save(replay.recorded, record_file)
    if mode != "run1":
        replay.mode = "replay"
        try:
            b = group("B")
            replay.mode = None
            all_reduce(torch.ones(4096), b)
            outcome["B"] = "completed"
        except Exception as e:  # noqa: BLE001 - the type is asserted on
            outcome["B"] = type(e).__name__
            outcome["B_message"] = str(e)
    host.uninstall()
    return {"log": log, "outcome": outcome}


def _victim_seals(results) -> list[tuple[str, str]]:
    return [(k, nonce) for r in results for name, k, nonce in r["log"][VICTIM]
            if _sealed_by(VICTIM, nonce)]


def _assert_setup_refused(results, groups_of_b: list[dict]) -> None:
    seals = _victim_seals(results)
    assert len(seals) > 10       # group A ran and sealed
    repeated = [p for p, c in Counter(seals).items() if c > 1]
    assert repeated == [], f"the pinned rank sealed {len(repeated)} (key, nonce) pairs twice"
    for o in groups_of_b:
        assert o["B"] == "ConfigError", o
    # Refused before the first sealed byte of the replayed group, on every rank.
    assert not any(name == "B" for r in results for rank_log in r["log"] for name, _, _ in rank_log)


def test_a_rank_pinned_to_an_earlier_session_in_the_same_process_refuses_it(tmp_path):
    out = [o.value for o in spawn(_pinned_rank, 2, str(tmp_path / "rec.pt"), "process", timeout=120)]
    assert all(o["outcome"]["A"] for o in out)
    results = [{"log": [o["log"] for o in out]}]
    _assert_setup_refused(results, [o["outcome"] for o in out])


def test_a_rank_pinned_to_an_earlier_run_with_the_same_secret_refuses_it(tmp_path):
    record = str(tmp_path / "rec.pt")
    first = [o.value for o in spawn(_pinned_rank, 2, record, "run1", timeout=120)]
    second = [o.value for o in spawn(_pinned_rank, 2, record, "run2", timeout=120)]
    assert all(o["outcome"]["A"] for o in first)
    results = [{"log": [o["log"] for o in first]}, {"log": [o["log"] for o in second]}]
    _assert_setup_refused(results, [o["outcome"] for o in second])


def _payload(marker: str) -> bytes:
    """A pickle that writes ``marker`` when it is loaded."""
    code = f"open({marker!r}, 'w').write('the host ran code in a TEE')"
    return b"cbuiltins\nexec\n(V" + code.encode() + b"\ntR."


def _train_hostile_rank(rank, n, marker):
    """``ccddp train`` (tiny GraphSAGE, CC-on); after the last optimizer step the host
    rewrites every byte rank 0 receives into a malicious pickle."""
    import torch

    from _hostile_host import HostileHost
    from ccddp.bench.train import build_parser, train

    args = build_parser().parse_args(["--workload", "graphsage", "--size", "tiny", "--cc", "on", "--steps", "1",
                                      "--warmup", "1", "--timeout", "10"])
    payload = torch.frombuffer(bytearray(_payload(marker)), dtype=torch.uint8)

    def rewrite(kind, tensors):
        for t in tensors:  # as much of the pickle as the message holds (all of it when it fits)
            if t.dtype == torch.uint8:
                k = min(t.numel(), payload.numel())
                t[:k] = payload[:k]

    host = HostileHost(rewrite).install()
    orig_step, steps = torch.optim.SGD.step, [0]

    def step(self, *a, **kw):
        out = orig_step(self, *a, **kw)
        steps[0] += 1
        host.active = rank == 0 and steps[0] == args.warmup + args.steps
        return out

    torch.optim.SGD.step = step
    try:
        train(args)
    finally:
        host.uninstall()
        torch.optim.SGD.step = orig_step


def test_a_malicious_pickle_in_the_training_records_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    outcomes = spawn(_train_hostile_rank, 2, str(marker), timeout=180,
                     env={"CCDDP_GROUP_SECRET": SECRET_HEX})
    assert not marker.exists(), "the host's pickle ran inside the training process"
    assert outcomes[0].type_name == "IntegrityError", outcomes   # the altered records fail authentication


OBJECT_COLLECTIVES = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                      "send_object_list", "recv_object_list"}


def unpickling_sites(source: str) -> list[str]:
    """Calls of torch.distributed's object collectives (they unpickle what peers send),
    imports of pickle-based modules, and torch.load (an unpickler) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = getattr(getattr(f, "value", None), "id", "")
            if name in OBJECT_COLLECTIVES or (owner == "torch" and name == "load"):
                found.append(name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [m for m in modules if m.split(".")[0] in ("pickle", "cPickle", "dill", "cloudpickle")]
    return found


def test_the_package_neither_unpickles_nor_uses_object_collectives():
    found = {str(p.relative_to(SRC)): unpickling_sites(p.read_text()) for p in SRC.rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_scan_can_fail():
    assert unpickling_sites("import torch.distributed as dist\ndist.all_gather_object(out, obj)\n") == \
        ["all_gather_object"]
    assert unpickling_sites("import pickle\n") == ["pickle"]
    assert unpickling_sites("import torch\ntorch.load(f)\n") == ["load"]


@pytest.mark.parametrize("secret", ["00" * 32, "ab" * 32, "0123456789abcdef" * 4, "01" * 16 + "02" * 16])
def test_guessable_secrets_are_refused(secret):
    from ccddp.crypto.keys import GroupSecret
    from ccddp.errors import ConfigError

    with pytest.raises(ConfigError, match="guessable"):
        GroupSecret.from_hex(secret)


def test_secret_errors_say_what_is_wrong():
    from ccddp.crypto.keys import GroupSecret
    from ccddp.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 32 random bytes.*token_hex"):
        GroupSecret.from_hex("9c41d1a4")
    with pytest.raises(ConfigError, match="hex digits.*character 3 is 'x'"):
        GroupSecret.from_hex("9cx1")
    GroupSecret.from_hex(SECRET_HEX)
    GroupSecret.generate()


def test_the_frame_context_names_the_dtype_in_full():
    """Truncated to 12 bytes, float8_e4m3fn and float8_e4m3fnuz made the same AAD."""
    from ccddp.crypto.aad import FrameContext, Op, Phase

    def aad(dtype: str) -> bytes:
        return FrameContext(b"s" * 16, 1, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, 0, 0, 0, 1, 64, dtype).pack()

    assert aad("float8_e4m3fn") != aad("float8_e4m3fnuz")
    assert aad("float8_e5m2") != aad("float8_e5m2fnuz")

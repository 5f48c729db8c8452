"""The self-test's verdict under a host that forges it.

Found against ccddp: ``ccddp selftest`` gathered every rank's outcome of a case as
plaintext JSON over the process group, so the host -- the thing the self-test checks --
could rewrite a failed case into a pass. Reproduced here as found, playing the host below
ccddp at torch.distributed's own functions (``_hostile_host``), so the same attack runs
against any version:

- a build whose AES-GCM open does not check tags (what the self-test exists to catch)
  returns a wrong result under a flipped frame; the host rewrites the outcome exchange so
  that the receiver "raised IntegrityError at the tampered frame". The row must still
  say the case failed, on every rank;
- a host that alters the sealed report (the outcomes of the last case) is detected: the
  rank that receives it raises IntegrityError instead of returning rows;
- ``ccddp selftest`` exits non-zero when any rank failed, even if rank 0's rows passed.

One launch of two ranks runs the first two.
"""

from __future__ import annotations

import json
import re

import pytest

from _security_util import spawn

SECRET_HEX = "5e0b7c3d9a21f4e86b1d0c7a93f2e5d48c6b1a0f7e3d2c9b85a4f1e0d7c6b3a2"
ROOM = 512  # bytes the host adds to every slot of a plaintext exchange, to fit a forgery


class _NoTagCheck:
    """``AESGCM`` of a broken build: seals as usual, opens without checking the tag (GCM
    without its check is AES-CTR from counter block 2)."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._key, self._real = key, AESGCM(key)

    def encrypt_into(self, *args) -> None:
        self._real.encrypt_into(*args)

    def decrypt_into(self, nonce, frame, aad, out) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        body = memoryview(frame).cast("B")[:-16]
        ctr = Cipher(algorithms.AES(self._key), modes.CTR(bytes(nonce) + b"\0\0\0\2")).decryptor()
        memoryview(out).cast("B")[:] = ctr.update(bytes(body)) + ctr.finalize()


class ForgeOutcomes:
    """The host's rewrite of a plaintext exchange of one byte string per rank (lengths,
    then the strings padded to the longest): it announces ``ROOM`` more bytes for rank
    0 on every rank alike (so the gather stays consistent), restores the real lengths once
    the strings have arrived, and replaces every self-test outcome it can parse with one
    that makes the case pass."""

    def __init__(self, n: int) -> None:
        self.n, self.forged = n, 0
        self._lengths = None

    def __call__(self, kind: str, tensors) -> None:
        import torch

        if kind != "all_gather_flat":
            return
        t = tensors[0]
        if t.dtype == torch.int64 and t.numel() == self.n:
            self._lengths, self._real = t, t.clone()
            t[0] += ROOM
            return
        if t.dtype != torch.uint8 or self._lengths is None:
            return
        lengths, self._lengths = self._lengths, None
        lengths.copy_(self._real)
        width = t.numel() // self.n
        for r in range(self.n):
            forged = self._forge(bytes(t[r * width:r * width + int(lengths[r])].numpy()))
            if forged is not None and len(forged) <= width:
                t[r * width:r * width + len(forged)] = torch.frombuffer(bytearray(forged), dtype=torch.uint8)
                lengths[r] = len(forged)
                self.forged += 1

    @staticmethod
    def _forge(blob: bytes) -> bytes | None:
        try:
            outcome = json.loads(blob)
        except ValueError:
            return None
        if not (isinstance(outcome, dict) and "status" in outcome and "applied" in outcome):
            return None
        label = outcome.get("label")
        if not label:
            # A sender or bystander: finished with a correct result.
            return json.dumps({"status": "ok", "correct": True, "seconds": 0.1, "applied": outcome["applied"],
                               "label": None}).encode()
        # The receiver: "caught it at exactly the frame it waited on" (the plaintext says which).
        m = re.search(r"(\w+#\d+) step (\d+)", label)
        return json.dumps({"status": "error", "type": "IntegrityError", "message": "frame failed authentication",
                           "integrity": True, "timeout": False, "typed": True, "abandoned": False, "seconds": 0.1,
                           "link": "0->1", "collective": m.group(1), "step": m.group(2),
                           "applied": outcome["applied"], "label": label}).encode()


def _flip_rows(secret):
    from ccddp.bench.selftest import run_selftest
    from ccddp.comm import CommSettings

    settings = CommSettings(impl="secure", segment_bytes=1024, chains=1, timeout_s=10)
    return run_selftest(["flip"], ["all_reduce"], settings, short_timeout_s=1.0, secret=secret)


def _hostile_rank(rank, n):
    import torch

    import ccddp.bench.selftest as selftest
    from _hostile_host import HostileHost
    from ccddp.crypto import aead_engines
    from ccddp.crypto.keys import GroupSecret

    secret = GroupSecret.from_hex(SECRET_HEX)
    out = {}
    # 1. A broken build; the host forges the outcomes (every rank's host alike).
    forge = ForgeOutcomes(n)
    host = HostileHost(forge).install()
    host.active, real_aead = True, aead_engines.AESGCM
    aead_engines.AESGCM = _NoTagCheck
    try:
        out["broken"] = {"rows": _flip_rows(secret), "forged": forge.forged}
    finally:
        aead_engines.AESGCM = real_aead
        host.uninstall()

    # 2. A sound build; the host flips a bit in every frame rank 0 receives of the last
    #    report (the outcomes of the case).
    def flip(kind, tensors):
        if kind == "irecv":
            tensors[0].view(torch.uint8)[0] ^= 1

    host = HostileHost(flip).install()
    reports = [0]
    real_gather = getattr(selftest, "gather_json", None)

    def gather_json(obj, group):
        reports[0] += 1
        host.active = rank == 0 and reports[0] == 2
        try:
            return real_gather(obj, group)
        finally:
            host.active = False

    selftest.gather_json = gather_json
    try:
        out["altered"] = {"rows": _flip_rows(secret)}
    except Exception as e:  # noqa: BLE001 - the type is asserted on
        out["altered"] = {"type": type(e).__name__, "message": str(e)}
    finally:
        host.uninstall()
    return out


@pytest.fixture(scope="module")
def hostile_run():
    return spawn(_hostile_rank, 2, timeout=200, pg_timeout=60)


def test_a_forged_outcome_does_not_turn_a_failed_case_into_a_pass(hostile_run):
    for o in hostile_run:
        assert o.ok, o
        rows = o.value["broken"]["rows"]
        assert len(rows) == 1, rows
        row = rows[0]
        assert not row["passed"], f"rank {o.rank}: the host's forgery made a failed case pass: {row}"
        assert "not detected" in row["observed"], row


def test_an_altered_report_is_detected(hostile_run):
    altered = hostile_run[0].value["altered"]
    assert altered.get("type") == "IntegrityError", altered


def test_the_cli_fails_when_any_rank_failed(tmp_path, monkeypatch, capsys):
    """Rank 0's rows all passed, but another rank stopped (say, on a report that failed
    authentication there): the exit status is the AND over ranks."""
    import ccddp.bench.launch
    from ccddp.cli import main
    from ccddp.errors import CCDDPError

    def torchrun(module, args, **kw):
        out = args[args.index("--json") + 1]
        row = {"attack": "flip", "collective": "all_reduce", "world_size": 2, "expected": "e", "observed": "e",
               "passed": True}
        with open(out, "w") as f:
            json.dump({"schema": "ccddp.selftest/1", "rows": [row]}, f)
        raise CCDDPError("rank 1: IntegrityError: frame failed authentication")

    monkeypatch.setattr(ccddp.bench.launch, "torchrun", torchrun)
    assert main(["selftest", "--world-size", "2", "--attacks", "flip", "--collectives", "all_reduce"]) == 1
    captured = capsys.readouterr()
    assert "1 of 1 cases passed" in captured.out and "a rank failed" in captured.err


def test_the_table_shows_a_rows_bracketed_notes():
    """Found: rich read a row's bracketed notes ("[link 0 -> 2]", a failed row's list of
    problems) as markup and dropped them from the printed table."""
    from rich.console import Console

    from ccddp.cli.cmd_selftest import selftest_table

    row = {"attack": "flip", "collective": "all_reduce", "world_size": 4, "passed": False,
           "expected": "IntegrityError at rank 2 [link 0 -> 2]", "observed": "[rank 1: wrong result]"}
    console = Console(width=200, record=True)
    console.print(selftest_table([row]))
    text = console.export_text()
    assert "[link 0 -> 2]" in text and "[rank 1: wrong result]" in text

"""The bounce path (CPU TEE -> sealed staging buffer -> device): batches round-trip, a
changed frame is refused, and two paths given the same key never seal under the same
(key, nonce) pair."""

from __future__ import annotations

import os

import pytest
import torch

from ccddp.bench.bounce import BouncePath
from ccddp.errors import ConfigError, IntegrityError

KEY = bytes(range(32))
SESSION = b"s" * 16


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(4, 8, generator=g), "y": torch.randint(0, 10, (4,), generator=g),
            "empty": torch.empty(0)}


def _frames(staged) -> dict[str, bytes]:
    return {name: st.frame.numpy().tobytes() for name, st in staged.items()}


def test_batches_round_trip():
    path = BouncePath(KEY, session_id=SESSION)
    for seed in range(3):
        batch = _batch(seed)
        got = path.receive(path.stage(batch))
        assert set(got) == set(batch)
        for name, t in batch.items():
            assert torch.equal(got[name], t) and got[name].dtype == t.dtype


def test_a_changed_frame_is_refused():
    path = BouncePath(KEY, session_id=SESSION)
    staged = path.stage(_batch())
    staged["x"].frame[3] ^= 1
    with pytest.raises(IntegrityError, match="cpu->device"):
        path.receive(staged)


def test_two_paths_with_the_same_key_seal_differently():
    """The same key, session and batch: were the paths to seal under the given key, both
    would take counter 0 and write the same frames -- a repeated (key, nonce) pair. Each
    seals under a key of its own, so the frames differ; each opens its own batch, and
    neither opens the other's."""
    a, b = BouncePath(KEY, session_id=SESSION), BouncePath(KEY, session_id=SESSION)
    batch = _batch()
    sa, sb = a.stage(batch), b.stage(batch)
    fa, fb = _frames(sa), _frames(sb)
    for name in batch:
        assert fa[name] != fb[name], name
    got = a.receive(sa)
    assert all(torch.equal(got[k], v) for k, v in batch.items())
    with pytest.raises(IntegrityError):
        b.receive(sa)         # a frame of path a in path b, at the counter it expects
    c = BouncePath(KEY, session_id=SESSION)
    c.stage(batch)
    with pytest.raises(IntegrityError):
        c.receive(sb)


def test_bad_arguments_are_typed():
    with pytest.raises(ConfigError, match="32-byte key"):
        BouncePath(KEY[:16], session_id=SESSION)
    with pytest.raises(ConfigError, match="session id"):
        BouncePath(KEY, session_id=bytes(16))
    BouncePath(os.urandom(32), session_id=SESSION)

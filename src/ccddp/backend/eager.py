"""Methods kept out of dynamo's tracing, without loading dynamo to say so.

Under ``torch.compile`` a collective's op method and its wait must run the sealed op, not
be traced: they are ``torch.compiler.disable``-d. But ``torch.compiler.disable`` imports
``torch._dynamo`` (about 1.2 s of CPU, as much again as ``import torch``), so decorating
them at import made every ccddp rank start twice as slowly as a gloo rank, also a rank
that never compiles (collectives, point-to-point, the benchmarks' ranks).

Nothing can trace before ``torch._dynamo`` is loaded: ``torch.compile`` (and DDP, which
asks dynamo for its mode) load it first. So :func:`keep_eager` replaces the methods by
``torch.compiler.disable``-d ones at once where it is loaded, and otherwise the moment its
module has run, from a finder on ``sys.meta_path`` that wraps the loader of
``torch._dynamo`` (the post-import hook of ``wrapt``, written here: its 30 lines are not
worth a dependency of the core). Invariants:

- a method registered is disabled before any frame can be traced: the replacement runs
  inside the import of ``torch._dynamo``, before that import returns to anyone;
- fails closed: if torch renames ``torch._dynamo.disable`` (what ``torch.compiler.disable``
  calls, and the hook calls), importing ``torch._dynamo`` raises, so ``torch.compile``
  cannot run with these methods traced; ``tests/test_dynamo_eager.py`` checks both orders
  (dynamo loaded before the backend, and after).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading

DYNAMO = "torch._dynamo"

_lock = threading.Lock()                   # guards the two below; never held while importing
_pending: list[tuple[type, str]] = []      # (class, attribute) to disable once dynamo loads
_finder: _AfterDynamoLoads | None = None   # on sys.meta_path while _pending waits


def keep_eager(owner: type, *names: str) -> None:
    """``owner.<name> = torch.compiler.disable(owner.<name>)`` for each name: now if
    ``torch._dynamo`` is loaded (or being loaded by another thread: then once it is), else
    when it loads."""
    global _finder
    targets = [(owner, name) for name in names]
    with _lock:
        loaded = DYNAMO in sys.modules
        if not loaded:
            _pending.extend(targets)
            if _finder is None:
                _finder = _AfterDynamoLoads()
                sys.meta_path.insert(0, _finder)
    if loaded:
        import torch

        _disable(targets, torch.compiler.disable)


def _disable(targets: list[tuple[type, str]], disable) -> None:
    made: dict[int, object] = {}           # one wrapper per function: an alias stays the same object
    for owner, name in targets:
        fn = owner.__dict__[name]
        if id(fn) not in made:
            made[id(fn)] = disable(fn)
        setattr(owner, name, made[id(fn)])


def _on_dynamo_loaded(dynamo) -> None:
    """``dynamo``: the module, run but not yet returned by its import (so not yet an
    attribute of ``torch``): its ``disable`` is what ``torch.compiler.disable`` calls."""
    global _finder
    with _lock:
        targets, _pending[:] = list(_pending), []
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
    _disable(targets, dynamo.disable)


class _AfterDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` as the other finders would, with a loader that calls
    :func:`_on_dynamo_loaded` after the module ran."""

    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname != DYNAMO or getattr(self._finding, "on", False):
            return None
        self._finding.on = True            # the finders after this one, not this one again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.on = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenDisable(spec.loader)
        return spec


class _ThenDisable(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module's own loader again, where inspect and linecache look for it.
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        if getattr(module.__spec__, "loader", None) is self:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _on_dynamo_loaded(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)

"""The start of a process ccddp starts itself (torchrun's agent, the ranks of its commands):
its imports run without Python's cycle collector, and what they made is then moved out of
the collector's reach. ``ccddp launch``'s ranks only do the second, before the user's
script starts: ``python -m ccddp.backend.intercept`` has loaded torch with the package
``ccddp.backend`` before the module's first line runs (:func:`freeze_imports`).

Importing torch makes ~250,000 objects the collector tracks (~480,000 with DDP's
``torch._dynamo``), nearly all alive until the process ends. While they are made, the
collector runs hundreds of times, and each of its full passes walks every one made so far;
after the imports, every full pass of the run walks them again. In this project's test
suite, whose CPU is mostly such processes, the collector took ~18 % of the CPU
(BENCHMARKS.md, "Test suite time: the cycle collector"). So an entry module pauses the
collector before its imports, and its ``main`` resumes it after them, with
:func:`gc.freeze`: the objects stay where they are, and the collector no longer walks
them. Reference counting frees objects as before, and the cycles the run makes are
collected as before. The costs: the reference cycles among the imported objects are never
collected -- those already unreachable at the freeze (~9,000 objects, some hundreds of kB,
measured after ``import ccddp.bench.train``) and any that become unreachable later -- and
``gc.get_objects``/``gc.get_referrers`` no longer see the frozen objects (torch uses the
latter only in debugging aids).

Only a module run as the program (``python -m ccddp.bench.train``) pauses anything: where
it is imported as a library, both calls do nothing. A user's script under ``ccddp launch``
runs with the collector on, as always.

Example (the shape of every entry module)::

    from ccddp.startup import pause_collector, resume_collector

    pause_collector(__name__)      # before the imports below; nothing unless run as __main__
    import torch

    def main():
        resume_collector()         # the imports are done: freeze them, turn the collector on
        ...
"""

from __future__ import annotations

import gc

_paused_here = False


def pause_collector(module_name: str) -> None:
    """Turn the cycle collector off if ``module_name`` is ``"__main__"`` (the module runs as
    the program) and it is on."""
    global _paused_here
    if module_name == "__main__" and gc.isenabled():
        gc.disable()
        _paused_here = True


def resume_collector() -> None:
    """Where :func:`pause_collector` turned the collector off: move every object made so far
    out of its reach (:func:`gc.freeze`) and turn it back on. Otherwise nothing."""
    global _paused_here
    if _paused_here:
        gc.freeze()
        gc.enable()
        _paused_here = False


def freeze_imports() -> None:
    """Move every object made so far out of the collector's reach (:func:`gc.freeze`),
    leaving the collector as it is: for a process whose imports ran before it could pause
    the collector. Call it only where the module runs as the program."""
    gc.freeze()

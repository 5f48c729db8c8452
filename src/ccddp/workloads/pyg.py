"""PyTorch Geometric, loaded without ``transformers``.

Importing any part of ``torch_geometric`` runs its package ``__init__``, which imports its
datasets and, through them, ``torch_geometric.llm.models.llm``, whose one use of
``transformers`` at import time is a type alias it replaces with ``Dict`` where
transformers cannot be imported::

    try:
        from transformers.tokenization_utils_base import BatchEncoding
    except ImportError:
        BatchEncoding = Dict

Loading transformers for that alias is ~1 s of CPU in every process that trains GraphSAGE
(a tiny graphsage rank takes ~4.5 s in all), and nothing this project uses of PyG
(``GraphSAGE``, ``Data``) reads it. So the first import of torch_geometric in a process
runs with transformers marked as not importable -- a ``None`` entry in ``sys.modules``,
the import system's documented way to make an import raise ``ImportError`` -- and the
mark is removed as soon as that import returns.

- Where either is loaded already, nothing changes: a process that has transformers keeps
  it, and PyG is only ever loaded once.
- A PyG release that needs transformers to import at all is loaded the ordinary way: the
  modules of the attempt that failed are dropped first.
- While that one import runs (~1 s, once per process), another thread's first import of
  transformers would fail; a process that imports both in parallel threads should import
  transformers first. ccddp's own threads never import either.

``tests/test_workloads.py`` checks that a fresh process builds GraphSAGE and its data
without transformers, that the model is the same, and that transformers imports
afterwards.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType

_BLOCKED = "transformers"
#: Serialises the first import, so two threads never both set and clear the mark.
_first_import = threading.Lock()


def load(module: str) -> ModuleType:
    """``importlib.import_module(module)`` for a module of torch_geometric, the first one
    loaded without transformers (see the module docstring)."""
    with _first_import:
        if "torch_geometric" not in sys.modules and _BLOCKED not in sys.modules:
            sys.modules[_BLOCKED] = None  # type: ignore[assignment]
            try:
                return importlib.import_module(module)
            except Exception:   # this PyG needs transformers to load: the ordinary way, below
                for name in [n for n in sys.modules if n == "torch_geometric" or n.startswith("torch_geometric.")]:
                    del sys.modules[name]
            finally:
                if _BLOCKED in sys.modules and sys.modules[_BLOCKED] is None:
                    del sys.modules[_BLOCKED]
    return importlib.import_module(module)

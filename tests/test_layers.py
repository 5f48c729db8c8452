"""Imports point down only (README.md, "Architecture"), read from the source: every ``import`` of
every module, those inside functions too, since a function-level import is an import
all the same (it only runs later). The CLI's own check, on what a fresh interpreter
really loads, is in ``test_cli.py``.

    cli
    report                       (tables and figures from JSON; no torch, no bench)
    bench    testing             (measured runs, the SecureDDP harness | the adversary, test tools)
    sim                          (the model: no torch.distributed, no engine)
    workloads
    backend                      (the product's API: the "ccddp" process group)
    comm                         (the engine)
    crypto
    errors chains stats runs config launched startup   (leaves)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "ccddp"

#: The parts of ccddp each part may import (itself always).
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "chains": set(),
    "stats": set(),
    "runs": {"errors", "config"},
    # Configuration read from files and the environment, bounded before it is parsed.
    "config": {"errors"},
    # The job's size as the launch's command line says it (checked by each rank).
    "launched": {"errors"},
    # How a process ccddp starts imports: without the cycle collector (stdlib gc only).
    "startup": set(),
    "crypto": {"errors", "config"},
    "comm": {"crypto", "errors", "chains", "config"},
    "backend": {"comm", "crypto", "errors", "chains", "config", "launched", "startup"},
    "workloads": {"errors"},
    "sim": {"errors", "chains", "stats", "config"},
    "testing": {"comm", "crypto", "errors"},
    "bench": {"testing", "sim", "workloads", "backend", "comm", "crypto", "errors", "chains", "stats",
              "runs", "config", "launched", "startup"},
    "report": {"sim", "errors", "chains", "stats", "runs", "config"},
    "cli": {"report", "bench", "testing", "sim", "workloads", "backend", "comm", "crypto", "errors",
            "chains", "stats", "runs", "config", "launched", "startup"},
    "": {"backend"},            # the package itself: registers the backend when torch is loaded
}
#: The product (what `pip install ccddp` without extras serves): none of the bench extra.
PRODUCT = ("", "errors", "chains", "config", "launched", "startup", "crypto", "comm", "backend")
BENCH_ONLY = {"transformers", "torch_geometric", "matplotlib", "rich", "scipy", "psutil"}
#: Outside packages a part must not import.
MUST_NOT_IMPORT: dict[str, set[str]] = {
    **{part: BENCH_ONLY for part in PRODUCT},
    "sim": {"torch.distributed"},
    "report": {"torch"},
}
#: Import circles (through function-level imports) not yet broken.
KNOWN_CIRCLES = [
    # registration imports the process group and the policy when the backend is created;
    # both import registration's names.
    {"ccddp.backend.registration", "ccddp.backend.process_group", "ccddp.backend.policy"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``path``; ``from pkg import name`` is
    pkg.name where that is a module, else pkg."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            out += [(m, node.lineno) for m in subs]
            if len(subs) < len(node.names):
                out.append((base, node.lineno))
    return out


def _part(module: str) -> str:
    """``ccddp.comm.group`` -> ``comm``; ``ccddp.stats`` -> ``stats``; ``ccddp`` -> ``""``."""
    return module.split(".")[1] if module.count(".") else ""


@functools.lru_cache(maxsize=1)
def _graph() -> dict[str, list[tuple[str, int]]]:
    """Every module's imports, parsed once for all the tests here (read, never changed)."""
    return {m: _imports(m, p) for m, p in MODULES.items()}


def test_the_graph_sees_function_level_imports():
    # ccddp.bench.launch imports psutil only inside a function.
    assert "psutil" in {m.partition(".")[0] for m, _ in _graph()["ccddp.bench.launch"]}
    assert all(_part(m) in MAY_IMPORT for m in MODULES), sorted({_part(m) for m in MODULES} - set(MAY_IMPORT))


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_imports_point_down_only(part):
    wrong = []
    for module, imports in _graph().items():
        if _part(module) != part:
            continue
        for target, line in imports:
            if target.partition(".")[0] == "ccddp" and target != "ccddp" and \
                    _part(target) not in MAY_IMPORT[part] | {part}:
                wrong.append(f"{MODULES[module].relative_to(SRC)}:{line} imports {target}")
            for banned in MUST_NOT_IMPORT.get(part, ()):
                if target == banned or target.startswith(banned + "."):
                    wrong.append(f"{MODULES[module].relative_to(SRC)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    graph = {m: {t for t, _ in imports if t in MODULES and t != m} for m, imports in _graph().items()}
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    assert [c for c in circles if c not in KNOWN_CIRCLES] == []

"""The repository's layout: raw benchmark runs stay folded (issue 40).

A benchmark writes one JSON file per launch or round; kept one by one they made up most of
the repository's files. ``benchmarks/`` keeps BENCHMARKS.md's sources (summaries, profiles,
the scripts that ran a session) and each folder's raw runs folded into one ``runs.json``
(``scripts/folded_runs.py``), so it stays at most ``MAX_BENCHMARK_FILES`` files.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

# git ls-files is one short call, not a rank: this module stays in the fast tier.
pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
MAX_BENCHMARK_FILES = 150


def benchmark_files(root: Path = ROOT) -> list[str]:
    """The files under ``root/benchmarks``: tracked ones from git, or, without git (an
    unpacked archive), every file on disk but Python's caches."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", "benchmarks"],
                             capture_output=True, timeout=30, check=True).stdout
        return [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        pass
    files = []
    for folder, dirs, names in os.walk(root / "benchmarks"):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names if not n.endswith(".pyc")]
    return files


def test_benchmarks_stay_small():
    files = benchmark_files()
    assert files, "no files under benchmarks/: the layout check is looking in the wrong place"
    if len(files) > MAX_BENCHMARK_FILES:
        by_folder: dict[str, int] = {}
        for p in files:
            parts = Path(p).parts
            folder = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
            by_folder[folder] = by_folder.get(folder, 0) + 1
        biggest = ", ".join(f"{f} {n}" for f, n in sorted(by_folder.items(), key=lambda x: -x[1])[:5])
        pytest.fail(
            f"{len(files)} files under benchmarks/, more than the limit of {MAX_BENCHMARK_FILES} (issue 40). "
            f"Fold raw per-round/per-run results into one file per experiment: "
            f"python scripts/folded_runs.py fold benchmarks/FOLDER 'PATTERN' (into benchmarks/FOLDER/runs.json; "
            f"readers take the original paths), or keep only the summary the claims cite. "
            f"Most files: {biggest}.")


def test_folded_runs_are_readable():
    """Every runs.json is a folded-runs file whose entries are what its readers expect."""
    folded = [p for p in benchmark_files() if Path(p).name == "runs.json"]
    for p in folded:
        data = json.loads((ROOT / p).read_text(encoding="utf-8"))
        assert data.get("schema") == "ccddp.benchmarks.runs/1", p
        assert data["files"] and all(isinstance(v, dict) for v in data["files"].values()), p

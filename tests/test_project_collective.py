"""scripts/project_collective.py: model projections of one all-reduce on a changed profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_collective_projection_script_changes_profile_fields(tmp_path):
    """scripts/project_collective.py: a link with its own engine (no core time per byte)
    lets the pipelined schedule hide crypto that naive serializes; bad fields fail in one line."""
    script = str(ROOT / "scripts" / "project_collective.py")

    def rows(*sets):
        out = tmp_path / "p.json"
        args = [a for s in sets for a in ("--set", s)]
        subprocess.run([sys.executable, script, "--profile", "local", "--size", "64M",
                        "--world-sizes", "2", *args, "--json", str(out)], check=True,
                        capture_output=True)
        data = json.loads(out.read_text())
        assert data["model_projection"] is True
        return data["rows"][0]

    shared, own = rows(), rows("link_cpu_gbps=inf")
    assert own["naive_over_pipelined"] > shared["naive_over_pipelined"] >= 1.0
    assert own["naive_ms"] == pytest.approx(shared["naive_ms"])    # naive has nothing to hide behind
    bad = subprocess.run([sys.executable, script, "--set", "no_such_field=1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no_such_field" in bad.stderr

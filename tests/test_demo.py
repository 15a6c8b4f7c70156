"""`python -m smelt demo` (what `make demo` runs), as a new user meets it: cold, then warm."""
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]


def test_demo_tells_cold_from_warm_and_shows_a_steady_figure(tmp_path):
    env = {**os.environ, "SMELT_CACHE_DIR": str(tmp_path / "cache"), "SMELT_GRAPH_CACHE": "1",
           "PYTHONPATH": os.getcwd()}
    runs = [subprocess.run([sys.executable, "-m", "smelt", "demo"], capture_output=True, text=True, timeout=600,
                           env=env) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        out = run.stdout
        assert "matches eager" in out and "middle half" in out and "calls)" in out
        assert "compiled: 1 graph, " in out and "\ndef " in out
        assert "python -m smelt report" in out
    assert "(cold: compiled now" in runs[0].stdout
    assert "(warm: read from the graph cache" in runs[1].stdout

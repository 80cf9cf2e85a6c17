"""benchmarks/rollups_bench.py runs: a small fleet's interval stored both ways, every row new."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import REPO_ROOT


def test_the_bench_stores_each_rounds_interval_both_ways_and_prints_their_ratio():
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # SQLite, in memory
    argv = [sys.executable, str(REPO_ROOT / "benchmarks/rollups_bench.py"), "--gpus", "16", "--rounds", "2"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sqlite, 16 buckets per interval, 2 rounds, 64 rows stored" in done.stdout
    assert "executemany / bulk_create: " in done.stdout

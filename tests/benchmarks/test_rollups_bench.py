"""benchmarks/rollups_bench.py runs: a small fleet's interval stored each of the three ways, every row
new, on a SQLite file as the server keeps it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import REPO_ROOT


def test_the_bench_stores_each_rounds_interval_every_way_and_prints_their_ratios():
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # SQLite
    argv = [sys.executable, str(REPO_ROOT / "benchmarks/rollups_bench.py"), "--gpus", "16", "--rounds", "2"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sqlite, 16 buckets per interval, 2 rounds, 96 rows stored" in done.stdout
    for way in ("bulk_create", "a commit per row", "rollups_save"):
        assert f"  {way}: median " in done.stdout
    assert "rollups_save / a commit per row: wall " in done.stdout
    assert "rollups_save / bulk_create: wall " in done.stdout

"""The ASGI process hands the GIL over every millisecond, not CPython's 5: the gateway's event loop
shares it with sync views that may compute in a thread (the planner); benchmarks/switch_interval_bench.py
measures the loop's round trips at both."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import REPO_ROOT


def test_the_asgi_application_sets_a_one_millisecond_switch_interval():
    probe = ("import sys; default = sys.getswitchinterval(); import controlplane.asgi; "
             "print(default, sys.getswitchinterval())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert [float(v) for v in out] == [0.005, 0.001]

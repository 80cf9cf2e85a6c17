"""Run the schema, frame and task fuzz tests with more examples than CI does.

    .venv/bin/python benchmarks/fuzz_api.py --examples 200

Sets ``MOTLEY_FUZZ_EXAMPLES`` (examples per API operation and role; above 10 it also turns on
schemathesis' coverage phase and random seeds, tests/fuzz/support.py) and runs tests/fuzz/ and the
gateway's /v1/ schema test (tests/gateway/test_schema_fuzz.py) with pytest, in file order; pytest's
exit code is this script's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per operation and role (CI: 4)")
    parser.add_argument("-k", default=None,
                        help="pytest -k expression, e.g. 'api_v1' for the API schema only")
    args = parser.parse_args()
    if args.examples < 1:
        parser.error("--examples must be at least 1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/fuzz/",
               "tests/gateway/test_schema_fuzz.py"]
    if args.k:
        command += ["-k", args.k]
    env = {**os.environ, "MOTLEY_FUZZ_EXAMPLES": str(args.examples)}
    return subprocess.call(command, cwd=REPO, env=env)


if __name__ == "__main__":
    raise SystemExit(main())

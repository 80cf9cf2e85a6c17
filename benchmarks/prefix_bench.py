"""Prefix caching benchmarks: each part side by side with its baseline in one run.

    python benchmarks/prefix_bench.py chat [--work var/bench/prefix --turns 5 --conversations 3 \
        --clients 2 4 6 --window-s 40]
    python benchmarks/prefix_bench.py route [--work var/bench/prefix-route --clients 6 --window-s 90]
    python benchmarks/prefix_bench.py host [--card T4 --layers 8 --prefix 1024 --time-scale 2000]

(a) ``chat`` (benchmarks/prefix_chat.py): multi-turn chat on `make run`'s system, caching off against
on: time to first token of later turns (goal <= 0.2x) and throughput at the same p99 (goal >= 1.5x).
(b) ``route`` (benchmarks/prefix_route.py): two replicas, many concurrent conversations, the
prefix-aware router against the prefix-blind cost router: p99 time to first token (goal <= 0.6x) and
hit rate against one replica alone (goal >= 80 %).
(c) ``host`` (benchmarks/prefix_host.py): the host tier on an emulated old card, copying back
against recomputing, as the planner predicted (goal: within 25 %).
Each prints a Markdown table for docs/benchmarks.md ("Prefix caching").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import prefix_chat, prefix_host, prefix_route  # noqa: E402

PARTS = {
    "chat": (prefix_chat, prefix_chat.chat_bench, "(a) multi-turn chat on make run's system"),
    "route": (prefix_route, prefix_route.route_bench, "(b) two replicas: routing by prefix, or blind to it"),
    "host": (prefix_host, prefix_host.host_tier_bench, "(c) the host tier on an emulated old card"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = parser.add_subparsers(dest="part", required=True)
    for name, (module, _, summary) in PARTS.items():
        module.add_arguments(parts.add_parser(name, help=summary))
    args = parser.parse_args()
    PARTS[args.part][1](args)


if __name__ == "__main__":
    main()

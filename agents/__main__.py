"""``python -m agents run --server URL --join-token TOKEN [--name NAME] [--emulate FLEET --node NODE]``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from agents.agent import Agent
from agents.config import from_args, parser
from contracts.tracing import TRACE_SINK_ENV, tracing_setup, tracing_shutdown


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Its stages (and the fork server they come from) inherit it: traced, they send the control plane
    # their spans for its request timeline (contracts/tracing.py).
    os.environ.setdefault(TRACE_SINK_ENV, args.server)
    config = from_args(args)
    tracing_setup("agent", node=config.name)  # its spans to a collector (otlp): the stages' deploys
    try:
        return asyncio.run(Agent(config).run())
    finally:
        tracing_shutdown()


if __name__ == "__main__":
    sys.exit(main())

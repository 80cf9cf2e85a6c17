"""``python -m agents run --server URL --join-token TOKEN [--name NAME] [--emulate FLEET --node NODE]``."""

from __future__ import annotations

import asyncio
import logging
import sys

from agents.agent import Agent
from agents.config import from_args, parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(Agent(from_args(args)).run())


if __name__ == "__main__":
    sys.exit(main())

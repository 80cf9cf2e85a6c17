"""Entry point of ``python -m controlplane.planning``."""

import sys

from controlplane.planning.cli import main

sys.exit(main())

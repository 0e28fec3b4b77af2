"""``python -m fwbench`` runs the command line."""

import sys

from fwbench.cli import main

sys.exit(main())

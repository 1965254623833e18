"""``python -m commitstore`` runs the command line."""

import sys

from commitstore.cli import main

sys.exit(main())

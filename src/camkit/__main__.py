"""``python -m camkit``: the command line (see :mod:`camkit.cli`)."""

import sys

from camkit.cli import main

sys.exit(main())

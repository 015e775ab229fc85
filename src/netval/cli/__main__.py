"""`python -m netval.cli` runs the command line, as the `netval` console script does."""

import sys

from netval.cli.main import main

sys.exit(main())

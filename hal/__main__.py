"""`python -m hal`: the `hal` command, for environments without the console script on PATH."""

import sys

from hal.cli.main import main

sys.exit(main())

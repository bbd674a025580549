"""`python -m opforge` is the `opforge` command."""

import sys

from .cli import main

sys.exit(main())

"""``python -m kvformats``: the kvformats command line."""

import sys

from kvformats.cli import main

sys.exit(main())

"""``python -m semviz``: see ``semviz.cli``."""

import sys

from semviz.cli import main

sys.exit(main())

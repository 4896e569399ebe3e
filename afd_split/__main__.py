"""``python -m afd_split``: the ``afd-split`` command line."""

import sys

from afd_split.cli import main

sys.exit(main())

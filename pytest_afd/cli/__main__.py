"""``python -m pytest_afd.cli``: the same as the ``pytest-afd`` console script (no install needed)."""

import sys

from pytest_afd.cli import main

sys.exit(main())

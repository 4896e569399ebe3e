"""``python -m pytest_afd COMMAND``: the old name of ``pytest-afd COMMAND``, kept one release.

Run as a module it prints a deprecation line first; ``main`` imported from here is
the new command's, silent (existing callers keep working).
"""

import sys

from pytest_afd.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    from pytest_afd.cli.aliases import module_main

    sys.exit(module_main("python -m pytest_afd"))

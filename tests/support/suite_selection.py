"""Skip collecting ``tests/`` when the ``-m`` expression can only select suite cases.

``pytest -m gate`` (or ``-m stage_d``) selects cases of ``suites/`` alone: no test under
``tests/`` carries a suite marker (tests/test_suite_selection.py scans them). Collecting
``tests/`` anyway imports and assertion-rewrites ~170 modules for nothing, about 10 s
on a 2-core host. The decision is pytest's own mark-expression evaluation over every
truth assignment of the expression's other names, so ``-m "gate or slow"`` or
``-m "not gate"`` still collect everything; anything this cannot read collects everything.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from pytest_afd.core.markers import STAGE_MARKERS

SUITE_MARKERS = frozenset({"gate", *STAGE_MARKERS})
EXPRESSION_KEYWORDS = frozenset({"and", "or", "not"})
MAX_OTHER_NAMES = 10
"""Past this many other names (2**10 evaluations), collect everything."""
_IDENT = re.compile(r"(?:\w|:|\+|-|\.|\[|\]|\\|/)+")  # pytest's mark-expression identifier


def needs_a_suite_marker(markexpr: str) -> bool:
    """True when no item without a suite marker can match ``markexpr``."""
    if not markexpr.strip() or "=" in markexpr:  # keyword arguments: not read here
        return False
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
    except Exception:  # a private API, or an expression pytest itself will reject
        return False
    others = sorted(set(_IDENT.findall(markexpr)) - EXPRESSION_KEYWORDS - SUITE_MARKERS)
    if len(others) > MAX_OTHER_NAMES:
        return False
    for values in itertools.product((False, True), repeat=len(others)):
        present = frozenset(name for name, value in zip(others, values, strict=True) if value)
        if expression.evaluate(present.__contains__):
            return False
    return True


def suite_marker_uses(path: Path) -> list[str]:
    """``file:line marker`` of every ``pytest.mark.<suite marker>`` and
    ``add_marker("<suite marker>")`` in the Python file ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        name = None
        if (isinstance(node, ast.Attribute) and node.attr in SUITE_MARKERS
                and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"):
            name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "add_marker" and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value in SUITE_MARKERS):
            name = node.args[0].value
        if name is not None:
            found.append(f"{path}:{node.lineno} {name}")
    return found

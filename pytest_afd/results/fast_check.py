"""A compiled yes/no on a document's schema before the pure-Python check explains a no.

Why: every result is validated when it is written, and again where a re-stamp or a reader
takes it; with ``jsonschema`` one result costs about 11 ms of CPU (a step record per
forward, an absent-or-value choice per field), so a gate session spent a tenth of its
time validating valid documents. ``jsonschema-rs`` (compiled, Draft 2020-12) answers the
same yes/no in well under a millisecond. Only that answer is taken from it:

* a document it calls valid is valid (``tests/evidence/test_fast_check.py`` holds the two
  validators to the same verdict on every path of real results, each mutated several ways);
* a document it calls invalid goes to ``jsonschema``, whose errors (paths and messages)
  are the ones every error message here has always named.

``jsonschema-rs`` is a dependency, but a platform without its wheel still validates:
:func:`compiled_check` is then ``None`` and every document takes the ``jsonschema`` path.
Formats are annotations in both (neither asserts ``format``), as in the schema's draft.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

COMPILED_VALIDATOR_MODULE = "jsonschema_rs"


@functools.cache
def _compiled_module() -> Any | None:
    try:
        return importlib.import_module(COMPILED_VALIDATOR_MODULE)
    except ImportError:
        return None


def compiled_check(schema: Mapping[str, Any]) -> Callable[[Any], bool] | None:
    """``is_valid`` of the compiled Draft 2020-12 validator of ``schema`` (already inlined:
    no ``$ref`` to resolve), or ``None`` where ``jsonschema-rs`` is not installed."""
    module = _compiled_module()
    if module is None:
        return None
    return module.Draft202012Validator(dict(schema), validate_formats=False).is_valid

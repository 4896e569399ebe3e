"""A schema with its ``$ref`` s replaced by what they point to, once, at load time.

Why: ``jsonschema`` resolves every ``$ref`` again at every use, through ``referencing``.
A result holds a step record per forward and an absent-or-value choice per field, so a
gate session spent about a tenth of its CPU time in that lookup (three validations
per result: written, read back under the lock, re-stamped). The schemas here are not
recursive, so each reference can be replaced by a copy of its target; the instance
paths and messages of every error stay the same (``_describe_error`` reads only those).
A recursive reference is refused by name rather than inlined forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REF = "$ref"
DEFINITIONS = "$defs"
DROPPED_IN_COPIES = ("$id", "$schema", DEFINITIONS)
"""A copied target is not a schema resource of its own: its base URI and definitions
stay with the original (nothing left in the copy refers to them)."""


class RecursiveSchemaError(ValueError):
    """A ``$ref`` chain returns to itself: the schema cannot be inlined."""


def _target(ref: str, root: Mapping[str, Any], documents: Mapping[str, Any]
            ) -> tuple[Any, Mapping[str, Any]]:
    """(the node ``ref`` points to, the document it lives in)."""
    base, _, fragment = ref.partition("#")
    if base and base not in documents:
        raise KeyError(f"$ref {ref!r}: no schema with $id {base!r} was given")
    document = documents[base] if base else root
    node: Any = document
    for part in (p for p in fragment.split("/") if p):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node, document


def inline_refs(node: Any, root: Mapping[str, Any], documents: Mapping[str, Any],
                chain: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``$ref`` replaced by a copy of its (inlined) target.

    ``documents`` maps other schemas' ``$id`` to their text. A ``$ref`` beside other
    keywords becomes ``allOf: [target, rest]``, which is what 2020-12 means by it.
    """
    if isinstance(node, list):
        return [inline_refs(item, root, documents, chain) for item in node]
    if not isinstance(node, Mapping):
        return node
    if REF not in node:
        return {key: (value if key == DEFINITIONS else inline_refs(value, root, documents, chain))
                for key, value in node.items()}
    ref = node[REF]
    if ref in chain:
        raise RecursiveSchemaError(f"$ref {ref!r} refers back to itself via {' -> '.join(chain)}")
    target, document = _target(ref, root, documents)
    copied = inline_refs(target, document, documents, (*chain, ref))
    if isinstance(copied, dict):
        copied = {key: value for key, value in copied.items() if key not in DROPPED_IN_COPIES}
    rest = {key: value for key, value in node.items() if key != REF}
    if not rest:
        return copied
    return {"allOf": [copied, inline_refs(rest, root, documents, chain)]}


def inlined_schema(schema: Mapping[str, Any], documents: Mapping[str, Any]) -> dict[str, Any]:
    """The whole ``schema`` inlined; its own ``$defs`` are dropped (nothing refers to them)."""
    flat = inline_refs(schema, schema, documents)
    flat.pop(DEFINITIONS, None)
    return flat

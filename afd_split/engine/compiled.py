"""Each engine class's field rules compiled once into a specialised split function.

API: ``recompute_expr(source, **names)`` and ``host_copy(field, array)`` (recompute
entries the compiler can inline); ``compiled_split(program, recompute, *,
padded_rows) -> CompiledSplit`` (cached; ``.source`` is the generated code);
``compiled_rejected(program)`` (the fail-closed test of the REJECT_WHEN_SET fields).

The interpreted path (``common.split_fields``, ``replaced``, ``positions_rows``,
``produced_arrays``) looks every field's rule up on every step. Here the same
``FieldProgram`` (the rule table grouped per layout) and recompute table are
turned into Python source once per (engine class, recompute table, row mode),
``exec``'d and cached, the way ``dataclasses`` generates ``__init__``. The rules
stay the single source of truth: a recompute entry made by ``recompute_expr`` is
one expression that both paths run (the interpreted one through a lambda, the
compiled one inlined); any other recompute function is called with a
``StageContext``, as the interpreted path calls it. What the compiled code adds:

* fields that share a row index share the work: every host copy of one ubatch
  array (``_seq_lens_cpu`` / ``seq_lens_cpu`` / ``seq_lens_cpu_upper_bound``) is one
  tensor over that array (the interpreted path makes one per field over the
  same memory), read back once by the check, as the array ``from_numpy`` shares
  (``host_like_read``: no ``.numpy()`` per copy); padded token rows build their
  row-index tensor once per ubatch and device, not once per field;
* the ubatch object is the parent's field dict copied once and overwritten by
  the changed fields (``replaced``'s fast path, decided once per class).

The generated code is tested byte-identical to the interpreted path on random
batches of every pinned layout (tests/adapters/test_adapter_compiled.py).
"""

from __future__ import annotations

import dataclasses
import re

from afd_split.checks.requests import cut_request_arrays
from afd_split.engine import common as adapter_common
from afd_split.engine.common import (
    FieldProgram,
    StageContext,
    plain_field_names,
    produced_from,
)
from afd_split.engine.slicing import PAD_POSITION, host_like, host_like_read, ubatch_token_rows

CONTEXT_NAME = re.compile(r"\bc\.([A-Za-z_]\w*)")
"""``c.<attribute>`` of a recompute expression: a ``StageContext`` attribute."""
CONTEXT_LOCALS = {
    "plan": "plan",
    "ubatch": "ubatch",
    "common": "common",
    "query_start_loc": "u_qsl",
    "seq_lens": "u_seq_lens",
    "num_computed_tokens": "u_computed",
    "already_done": "already_done",
    "left_over": "left_over",
    "num_reqs": "u_num_reqs",
}
"""The generated code's local for each ``StageContext`` attribute."""


def recompute_expr(source: str, **names):
    """A recompute entry written once as an expression over ``c`` (a ``StageContext``).

    The interpreted path calls it as ``lambda c: <source>``; the compiler inlines
    ``source`` with ``c.<attribute>`` bound to its locals. ``names`` are the
    globals the expression uses.
    """
    function = eval(f"lambda c: ({source})", dict(names))
    function.inline_source = source
    function.inline_names = names
    return function


def host_copy(field: str, array: str):
    """Recompute host field ``field`` as the ubatch's ``array`` (a ``StageContext``
    attribute) when the parent set it: a host tensor over that array in ``field``'s dtype.

    The compiler makes one tensor per (array, dtype) for all such fields of a ubatch.
    """

    def recompute(context):
        like = getattr(context.common, field)
        return None if like is None else host_like(getattr(context, array), like)

    recompute.host_copy_of = (field, array)
    return recompute


def _same_kind(made, like) -> bool:
    """``made`` (a host copy) can stand for ``host_like(array, like)``: same type and dtype."""
    return type(made) is type(like) and made.dtype == like.dtype


class _Source:
    """Generated source lines with their indentation and the names they use."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.namespace: dict = {}

    def add(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def bind(self, name: str, value) -> str:
        if name in self.namespace and self.namespace[name] is not value:
            raise ValueError(f"generated name {name!r} bound to two values")
        self.namespace[name] = value
        return name


COMMON_FIELD = re.compile(r"\bc\.common\.([A-Za-z_]\w*)")
"""``c.common.<field>`` of a recompute expression: a parent field, read once per step."""


def _inline(expression: str, hoisted: set) -> str:
    """``expression`` over the generated locals; parent fields it reads go to ``hoisted``."""

    def parent_field(match) -> str:
        hoisted.add(match.group(1))
        return f"k_{match.group(1)}"

    expression = COMMON_FIELD.sub(parent_field, expression)
    return CONTEXT_NAME.sub(lambda match: CONTEXT_LOCALS[match.group(1)], expression)


def _token_rows(
    source: _Source, depth: int, target: str, tensor: str, pad_value: int, padded: bool
) -> None:
    """``target = <tensor's ubatch rows>`` (``ubatch_token_rows``, inlined when unpadded)."""
    view = f"({tensor}[token_slice] if {tensor}.ndim == 1 else {tensor}[..., token_slice])"
    if not padded:
        source.add(depth, f"{target} = {view}")
        return
    source.add(
        depth,
        f"{target} = {view} if not num_padded else ubatch_token_rows({tensor}, "
        f"ubatch, with_padding=True, pad_value={pad_value}, index_cache=index_cache)",
    )


def _recompute_lines(source: _Source, name: str, function, groups: dict, hoisted: set) -> None:
    target = f"v_{name}"
    if getattr(function, "inline_source", None) is not None:
        for key, value in function.inline_names.items():
            source.bind(key, value)
        source.add(2, f"{target} = {_inline(function.inline_source, hoisted)}")
        return
    if getattr(function, "host_copy_of", None) is not None:
        field, array = function.host_copy_of
        first = array not in groups
        made = groups.setdefault(array, f"h_{array}")
        array_local = CONTEXT_LOCALS[array]
        hoisted.add(field)
        like = f"k_{field}"
        source.add(2, f"if {like} is None:")
        source.add(3, f"{target} = None")
        if first:  # the group's first copy of this ubatch: nothing to share yet
            source.add(2, "else:")
            source.add(3, f"{made}, p_{array} = host_like_read({array_local}, {like})")
            source.add(3, f"{target} = {made}")
            return
        source.add(2, f"elif {made} is not None and same_kind({made}, {like}):")
        source.add(3, f"{target} = {made}")
        source.add(2, "else:")
        source.add(3, f"{made}, p_{array} = host_like_read({array_local}, {like})")
        source.add(3, f"{target} = {made}")
        return
    source.add(2, f"{target} = {source.bind(f'r_{name}', function)}(context)")


def _generate(program: FieldProgram, recompute, padded_rows: bool, cls) -> _Source:
    source = _Source()
    for name, value in {
        "cut_request_arrays": cut_request_arrays,
        "StageContext": StageContext,
        "produced_from": produced_from,
        "host_like": host_like,
        "host_like_read": host_like_read,
        "same_kind": _same_kind,
        "ubatch_token_rows": ubatch_token_rows,
        "adapter_common": adapter_common,
        "program": program,
        "cls": cls,
        "new": object.__new__,
        "replace": dataclasses.replace,
    }.items():
        source.bind(name, value)
    plain = plain_field_names(cls) if cls is not None else None
    calls_context = any(
        getattr(recompute[name], "inline_source", None) is None
        and getattr(recompute[name], "host_copy_of", None) is None
        for name in program.recompute
    )
    source.add(0, "def split(plan, common, positions, parent):")
    source.add(1, "results = []")
    source.add(1, "produced = []")
    if plain is not None:
        source.add(1, "fields = common.__dict__")
        source.add(1, f"if len(fields) != {len(plain)}:")
        source.add(2, f"fields = {{name: fields[name] for name in {plain!r}}}")
    for name in (*program.request_rows, *(n for n, _ in program.token_rows), *program.fresh_buffer):
        source.add(1, f"f_{name} = common.{name}")
    source.add(
        1,
        "for ubatch, arrays in zip(plan.ubatches, cut_request_arrays(plan, *parent), strict=True):",
    )
    source.add(2, "u_qsl, u_seq_lens, u_computed, already_done, left_over = arrays")
    source.add(2, "u_num_reqs = u_seq_lens.shape[0]")
    source.add(2, "request_slice = ubatch.request_slice")
    source.add(2, "token_slice = ubatch.token_slice")
    if padded_rows:
        source.add(2, "num_padded = ubatch.num_padded_tokens")
        source.add(2, "index_cache = {}")
    if calls_context:
        source.add(2, "context = StageContext(plan, ubatch, common, arrays)")
    groups: dict = {}
    hoisted: set = set()
    for array in ("query_start_loc", "seq_lens", "num_computed_tokens"):
        source.add(2, f"h_{array} = p_{array} = None")
    for name in program.recompute:
        _recompute_lines(source, name, recompute[name], groups, hoisted)
    # The parent fields the recompute expressions read, once per step (before the loop).
    loop = next(index for index, line in enumerate(source.lines) if line.startswith("    for "))
    source.lines[loop:loop] = [f"    k_{field} = common.{field}" for field in sorted(hoisted)]
    for name in program.request_rows:
        source.add(2, f"v_{name} = None if f_{name} is None else f_{name}[request_slice]")
    for name, pad_value in program.token_rows:
        source.add(2, f"if f_{name} is None:")
        source.add(3, f"v_{name} = None")
        source.add(2, "else:")
        _token_rows(source, 3, f"v_{name}", f"f_{name}", pad_value, padded_rows)
    if program.fresh_buffer:
        rows = "ubatch.num_rows" if padded_rows else "ubatch.num_real_tokens"
        for name in program.fresh_buffer:
            # Looked up per call (a cold path): the rule's one implementation in common.
            source.add(2, f"v_{name} = None if f_{name} is None else "
                          f"adapter_common.fresh_stage_buffer(f_{name}, {rows})")
    changed = (
        *program.recompute,
        *program.request_rows,
        *(n for n, _ in program.token_rows),
        *program.clear,
        *program.fresh_buffer,
    )
    if plain is not None:
        # The new object's fields in one literal: changed ones from here, the rest the parent's.
        entries = ", ".join(
            f"{name!r}: None"
            if name in program.clear
            else f"{name!r}: v_{name}"
            if name in changed
            else f"{name!r}: fields[{name!r}]"
            for name in plain
        )
        source.add(2, "sub = new(cls)")
        source.add(2, f"sub.__dict__.update({{{entries}}})")
    else:
        # Only the fields the interpreted path sets (a None request/token field stays the
        # parent's None there too), through the class's own constructor.
        entries = ", ".join(
            f"{name!r}: None" if name in program.clear else f"{name!r}: v_{name}"
            for name in changed
        )
        source.add(2, f"sub = replace(common, **{{{entries}}})")
    token_positions = "positions" in dict(program.token_rows)
    if token_positions:
        source.add(2, "if f_positions is not None and positions is f_positions:")
        source.add(3, "rows = v_positions")
        source.add(2, "else:")
        _token_rows(source, 3, "rows", "positions", PAD_POSITION, padded_rows)
    else:
        _token_rows(source, 2, "rows", "positions", PAD_POSITION, padded_rows)
    source.add(2, "results.append((sub, rows))")
    seq_copies = "".join(f"v_{name}, " for name in program.seq_lens_sources)
    computed_copies = "".join(f"v_{name}, " for name in program.computed_sources)
    source.add(
        2,
        f"produced.append(produced_from(v_query_start_loc_cpu, ({seq_copies}), "
        f"({computed_copies}), program, (h_query_start_loc, h_seq_lens, h_num_computed_tokens), "
        "(p_query_start_loc, p_seq_lens, p_num_computed_tokens)))",
    )
    source.add(1, "return results, produced")
    return source


@dataclasses.dataclass(frozen=True)
class CompiledSplit:
    """A generated split function and its source (kept for inspection and debugging).

    Called as ``(plan, common, positions, parent) -> (results, produced)``: per ubatch
    ``(metadata, positions rows)`` and the host ``(qsl, seq_lens, computed)`` read
    back from what was produced, exactly what the interpreted path returns.
    """

    source: str
    function: object

    def __call__(self, plan, common, positions, parent):
        return self.function(plan, common, positions, parent)


def compiled_split(
    program: FieldProgram, recompute, *, padded_rows: bool, cls: type | None = None
) -> CompiledSplit:
    """The split function of ``program`` (engine class ``cls``) with the ``recompute``
    table; the adapters cache it once per class and mode."""
    generated = _generate(program, recompute, padded_rows, cls)
    text = "\n".join(generated.lines) + "\n"
    namespace = dict(generated.namespace)
    exec(compile(text, f"<afd_split compiled split {program.layout.name}>", "exec"), namespace)
    return CompiledSplit(source=text, function=namespace["split"])


def _rejected_source(program: FieldProgram) -> _Source:
    source = _Source()
    tests = []
    for index, (name, default) in enumerate(program.reject_when_set):
        if default is None or default is dataclasses.MISSING:
            tests.append(f"common.{name} is not None")
        else:
            constant = source.bind(f"d_{index}", default)
            tests.append(f"((value := common.{name}) is not {constant} and value != {constant})")
    source.add(0, "def rejected(common):")
    source.add(1, f"return bool({' or '.join(tests) or 'False'})")
    return source


def compiled_rejected(program: FieldProgram):
    """``rejected(common) -> bool``: is any REJECT_WHEN_SET field set (differs from its
    dataclass default)? The same test as ``field_is_set``, one expression per class."""
    generated = _rejected_source(program)
    text = "\n".join(generated.lines) + "\n"
    namespace = dict(generated.namespace)
    exec(compile(text, f"<afd_split compiled rejects {program.layout.name}>", "exec"), namespace)
    function = namespace["rejected"]
    function.source = text
    return function


__all__ = [
    "CompiledSplit",
    "compiled_rejected",
    "compiled_split",
    "host_copy",
    "recompute_expr",
]

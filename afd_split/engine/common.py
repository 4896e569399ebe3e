"""The rule-driven split of an engine metadata dataclass, shared by the vLLM and Ascend adapters.

API: ``HostSources``; ``FieldProgram`` / ``compile_fields(layout, rules, sources, cls)``
(the layout's fields grouped by rule, once per engine class);
``parent_arrays_of(plan, common, program)`` (the parent's host request arrays);
``reject_unsupported_fields(common, program)``; ``split_fields(plan, common,
program, recompute, parent, padded_rows)``; ``produced_arrays(values, program)``;
``replaced(common, values)``; ``positions_rows(positions, common, values, ubatch,
with_padding)``; ``checked_results(plan, common, positions, block_size, program,
parent, per_ubatch, results, check)``; ``StageContext``.

Every field of the layout is handled by its ``FieldRule``; a RECOMPUTE field
takes its value from the adapter's ``recompute`` table, a function of the
``StageContext`` (plan, ubatch, parent object, the ubatch's host request arrays
in the engine's dtype). A field without a rule, or a RECOMPUTE field without a
function, fails closed. The check reads what was produced: the host copies in
the ubatches' new field values.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from afd_split.checks.diagnosis import COMPUTED_TOKENS, SEQ_LENS
from afd_split.checks.requests import cut_request_arrays
from afd_split.engine.layout import MATCH_CACHE_SIZE, FieldRule, PinnedLayout
from afd_split.engine.slicing import (
    CHECK_FULL,
    PAD_POSITION,
    check_engine_counts,
    check_split,
    host_numpy,
    parent_host_arrays,
    ubatch_token_rows,
)
from afd_split.errors import SplitInvariantError, UnsupportedSplitError
from afd_split.plan.planner import SplitPlan


@dataclass(frozen=True)
class HostSources:
    """Which host fields hold seq_lens and computed tokens, in order of preference."""

    seq_lens: tuple[str, ...]
    computed: tuple[str, ...]
    token_pad_values: tuple[tuple[str, int], ...]
    """Token-indexed fields and the value of their padding rows."""

    def pad_value(self, name: str) -> int:
        """Padding-row value of token-indexed field ``name``."""
        return dict(self.token_pad_values)[name]


@dataclass(frozen=True)
class FieldProgram:
    """A layout's fields grouped by rule, computed once per layout (not once per step).

    Host sources are narrowed to the layout's own fields, in order of preference.
    """

    layout: PinnedLayout
    recompute: tuple[str, ...]
    request_rows: tuple[str, ...]
    token_rows: tuple[tuple[str, int], ...]
    """(name, pad value) of every token-indexed field."""
    clear: tuple[str, ...]
    fresh_buffer: tuple[str, ...]
    reject_when_set: tuple[tuple[str, object], ...]
    """(name, dataclass default) of every field rejected when set."""
    seq_lens_sources: tuple[str, ...]
    computed_sources: tuple[str, ...]

    @functools.cached_property
    def rejected(self):
        """``rejected(common) -> bool``: is any REJECT_WHEN_SET field set? Generated once
        per program (``afd_split.engine.compiled``)."""
        from afd_split.engine.compiled import compiled_rejected  # it imports this module

        return compiled_rejected(self)


def compile_fields(layout: PinnedLayout, rules, sources: HostSources, cls=None) -> FieldProgram:
    """Group ``layout``'s fields by rule; fails closed on a field without one.

    ``cls`` supplies the dataclass defaults of rejected fields (the class of this
    layout); without it they come from the layout's pinned ``defaults``.
    """
    missing = [name for name in layout.fields if name not in rules]
    if missing:
        raise UnsupportedSplitError(f"{layout.describe()}: no split rule for fields {missing}")

    def named(rule):
        return tuple(name for name in layout.fields if rules[name] is rule)

    if cls is None:
        defaults = dict(layout.extra.get("defaults", {}))
    else:
        defaults = {name: field.default for name, field in cls.__dataclass_fields__.items()}
    return FieldProgram(
        layout=layout,
        recompute=named(FieldRule.RECOMPUTE),
        request_rows=named(FieldRule.REQUEST_ROWS),
        token_rows=tuple((name, sources.pad_value(name)) for name in named(FieldRule.TOKEN_ROWS)),
        clear=named(FieldRule.CLEAR),
        fresh_buffer=named(FieldRule.FRESH_BUFFER),
        reject_when_set=tuple(
            (name, defaults.get(name)) for name in named(FieldRule.REJECT_WHEN_SET)
        ),
        seq_lens_sources=tuple(n for n in sources.seq_lens if n in layout.field_set),
        computed_sources=tuple(n for n in sources.computed if n in layout.field_set),
    )


class StageContext:
    """What a recompute function sees for one ubatch: the plan, the ubatch, the parent
    object and the ubatch's host request arrays (engine dtype, ``cut_request_arrays``)."""

    __slots__ = (
        "already_done",
        "common",
        "left_over",
        "num_computed_tokens",
        "plan",
        "query_start_loc",
        "seq_lens",
        "ubatch",
    )

    def __init__(self, plan, ubatch, common, arrays) -> None:
        self.plan, self.ubatch, self.common = plan, ubatch, common
        (
            self.query_start_loc,
            self.seq_lens,
            self.num_computed_tokens,
            self.already_done,
            self.left_over,
        ) = arrays

    @property
    def num_reqs(self) -> int:
        """Requests of the ubatch (a cut request counts on both sides)."""
        return self.seq_lens.shape[0]


def _is_set(value, default) -> bool:
    if default is None or default is dataclasses.MISSING:
        return value is not None
    return value != default


def field_is_set(common, name: str) -> bool:
    """True when ``common.<name>`` differs from its dataclass default (None, -1, 1, 0, ...)."""
    return _is_set(getattr(common, name), type(common).__dataclass_fields__[name].default)


def reject_unsupported_fields(common, program: FieldProgram) -> None:
    """Fail closed, naming every set field whose rule is REJECT_WHEN_SET."""
    if not program.rejected(common):  # the common case: nothing set, one generated test
        return
    bad = [
        name for name, default in program.reject_when_set if _is_set(getattr(common, name), default)
    ]
    if bad:
        raise UnsupportedSplitError(
            f"{program.layout.describe()}: fields {bad} are set, and a two-ubatch prefill split "
            "cannot honour them (each would be copied whole into both ubatches)"
        )


def _first_set(common, names: tuple[str, ...]) -> str | None:
    for name in names:
        if getattr(common, name) is not None:
            return name
    return None


def parent_arrays_of(plan: SplitPlan, common, program: FieldProgram) -> tuple:
    """The parent's real-request host arrays ``(qsl, seq_lens, computed)``; never a device read."""
    layout = program.layout
    seq_name = _first_set(common, program.seq_lens_sources)
    if seq_name is None:
        raise UnsupportedSplitError(
            f"{layout.describe()}: none of {list(program.seq_lens_sources)} is set; host "
            "seq_lens would need a device-to-host copy of seq_lens"
        )
    computed_name = _first_set(common, program.computed_sources)

    def source() -> str:
        return f"{layout.describe()} ({seq_name})"

    check_engine_counts(plan, common.num_reqs, common.num_actual_tokens, source=source)
    return parent_host_arrays(
        plan,
        common.query_start_loc_cpu,
        getattr(common, seq_name),
        None if computed_name is None else getattr(common, computed_name),
        source=source,
    )


def agreeing_copies(copies: tuple, names: tuple[str, ...], invariant: str, made=None, read=None):
    """The first set of one ubatch's host copies ``copies`` (of fields ``names``); every
    other set copy must hold the same entries (fails naming it), so no copy goes unchecked.

    ``made`` / ``read``: a copy the caller made and the numpy view of its memory
    (``host_like_read``), used for that copy instead of reading it back again.
    """
    first = array = first_value = None
    for name, value in zip(names, copies, strict=True):
        if value is None or value is first_value:  # one tensor for two fields: read once
            continue
        values = read if value is made and read is not None else host_numpy(value)
        if array is None:
            first, array, first_value = name, values, value
        elif values.tobytes() != array.tobytes():
            raise SplitInvariantError(
                f"{invariant}: the ubatch's {name} {values.tolist()[:8]} differs "
                f"from its {first} {array.tolist()[:8]}"
            )
    return array


def produced_from(
    query_start_loc_cpu, seq_lens_copies, computed_copies, program, made=(None,) * 3, reads=(None,) * 3
) -> tuple:
    """A produced ubatch's request-level host arrays from its host fields' new values
    (the copies in ``program``'s source order; ``SplitInvariantError`` when two disagree).

    ``made`` / ``reads``: per array (qsl, seq_lens, computed) a host copy the caller
    made and the view of its memory (``host_like_read``), or None.
    """
    if query_start_loc_cpu is made[0] and reads[0] is not None:
        qsl = reads[0]
    else:
        qsl = host_numpy(query_start_loc_cpu)
    seq_lens = agreeing_copies(seq_lens_copies, program.seq_lens_sources, SEQ_LENS, made[1], reads[1])
    computed = agreeing_copies(
        computed_copies, program.computed_sources, COMPUTED_TOKENS, made[2], reads[2]
    )
    if computed is None:
        computed = seq_lens - (qsl[1:] - qsl[:-1])
    return qsl, seq_lens, computed


def produced_arrays(values: dict, program: FieldProgram) -> tuple:
    """A produced ubatch's request-level host arrays, read back from its new field values
    (``SplitInvariantError`` when two host copies of one field disagree)."""
    return produced_from(
        values["query_start_loc_cpu"],
        tuple(values[name] for name in program.seq_lens_sources),
        tuple(values[name] for name in program.computed_sources),
        program,
    )


def positions_rows(positions, common, values: dict, ubatch, *, with_padding: bool):
    """The ubatch's positions: the sliced ``positions`` field when the runner passed that one,
    else its token rows of ``positions`` (with its padding rows when ``with_padding``)."""
    if "positions" in values and positions is common.positions:
        return values["positions"]
    return ubatch_token_rows(positions, ubatch, with_padding=with_padding, pad_value=PAD_POSITION)


def checked_results(
    plan: SplitPlan,
    common,
    positions,
    block_size: int,
    program,
    parent,
    per_ubatch,
    results,
    check: str,
) -> list:
    """``results`` (per-ubatch ``(metadata, positions)``) once the adapter's check passed.

    The request-level check reads what was produced: each ubatch's host
    query_start_loc / seq_lens / computed fields, from its new field values
    (``per_ubatch``, the dicts the ubatch objects were built from).
    ``check`` is ``"requests"`` or ``"full"`` (also the token-level
    ``validate_split``: debugging only).
    """
    produced = [produced_arrays(values, program) for values in per_ubatch]
    return checked_produced(plan, common, positions, block_size, parent, produced, results, check)


def checked_produced(
    plan: SplitPlan, common, positions, block_size: int, parent, produced, results, check: str
) -> list:
    """``checked_results`` once the produced host arrays are read back (the compiled path
    reads them back itself)."""
    check_split(plan, parent, produced, check)
    if check == CHECK_FULL:
        from afd_split.engine.debug import validate_token_level  # lazy: debug path only

        validate_token_level(plan, common, positions, block_size, parent, results)
    return results


def split_fields(
    plan: SplitPlan, common, program: FieldProgram, recompute, parent, *, padded_rows: bool
) -> list[dict]:
    """Per ubatch, the new value of every field that is not shared with the parent.

    ``parent`` is the parent's host arrays (``parent_arrays_of``). ``padded_rows=True``
    lays token-indexed fields out over the ubatch's ``num_rows`` rows (real
    tokens plus padding with the field's pad value); otherwise they hold the
    real tokens only.
    """
    per_ubatch = []
    recompute_items = tuple((name, recompute[name]) for name in program.recompute)
    for ubatch, arrays in zip(plan.ubatches, cut_request_arrays(plan, *parent), strict=True):
        context = StageContext(plan, ubatch, common, arrays)
        values = {name: function(context) for name, function in recompute_items}
        request_slice = ubatch.request_slice
        for name in program.request_rows:
            value = getattr(common, name)
            if value is not None:
                values[name] = value[request_slice]
        for name, pad_value in program.token_rows:
            value = getattr(common, name)
            if value is not None:
                values[name] = ubatch_token_rows(
                    value, ubatch, with_padding=padded_rows, pad_value=pad_value
                )
        for name in program.clear:
            values[name] = None
        if program.fresh_buffer:
            rows = ubatch.num_rows if padded_rows else ubatch.num_real_tokens
            for name in program.fresh_buffer:
                value = getattr(common, name)
                if value is not None:
                    values[name] = fresh_stage_buffer(value, rows)
        per_ubatch.append(values)
    return per_ubatch


def fresh_stage_buffer(parent_view, rows: int):
    """A FRESH_BUFFER field's own buffer for one stage: ``rows`` entries (the stage's
    slot_mapping length) in the parent's dtype and device, one device allocation, no copy.

    It stands for a runner buffer of ``max_num_batched_tokens`` entries (the pinned
    layout's ``runner_buffers``) that a kernel fills with at most one entry per
    slot_mapping row, unchecked; the parent's field is a shorter view of it
    (``[:num_reqs_padded]``), so ``empty_like`` of that view could be overrun.
    """
    return parent_view.new_empty((rows,))


def check_recompute_table(layouts, rules, recompute) -> None:
    """Every RECOMPUTE field of every layout has a function (fails closed at import)."""
    for layout in layouts:
        missing = [
            name
            for name in layout.fields
            if rules.get(name) is FieldRule.RECOMPUTE and name not in recompute
        ]
        unruled = [name for name in layout.fields if name not in rules]
        if missing or unruled:
            raise UnsupportedSplitError(
                f"{layout.describe()}: no recompute function for {missing}, no rule for {unruled}"
            )


GENERATED_CODE_FILE = "<string>"
"""``co_filename`` of the methods ``dataclasses`` generates (it ``exec``s their source)."""


def _generated(function) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and code.co_filename == GENERATED_CODE_FILE


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def plain_field_names(cls: type) -> tuple[str, ...] | None:
    """``cls``'s field names when building it by ``__dict__`` equals ``dataclasses.replace``.

    That holds when ``__init__`` is the generated one (it only assigns each
    field), there is no ``__post_init__``, every field is an init field, the
    instances have a ``__dict__`` (no slots) and ``__setattr__`` is object's or
    the generated frozen one. Else None: ``replaced`` falls back to ``replace``.
    """
    fields = dataclasses.fields(cls)
    plain = (
        _generated(cls.__init__)
        and not hasattr(cls, "__post_init__")
        and all(field.init for field in fields)
        and "__slots__" not in cls.__dict__
        and (cls.__setattr__ is object.__setattr__ or _generated(cls.__setattr__))
    )
    return tuple(field.name for field in fields) if plain else None


def replaced(common, values: dict):
    """``dataclasses.replace(common, **values)``, without the generic keyword path when safe.

    Only the fields are copied (never other instance attributes, e.g. cached
    properties of the parent), then ``values`` override them.
    """
    names = plain_field_names(type(common))
    if names is None:
        return dataclasses.replace(common, **values)
    parent = common.__dict__
    sub = object.__new__(type(common))
    if len(parent) == len(names):  # the fields only (every field is set by __init__): one copy
        state = parent.copy()
    else:
        state = {name: parent[name] for name in names}
    state.update(values)
    sub.__dict__.update(state)
    return sub

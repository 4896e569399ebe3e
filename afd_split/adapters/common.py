"""The rule-driven split of an engine metadata dataclass, shared by the vLLM and Ascend adapters.

API: ``HostSources``; ``request_fields_of(plan, common, layout, sources)``;
``reject_unsupported_fields(common, layout, rules)``; ``split_fields(plan, common,
layout, rules, recompute, sources, padded_rows)``; ``produced_request_fields(sub,
layout, sources)``; ``UBatchContext``.

Every field of the layout is handled by its ``FieldRule``; a RECOMPUTE field
takes its value from the adapter's ``recompute`` table, a function of the
``UBatchContext`` (plan, ubatch, its request fields, the parent). A field
without a rule, or a RECOMPUTE field without a function, fails closed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from afd_split.adapters.layout import FieldRule, PinnedLayout
from afd_split.adapters.slicing import (
    check_engine_counts,
    parent_request_fields,
    ubatch_request_rows,
    ubatch_token_rows,
)
from afd_split.errors import UnsupportedSplitError
from afd_split.plan import SplitPlan, UBatch
from afd_split.requests import RequestFields


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
class UBatchContext:
    """What a recompute function sees for one ubatch."""

    plan: SplitPlan
    ubatch: UBatch
    part: RequestFields
    parent: RequestFields
    common: object

    @property
    def left_over(self) -> int:
        """Tokens of the ubatch's last request that belong to the next ubatch."""
        stop = self.ubatch.request_slice.stop
        return self.parent.query_start_loc.item(stop) - self.ubatch.token_slice.stop

    @property
    def query_lens(self):
        """Per-request tokens of this ubatch (host, int64)."""
        qsl = self.part.query_start_loc
        return qsl[1:] - qsl[:-1]


def field_is_set(common, name: str) -> bool:
    """True when ``common.<name>`` differs from its dataclass default (None, -1, 1, 0, ...)."""
    default = type(common).__dataclass_fields__[name].default
    value = getattr(common, name)
    if default is None or default is dataclasses.MISSING:
        return value is not None
    return value != default


def reject_unsupported_fields(common, layout: PinnedLayout, rules) -> None:
    """Fail closed, naming every set field whose rule is REJECT_WHEN_SET."""
    missing = [name for name in layout.fields if name not in rules]
    if missing:
        raise UnsupportedSplitError(f"{layout.describe()}: no split rule for fields {missing}")
    bad = [
        name
        for name in layout.fields
        if rules[name] is FieldRule.REJECT_WHEN_SET and field_is_set(common, name)
    ]
    if bad:
        raise UnsupportedSplitError(
            f"{layout.describe()}: fields {bad} are set, and a two-ubatch prefill split "
            "cannot honour them (each would be copied whole into both ubatches)"
        )


def _first_set(common, layout: PinnedLayout, names: tuple[str, ...]) -> str | None:
    return next(
        (name for name in names if name in layout.field_set and getattr(common, name) is not None),
        None,
    )


def request_fields_of(
    plan: SplitPlan, common, layout: PinnedLayout, sources: HostSources
) -> RequestFields:
    """The parent's real requests from its host fields; never a device read."""
    seq_name = _first_set(common, layout, sources.seq_lens)
    if seq_name is None:
        raise UnsupportedSplitError(
            f"{layout.describe()}: none of "
            f"{[n for n in sources.seq_lens if n in layout.field_set]} is set; host seq_lens "
            "would need a device-to-host copy of seq_lens"
        )
    computed_name = _first_set(common, layout, sources.computed)
    source = f"{layout.describe()} ({seq_name})"
    parent = parent_request_fields(
        plan,
        common.query_start_loc_cpu,
        getattr(common, seq_name),
        None if computed_name is None else getattr(common, computed_name),
        source=source,
    )
    check_engine_counts(plan, common.num_reqs, common.num_actual_tokens, source=source)
    return parent


def produced_request_fields(sub, layout: PinnedLayout, sources: HostSources) -> RequestFields:
    """The request-level fields read back from a produced ubatch (host fields only)."""
    seq_lens = getattr(sub, _first_set(sub, layout, sources.seq_lens)).numpy()
    qsl = sub.query_start_loc_cpu.numpy()
    computed_name = _first_set(sub, layout, sources.computed)
    if computed_name is None:
        computed = seq_lens - (qsl[1:] - qsl[:-1])
    else:
        computed = getattr(sub, computed_name).numpy()
    return RequestFields(qsl, seq_lens, computed)


def split_fields(
    plan: SplitPlan,
    common,
    layout: PinnedLayout,
    rules,
    recompute,
    parent: RequestFields,
    parts: list[RequestFields],
    *,
    sources: HostSources,
    padded_rows: bool,
) -> list[dict]:
    """Per ubatch, the new value of every field that is not shared with the parent.

    ``padded_rows=True`` lays token-indexed fields out over the ubatch's
    ``num_rows`` rows (real tokens plus padding with the field's pad value);
    otherwise they hold the real tokens only.
    """
    import torch  # lazy: adapters only

    per_ubatch = []
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        context = UBatchContext(plan, ubatch, part, parent, common)
        values = {}
        for name in layout.fields:
            rule = rules[name]
            value = getattr(common, name)
            if rule is FieldRule.RECOMPUTE:
                values[name] = recompute[name](context)
            elif rule in (FieldRule.KEEP, FieldRule.REJECT_WHEN_SET) or value is None:
                continue
            elif rule is FieldRule.REQUEST_ROWS:
                values[name] = ubatch_request_rows(value, ubatch)
            elif rule is FieldRule.TOKEN_ROWS:
                values[name] = ubatch_token_rows(
                    value, ubatch, with_padding=padded_rows, pad_value=sources.pad_value(name)
                )
            elif rule is FieldRule.CLEAR:
                values[name] = None
            elif rule is FieldRule.FRESH_BUFFER:
                values[name] = torch.empty_like(value)
        per_ubatch.append(values)
    return per_ubatch


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

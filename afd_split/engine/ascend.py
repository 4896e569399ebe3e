"""vLLM-Ascend ``AscendCommonAttentionMetadata`` split per ubatch (tags v0.19.1rc1, v0.26.0rc).

API (stable; the AFD-plugin hook calls these):

* ``split_ascend_common_metadata(plan, common, positions, block_size, *,
  chunked_prefill, pcp_stage_builder=None, check="requests")
  -> list[(AscendCommonAttentionMetadata, positions)]``.
* ``check_ascend_pcp_startup(*, pcp_size, pcp_stage_builder)``: the start-up
  check, for the hook to run before it creates any communication resource.
* ``check_ascend_split_support(common, plan, *, pcp_stage_builder=None)``: the
  per-step fail-closed checks alone, with nothing built.
* ``PcpStage`` (what a PCP builder receives) and ``PCP_BUILDER_FIELDS``.
* ``ASCEND_LAYOUTS``, ``ASCEND_FIELD_RULES``, ``ASCEND_HOST_SOURCES``.

Field lists are pinned from the upstream source (``pinned/vllm-ascend-*.json``,
tag and commit inside). Each ubatch is stage-local: ``num_input_tokens`` is its
rows (real plus padding), slot_mapping / positions / positions_cpu hold those
rows (padding rows hold PAD_SLOT_ID / 0), ``actual_seq_lengths_q`` and the host
seq_lens / computed copies are its own, ``num_reqs`` and ``num_actual_tokens``
count its real requests and tokens (vLLM-Ascend pads ``num_reqs``), and
``attn_state`` is recomputed: a tail that starts inside a request has cached
context, so it is never ``PrefillNoCache``. PCP metadata is regenerated per
stage by the engine's own helper, passed in as ``pcp_stage_builder``; without
one, a batch carrying PCP metadata is rejected before anything is built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from afd_split.engine.common import (
    FieldProgram,
    HostSources,
    check_recompute_table,
    checked_produced,
    checked_results,
    compile_fields,
    field_is_set,
    parent_arrays_of,
    positions_rows,
    produced_arrays,
    reject_unsupported_fields,
    replaced,
    split_fields,
)
from afd_split.engine.compiled import CompiledSplit, compiled_split
from afd_split.engine.layout import (
    MATCH_CACHE_SIZE,
    FieldRule,
    PinnedLayout,
    load_layout,
    match_layout,
)
from afd_split.engine.slicing import (
    CHECK_REQUESTS,
    PAD_POSITION,
    PAD_SLOT_ID,
    host_numpy,
)
from afd_split.engine.vllm import VLLM_FIELD_RULES, VLLM_RECOMPUTE, host_request_field
from afd_split.errors import UnsupportedSplitError
from afd_split.plan.planner import SplitPlan

ASCEND_TAGS = ("v0.19.1rc1", "v0.26.0rc")
ASCEND_LAYOUTS = tuple(load_layout(f"vllm-ascend-{tag}") for tag in ASCEND_TAGS)

PCP_METADATA_FIELDS = ("prefill_context_parallel_metadata", "context_parallel_metadata")
"""Context-parallel metadata of the batch: v0.19.1rc1's PCP object, v0.26.0rc's CP object."""
PCP_BUILDER_FIELDS = frozenset({*PCP_METADATA_FIELDS, "slot_mapping", "block_table_tensor"})
"""What a PCP stage builder may return: the fields the plugin's stage-local PCP path rebuilds."""

PREFILL_STATES = ("PrefillNoCache", "PrefillCacheHit", "ChunkedPrefill")
"""AscendAttentionState members of a prefill batch (values pinned with the layouts)."""

ASCEND_FIELD_RULES = MappingProxyType(
    {
        **VLLM_FIELD_RULES,
        "seq_lens_cpu": FieldRule.RECOMPUTE,
        "num_computed_tokens_cpu": FieldRule.RECOMPUTE,
        "actual_seq_lengths_q": FieldRule.RECOMPUTE,
        "attn_state": FieldRule.RECOMPUTE,
        "num_input_tokens": FieldRule.RECOMPUTE,
        "prefill_context_parallel_metadata": FieldRule.RECOMPUTE,  # via pcp_stage_builder
        "context_parallel_metadata": FieldRule.RECOMPUTE,  # via pcp_stage_builder
        "positions_cpu": FieldRule.TOKEN_ROWS,  # host buffer of the compressed-DSA path
        # Written by store_kv_block_metadata from the ubatch's slot_mapping (sfa_v1.py at
        # v0.26.0rc): each stage needs its own buffer or the second build overwrites the first.
        "group_len": FieldRule.FRESH_BUFFER,
        "group_key_idx": FieldRule.FRESH_BUFFER,
        "group_key_cache_idx": FieldRule.FRESH_BUFFER,
        "decode_token_per_req": FieldRule.REJECT_WHEN_SET,  # != 1: speculative decoding
        "graph_pad_size": FieldRule.REJECT_WHEN_SET,  # != -1: graph mode
        "kvcomp_metadata": FieldRule.REJECT_WHEN_SET,  # KV compression
        "parallel_draft_seq_lens_cpu": FieldRule.REJECT_WHEN_SET,  # parallel drafting
        "parallel_draft_num_reject_cpu": FieldRule.REJECT_WHEN_SET,
        "parallel_draft_num_reject_event": FieldRule.REJECT_WHEN_SET,
        "parallel_draft_num_reject_num_reqs": FieldRule.REJECT_WHEN_SET,
        "req_ids_tensor": FieldRule.REJECT_WHEN_SET,  # sparse KV offload (decode path)
        "token_to_req": FieldRule.REJECT_WHEN_SET,
    }
)

ASCEND_HOST_SOURCES = HostSources(
    seq_lens=("_seq_lens_cpu", "seq_lens_cpu", "seq_lens_cpu_upper_bound"),
    computed=("_num_computed_tokens_cpu", "num_computed_tokens_cpu"),
    token_pad_values=(
        ("slot_mapping", PAD_SLOT_ID),
        ("positions", PAD_POSITION),
        ("positions_cpu", PAD_POSITION),
    ),
)
"""The model runner always sets ``_seq_lens_cpu`` (``seq_lens_cpu`` is None under async
speculative decoding)."""


@dataclass(frozen=True)
class PcpStage:
    """One stage as the engine's PCP helper must see it (host values, stage-local).

    ``num_computed_tokens`` of a tail that starts inside a request is already
    advanced by the head's tokens: the helper must read prefill context
    lengths from here, not from the whole batch's input batch.
    """

    index: int
    request_slice: slice
    token_slice: slice
    num_scheduled_tokens: np.ndarray
    num_computed_tokens: np.ndarray
    seq_lens: np.ndarray
    num_rows: int


PcpStageBuilder = Callable[[PcpStage], Mapping[str, object]]


def _actual_seq_lengths_q(context):
    if not context.common.actual_seq_lengths_q:
        return []
    return context.query_start_loc[1:].tolist()


def _one_token_each(context) -> bool:
    """Every request of the ubatch schedules exactly one token (its host query_start_loc)."""
    return bool((np.diff(context.query_start_loc) == 1).all())


def attn_state_rule(states, *, has_context: bool, one_token_each: bool, chunked_prefill: bool):
    """A ubatch's state by the model runner's ``_build_attn_state`` rule, on its own pieces.

    Upstream's order: no cached context anywhere -> PrefillNoCache; else every
    request scheduling one token -> DecodeOnly; else ChunkedPrefill with chunked
    prefill on, PrefillCacheHit without. (Its speculative-decoding branches never
    apply: the hook refuses speculative decoding at start-up.)
    """
    if not has_context:
        return states.PrefillNoCache
    if one_token_each:
        return states.DecodeOnly
    return states.ChunkedPrefill if chunked_prefill else states.PrefillCacheHit


def _attn_state(chunked_prefill: bool):
    """``attn_state_rule`` as a recompute rule (the one-token test only when tokens == reqs)."""

    def recompute(context):
        return attn_state_rule(
            type(context.common.attn_state),
            has_context=bool(context.num_computed_tokens.any()),
            one_token_each=(context.ubatch.num_real_tokens == context.num_reqs
                            and _one_token_each(context)),
            chunked_prefill=chunked_prefill)

    return recompute


def _keep_when_unset(name: str):
    def recompute(context):
        if getattr(context.common, name) is not None:
            raise UnsupportedSplitError(f"{name} is set but no PCP stage builder was given")
        return None

    return recompute


ASCEND_RECOMPUTE = MappingProxyType(
    {
        **VLLM_RECOMPUTE,
        "seq_lens_cpu": host_request_field("seq_lens_cpu", "seq_lens"),
        "num_computed_tokens_cpu": host_request_field(
            "num_computed_tokens_cpu", "num_computed_tokens"
        ),
        "actual_seq_lengths_q": _actual_seq_lengths_q,
        "attn_state": _attn_state(chunked_prefill=False),
        "num_input_tokens": lambda c: c.ubatch.num_rows,
        **{name: _keep_when_unset(name) for name in PCP_METADATA_FIELDS},
    }
)

check_recompute_table(ASCEND_LAYOUTS, ASCEND_FIELD_RULES, ASCEND_RECOMPUTE)


def _pcp_from_parent(name: str):
    def recompute(context):
        return getattr(context.common, name)  # replaced by the stage builder's value

    return recompute


def _recompute_table(*, chunked_prefill: bool, pcp_builder: bool):
    table = {**ASCEND_RECOMPUTE, "attn_state": _attn_state(chunked_prefill)}
    if pcp_builder:
        table.update({name: _pcp_from_parent(name) for name in PCP_METADATA_FIELDS})
    return MappingProxyType(table)


ASCEND_RECOMPUTE_BY_MODE = MappingProxyType(
    {
        (chunked, builder): _recompute_table(chunked_prefill=chunked, pcp_builder=builder)
        for chunked in (False, True)
        for builder in (False, True)
    }
)
"""The recompute table per (chunked_prefill, PCP builder given): built once, not per step."""


def ascend_layout(common) -> PinnedLayout:
    """The pinned layout of ``type(common)``; ``UnsupportedSplitError`` naming any drift."""
    return match_layout(type(common), ASCEND_LAYOUTS)


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def ascend_field_program(cls: type) -> FieldProgram:
    """``cls``'s pinned layout with its fields grouped by rule (drift check once per class)."""
    layout = match_layout(cls, ASCEND_LAYOUTS)
    return compile_fields(layout, ASCEND_FIELD_RULES, ASCEND_HOST_SOURCES, cls)


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def ascend_compiled_split(cls: type, chunked_prefill: bool) -> CompiledSplit:
    """``cls``'s split without a PCP builder, generated once per class and mode."""
    recompute = ASCEND_RECOMPUTE_BY_MODE[chunked_prefill, False]
    return compiled_split(ascend_field_program(cls), recompute, padded_rows=True, cls=cls)


def _pcp_fields_set(common, layout: PinnedLayout) -> list[str]:
    return [n for n in PCP_METADATA_FIELDS if n in layout.field_set and field_is_set(common, n)]


def check_ascend_pcp_startup(*, pcp_size: int, pcp_stage_builder: PcpStageBuilder | None) -> None:
    """Start-up: PCP > 1 needs the engine's stage builder, else fail before any group exists."""
    if pcp_size > 1 and pcp_stage_builder is None:
        raise UnsupportedSplitError(
            f"prefill context parallel size {pcp_size} needs a pcp_stage_builder (the engine's "
            "per-stage PCP metadata helper); without one the split is not enabled"
        )


FIA_PADDING = "FIA padding"
"""What the refusal of a parent with _pad_query_start_loc_for_fia's dummy request is named."""


def _reject_fia_padding(common, plan: SplitPlan, layout: PinnedLayout) -> None:
    """An Ascend prefill parent with more requests than the plan is FIA-padded (no other
    prefill layout of the pinned runner pads requests, see the layout's ``runner_layouts``):
    its dummy request holds the padding tokens. Stages get no such dummy, so refuse by name."""
    qsl = host_numpy(common.query_start_loc_cpu)
    real, padded = plan.num_requests, common.num_reqs
    tokens = qsl[real + 1 : padded + 1] - qsl[real:padded] if qsl.shape[0] > padded else None
    raise UnsupportedSplitError(
        f"{layout.describe()}: {FIA_PADDING}: num_reqs={padded} holds "
        f"{padded - real} dummy request(s) past the plan's {real} "
        f"(padding tokens {None if tokens is None else tokens.tolist()}), as "
        "_pad_query_start_loc_for_fia inserts for FIA (non-MLA attention with sequence "
        "parallelism, or a FULL graph); a stage-local FIA dummy request is not built, so "
        "this batch is not split"
    )


def check_ascend_split_support(
    common, plan: SplitPlan, *, pcp_stage_builder: PcpStageBuilder | None = None
) -> FieldProgram:
    """Every fail-closed check of the Ascend split, with nothing built; returns the program.

    Rejects an unknown layout, a set field the split cannot honour, FIA padding (a
    dummy request past the plan's), a non-prefill ``attn_state``, an ``actual_seq_lengths_q`` that is not the cumulative query
    lengths, and PCP metadata without a builder (or a plan whose pcp_size
    disagrees with the metadata).
    """
    program = ascend_field_program(type(common))
    layout = program.layout
    reject_unsupported_fields(common, program)
    if common.num_reqs > plan.num_requests:
        _reject_fia_padding(common, plan, layout)
    state = common.attn_state
    if state is None or state.name not in PREFILL_STATES:
        raise UnsupportedSplitError(
            f"{layout.describe()}: attn_state={state!r}; only prefill states {PREFILL_STATES} "
            "are split"
        )
    actual = common.actual_seq_lengths_q
    if actual:
        expected = host_numpy(common.query_start_loc_cpu)[1 : plan.num_requests + 1].tolist()
        if list(actual[: plan.num_requests]) != expected:
            raise UnsupportedSplitError(
                f"{layout.describe()}: actual_seq_lengths_q={list(actual)[:8]} is not the "
                f"cumulative query lengths {expected[:8]}; its per-stage value is unknown"
            )
    pcp_set = _pcp_fields_set(common, layout)
    if pcp_set and pcp_stage_builder is None:
        raise UnsupportedSplitError(
            f"{layout.describe()}: {pcp_set} is set (context parallelism) but no "
            "pcp_stage_builder was given to regenerate it per stage"
        )
    if bool(pcp_set) != (plan.constraints.pcp_size > 1):
        raise UnsupportedSplitError(
            f"{layout.describe()}: plan pcp_size={plan.constraints.pcp_size} but PCP "
            f"metadata set: {pcp_set or 'none'}"
        )
    return program


def _pcp_stage(ubatch, produced: tuple) -> PcpStage:
    qsl, seq_lens, computed = (np.array(array, dtype=np.int64) for array in produced)
    return PcpStage(
        index=ubatch.index,
        request_slice=ubatch.request_slice,
        token_slice=ubatch.token_slice,
        num_scheduled_tokens=qsl[1:] - qsl[:-1],
        num_computed_tokens=computed,
        seq_lens=seq_lens,
        num_rows=ubatch.num_rows,
    )


def _stage_pcp_fields(builder: PcpStageBuilder, ubatch, produced, layout: PinnedLayout) -> dict:
    built = dict(builder(_pcp_stage(ubatch, produced)))
    unknown = sorted(set(built) - (PCP_BUILDER_FIELDS & layout.field_set))
    if unknown:
        raise UnsupportedSplitError(
            f"pcp_stage_builder returned fields {unknown}; it may set only "
            f"{sorted(PCP_BUILDER_FIELDS & layout.field_set)}"
        )
    return built


def split_ascend_common_metadata(
    plan: SplitPlan,
    common,
    positions,
    block_size: int,
    *,
    chunked_prefill: bool,
    pcp_stage_builder: PcpStageBuilder | None = None,
    check: str = CHECK_REQUESTS,
    compiled: bool = True,
):
    """Per-ubatch ``(AscendCommonAttentionMetadata, positions)`` pairs for ``plan``, checked.

    ``chunked_prefill`` is the engine's ``scheduler_config.enable_chunked_prefill``
    (it decides ChunkedPrefill vs PrefillCacheHit for a ubatch with cached
    context, as the model runner's ``_build_attn_state`` does). ``positions``
    rows follow the ubatch's rows (``num_input_tokens``). ``check`` as in
    ``afd_split.engine.vllm.split_common_metadata``. Without a PCP builder the
    split runs the class's compiled rules (``ascend_compiled_split``);
    ``compiled=False`` applies them field by field (the reference it is tested
    against, byte for byte).
    """
    program = check_ascend_split_support(common, plan, pcp_stage_builder=pcp_stage_builder)
    parent = parent_arrays_of(plan, common, program)
    recompute = ASCEND_RECOMPUTE_BY_MODE[bool(chunked_prefill), pcp_stage_builder is not None]
    if pcp_stage_builder is None and compiled:  # the per-step path: the class's compiled rules
        split = ascend_compiled_split(type(common), bool(chunked_prefill))
        results, produced = split(plan, common, positions, parent)
        return checked_produced(
            plan, common, positions, block_size, parent, produced, results, check
        )
    per_ubatch = split_fields(plan, common, program, recompute, parent, padded_rows=True)
    results = []
    for ubatch, values in zip(plan.ubatches, per_ubatch, strict=True):
        if pcp_stage_builder is not None:
            produced = produced_arrays(values, program)
            values.update(_stage_pcp_fields(pcp_stage_builder, ubatch, produced, program.layout))
        sub = replaced(common, values)
        rows = positions_rows(positions, common, values, ubatch, with_padding=True)
        results.append((sub, rows))
    return checked_results(
        plan, common, positions, block_size, program, parent, per_ubatch, results, check
    )

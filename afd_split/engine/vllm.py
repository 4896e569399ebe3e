"""vLLM ``CommonAttentionMetadata`` split per ubatch, on the real layouts of vLLM 0.19.1 / 0.26.0 / 0.33.0.

API (stable; the AFD-plugin hook calls these):

* ``split_common_metadata(plan, common, positions, block_size, *, check="requests",
  compiled=True) -> list[(CommonAttentionMetadata, positions)]``: one pair per ubatch,
  same class (``vllm_compiled_split(cls).source``: the generated split of a class).
* ``common_layout(common) -> PinnedLayout``: the run-time drift check (fails closed).
* ``VLLM_LAYOUTS``, ``VLLM_FIELD_RULES``, ``VLLM_RECOMPUTE``, ``VLLM_HOST_SOURCES``,
  ``SUPPORTED_VLLM_VERSIONS``, ``common_attention_metadata_type()``.

Layouts are the exact field lists read from each wheel (``pinned/vllm-*.json``
with version and commit id). On 0.19.1 and 0.26.0 the host copies are the
backing fields ``_seq_lens_cpu`` / ``_num_computed_tokens_cpu`` (the public
``seq_lens_cpu`` / ``num_computed_tokens_cpu`` are deprecated properties that
would copy from the device when unset); on 0.33.0 they are gone and the host
sequence lengths are ``seq_lens_cpu_upper_bound`` (exact for prefill rows).
Real counts come from the plan: the GPU runner pads ``num_actual_tokens`` and
``num_reqs``; each ubatch carries its real tokens and requests only.
Every field has a rule (``VLLM_FIELD_RULES``); a field the split cannot
honour is rejected by name when set, and an unknown field list fails closed.
"""

from __future__ import annotations

import functools
from types import MappingProxyType

from afd_split.engine.common import (
    FieldProgram,
    HostSources,
    check_recompute_table,
    checked_produced,
    checked_results,
    compile_fields,
    parent_arrays_of,
    positions_rows,
    reject_unsupported_fields,
    replaced,
    split_fields,
)
from afd_split.engine.compiled import CompiledSplit, compiled_split, host_copy, recompute_expr
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
    cut_seq_lens,
    host_max,
    max_query_len,
    rebased_query_start_loc,
    ubatch_request_rows,
)
from afd_split.errors import UnsupportedSplitError
from afd_split.plan.planner import SplitPlan

SUPPORTED_VLLM_VERSIONS = ("0.19.1", "0.26.0", "0.33.0")
VLLM_LAYOUTS = tuple(load_layout(f"vllm-{version}") for version in SUPPORTED_VLLM_VERSIONS)

VLLM_FIELD_RULES = MappingProxyType(
    {
        # Recomputed from the plan and the parent's host fields (VLLM_RECOMPUTE).
        "query_start_loc": FieldRule.RECOMPUTE,
        "query_start_loc_cpu": FieldRule.RECOMPUTE,
        "seq_lens": FieldRule.RECOMPUTE,
        "_seq_lens_cpu": FieldRule.RECOMPUTE,
        "_num_computed_tokens_cpu": FieldRule.RECOMPUTE,
        "seq_lens_cpu_upper_bound": FieldRule.RECOMPUTE,
        "num_reqs": FieldRule.RECOMPUTE,
        "num_actual_tokens": FieldRule.RECOMPUTE,
        "max_query_len": FieldRule.RECOMPUTE,
        "max_seq_len": FieldRule.RECOMPUTE,
        "causal": FieldRule.RECOMPUTE,  # bool: kept (batch-invariant); per-request tensor: sliced
        # Sliced by the plan.
        "block_table_tensor": FieldRule.REQUEST_ROWS,
        "is_prefilling": FieldRule.REQUEST_ROWS,  # a cut request prefills on both sides
        "req_idx": FieldRule.REQUEST_ROWS,
        "rswa_prefix_lens": FieldRule.REQUEST_ROWS,  # per-request prompt length: same per piece
        "slot_mapping": FieldRule.TOKEN_ROWS,
        "positions": FieldRule.TOKEN_ROWS,
        # Lazily filled caches of the parent: rebuilt by the ubatch's own methods.
        "_num_computed_tokens_cache": FieldRule.CLEAR,
        "_token_to_req_indices_cache": FieldRule.CLEAR,
        # Features a two-ubatch prefill split does not honour: fail closed when set.
        "logits_indices_padded": FieldRule.REJECT_WHEN_SET,  # KV-sharing fast prefill
        "num_logits_indices": FieldRule.REJECT_WHEN_SET,
        "max_logits_per_req": FieldRule.REJECT_WHEN_SET,
        "encoder_seq_lens": FieldRule.REJECT_WHEN_SET,  # cross-attention
        "encoder_seq_lens_cpu": FieldRule.REJECT_WHEN_SET,
        "dcp_local_seq_lens": FieldRule.REJECT_WHEN_SET,  # DCP > 1: per-rank shards of a cut
        "dcp_local_seq_lens_cpu": FieldRule.REJECT_WHEN_SET,
        "dcp_local_seq_lens_cpu_upper_bound": FieldRule.REJECT_WHEN_SET,
        "mm_req_doc_ranges": FieldRule.REJECT_WHEN_SET,  # keyed by batch request index
        "replayssm_decode_base_cpu": FieldRule.REJECT_WHEN_SET,  # Mamba2 decode ring origin
    }
)
"""The rule of every field of every supported layout (checked at import and in tests)."""

VLLM_HOST_SOURCES = HostSources(
    seq_lens=("_seq_lens_cpu", "seq_lens_cpu_upper_bound"),
    computed=("_num_computed_tokens_cpu",),
    token_pad_values=(("slot_mapping", PAD_SLOT_ID), ("positions", PAD_POSITION)),
)
"""Host seq_lens: the 0.19.1/0.26.0 backing field, else 0.33.0's upper bound (exact on
prefill rows); computed tokens: the backing field, else seq_len - query_len."""


def host_request_field(name: str, values: str):
    """Recompute a host request-indexed field from the ubatch's ``values`` array (a
    ``StageContext`` attribute) when the parent set it."""
    return host_copy(name, values)


VLLM_RECOMPUTE = MappingProxyType(
    {
        "query_start_loc": recompute_expr(
            "rebased_query_start_loc(c.common.query_start_loc, c.ubatch, c.already_done, "
            "c.left_over)",
            rebased_query_start_loc=rebased_query_start_loc,
        ),
        "query_start_loc_cpu": host_request_field("query_start_loc_cpu", "query_start_loc"),
        "seq_lens": recompute_expr(
            "cut_seq_lens(c.common.seq_lens, c.ubatch, c.left_over)", cut_seq_lens=cut_seq_lens
        ),
        "_seq_lens_cpu": host_request_field("_seq_lens_cpu", "seq_lens"),
        "seq_lens_cpu_upper_bound": host_request_field("seq_lens_cpu_upper_bound", "seq_lens"),
        "_num_computed_tokens_cpu": host_request_field(
            "_num_computed_tokens_cpu", "num_computed_tokens"
        ),
        "num_reqs": recompute_expr("c.num_reqs"),
        "num_actual_tokens": recompute_expr("c.ubatch.num_real_tokens"),
        "max_query_len": recompute_expr(
            "max_query_len(c.query_start_loc)", max_query_len=max_query_len
        ),
        "max_seq_len": recompute_expr("host_max(c.seq_lens)", host_max=host_max),
        # bool: kept (batch-invariant); a per-request tensor: sliced.
        "causal": recompute_expr(
            "c.common.causal if isinstance(c.common.causal, bool) "
            "else ubatch_request_rows(c.common.causal, c.ubatch)",
            ubatch_request_rows=ubatch_request_rows,
        ),
    }
)
"""How each RECOMPUTE field of the base class is derived for one ubatch."""

check_recompute_table(VLLM_LAYOUTS, VLLM_FIELD_RULES, VLLM_RECOMPUTE)


def common_layout(common, layouts: tuple[PinnedLayout, ...] = VLLM_LAYOUTS) -> PinnedLayout:
    """The pinned layout of ``type(common)``; ``UnsupportedSplitError`` naming any drift."""
    return match_layout(type(common), layouts)


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def vllm_field_program(cls: type) -> FieldProgram:
    """``cls``'s pinned layout with its fields grouped by rule (drift check once per class)."""
    return compile_fields(match_layout(cls, VLLM_LAYOUTS), VLLM_FIELD_RULES, VLLM_HOST_SOURCES, cls)


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def vllm_compiled_split(cls: type) -> CompiledSplit:
    """``cls``'s split, generated once from its rules (``.source`` shows the code)."""
    return compiled_split(vllm_field_program(cls), VLLM_RECOMPUTE, padded_rows=False, cls=cls)


def split_common_metadata(
    plan: SplitPlan,
    common,
    positions,
    block_size: int,
    *,
    check: str = CHECK_REQUESTS,
    compiled: bool = True,
):
    """Per-ubatch ``(CommonAttentionMetadata, positions)`` pairs for ``plan``, checked.

    ``positions`` is the model runner's positions tensor (``[T']`` or ``[3, T']``,
    possibly padded); each ubatch gets its real tokens' view, and its metadata
    counts real tokens and requests only. ``check`` is ``"requests"`` (default:
    O(R) on the produced host fields, cheap enough for every step) or
    ``"full"`` (also the token-level ``validate_split``; copies slot_mapping,
    the block table and positions to the host: debugging only). Raises
    ``UnsupportedSplitError`` for an unknown layout, a set rejected field or a
    PCP plan, ``ValueError`` when the plan does not describe this batch, and
    ``SplitInvariantError`` when the check fails. The parent is not mutated.
    The split runs the class's compiled rules (``vllm_compiled_split``);
    ``compiled=False`` applies them field by field (the reference it is tested
    against, byte for byte).
    """
    program = vllm_field_program(type(common))
    reject_unsupported_fields(common, program)
    if plan.constraints.pcp_size > 1:
        raise UnsupportedSplitError(
            f"plan has pcp_size={plan.constraints.pcp_size}: the vLLM adapter does not build "
            "PCP metadata; use afd_split.engine.ascend with the engine's PCP builder"
        )
    parent = parent_arrays_of(plan, common, program)
    if compiled:
        results, produced = vllm_compiled_split(type(common))(plan, common, positions, parent)
        return checked_produced(
            plan, common, positions, block_size, parent, produced, results, check
        )
    per_ubatch = split_fields(plan, common, program, VLLM_RECOMPUTE, parent, padded_rows=False)
    results = [
        (
            replaced(common, values),
            positions_rows(positions, common, values, ubatch, with_padding=False),
        )
        for ubatch, values in zip(plan.ubatches, per_ubatch, strict=True)
    ]
    return checked_results(
        plan, common, positions, block_size, program, parent, per_ubatch, results, check
    )


def common_attention_metadata_type() -> type:
    """The installed vLLM's ``CommonAttentionMetadata`` (imports vLLM)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata  # lazy: optional dependency

    return CommonAttentionMetadata

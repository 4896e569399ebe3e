"""vLLM-Ascend v0.19.1rc1 stage metadata under PCP, for stages laid out by ``pcp_relayout``.

Under PCP the runner's ``AscendCommonAttentionMetadata`` is rank-local
(vllm-ascend v0.19.1rc1 da421afad719, ``model_runner_v1._prepare_inputs`` after
``PCPManager.update_tokens_for_pcp``): ``query_start_loc`` counts this rank's
rows per request (padded / pcp), ``seq_lens`` and the host ``_seq_lens_cpu``
are computed tokens plus those rows, ``positions`` are this rank's rows'
positions, and ``slot_mapping`` / ``prefill_context_parallel_metadata`` are
rebuilt from the GLOBAL counts by the PCP helper. A split stage is built the
way the runner builds a batch of the stage's pieces scheduled alone (the head
of a cut request as a fresh request, its tail as a continuation whose
computed tokens include the head): request fields from the pieces' rows on
this rank, positions from the relaid rows, ``max_query_len`` from the pieces'
global tokens (the runner takes it before the PCP update).

``slot_mapping`` and ``prefill_context_parallel_metadata`` are left None here:
the plugin's per-stage PCP rebuild (``_build_stage_local_pcp_metadata``,
afd-plugin release/v0.19.1rc1) regenerates both from the stage's own global
counts, and ``pcp_seam.check_rebuilt_stage`` holds what it produced against
the relayout before any stage runs. Every other field follows its pinned rule;
a set field the stage cannot honour fails closed by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from afd_split.checks.request_checks import check_split_arrays
from afd_split.engine.ascend import (
    ASCEND_FIELD_RULES,
    PREFILL_STATES,
    ascend_field_program,
    attn_state_rule,
)
from afd_split.engine.common import field_is_set, reject_unsupported_fields, replaced
from afd_split.engine.layout import FieldRule
from afd_split.engine.slicing import host_numpy
from afd_split.errors import UnsupportedSplitError
from afd_split.pcp.relayout import RankRelayout
from afd_split.pcp.stage import PcpStageTokens, rank_rows_per_request, stage_tokens
from afd_split.plan.types import SplitPlan

PCP_LAYOUT_TAG = "v0.19.1rc1"
"""The one pinned vLLM-Ascend layout with PCP on model runner v1 (v0.26 needs runner v2)."""

REBUILT_BY_STAGE_PCP = ("slot_mapping", "prefill_context_parallel_metadata")
"""Set to None here; the plugin's per-stage PCP rebuild writes them (then checked)."""


@dataclass(frozen=True)
class PcpStageRows:
    """One stage's requests as this PCP rank holds them."""

    tokens: PcpStageTokens
    rank_rows: np.ndarray  # per piece: rows on every rank (padded / pcp; a decode: its tokens)
    row_slice: slice  # the stage's rows in the relaid concatenation

    @property
    def query_start_loc(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.rank_rows)])

    @property
    def seq_lens(self) -> np.ndarray:
        """The runner's PCP rule: computed tokens plus this rank's rows of the request."""
        return self.tokens.num_computed_tokens + self.rank_rows


def stage_rows_of(plan: SplitPlan, num_computed_tokens, relayout: RankRelayout) -> list:
    """Each stage's pieces and their rows on the relayout's rank."""
    stages = []
    for stage, rows in zip(stage_tokens(plan, num_computed_tokens), relayout.stage_row_slices,
                           strict=True):
        rank_rows = rank_rows_per_request(stage.num_scheduled_tokens, relayout.pcp_size)
        if int(rank_rows.sum()) != rows.stop - rows.start:
            raise AssertionError("relayout rows disagree with the stage's pieces")  # unreachable
        stages.append(PcpStageRows(stage, rank_rows, rows))
    return stages


def _pcp_layout(common):
    """The pinned layout of ``common``, refusing every layout but v0.19.1rc1 and set fields the
    rules refuse (the program's REJECT_WHEN_SET test)."""
    program = ascend_field_program(type(common))
    if program.layout.version != PCP_LAYOUT_TAG:
        raise UnsupportedSplitError(
            f"{program.layout.describe()}: PCP stages are built for vLLM-Ascend {PCP_LAYOUT_TAG} "
            "only (its model runner v1 has PCP; releases/v0.26.0rc needs model runner v2)")
    reject_unsupported_fields(common, program)
    if common.actual_seq_lengths_q:
        raise UnsupportedSplitError(
            f"{program.layout.describe()}: actual_seq_lengths_q is set under PCP; its per-stage "
            "value is not modelled")
    state = common.attn_state
    if state is None or state.name not in PREFILL_STATES:
        raise UnsupportedSplitError(
            f"{program.layout.describe()}: attn_state={state!r}; only prefill states "
            f"{PREFILL_STATES} are split")
    return program.layout


def _like(array: np.ndarray, like):
    """``array`` as a tensor of ``like``'s dtype on ``like``'s device (None stays None)."""
    if like is None:
        return None
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).to(device=like.device, dtype=like.dtype)


def _recomputed(common, stage: PcpStageRows, chunked_prefill: bool) -> dict:
    """The RECOMPUTE fields of one relaid stage, as the runner fills them under PCP."""
    qsl, seq_lens = stage.query_start_loc, stage.seq_lens
    computed = stage.tokens.num_computed_tokens
    rows = stage.row_slice.stop - stage.row_slice.start
    return {
        "query_start_loc": _like(qsl, common.query_start_loc),
        "query_start_loc_cpu": _like(qsl, common.query_start_loc_cpu),
        "seq_lens": _like(seq_lens, common.seq_lens),
        "_seq_lens_cpu": _like(seq_lens, common._seq_lens_cpu),
        "seq_lens_cpu": _like(seq_lens, common.seq_lens_cpu),
        "num_computed_tokens_cpu": _like(computed, common.num_computed_tokens_cpu),
        "_num_computed_tokens_cpu": _like(computed, common._num_computed_tokens_cpu),
        "num_reqs": len(stage.rank_rows),
        "num_actual_tokens": rows,
        "num_input_tokens": rows,
        # The runner takes max_query_len from the global counts, before the PCP update.
        "max_query_len": int(stage.tokens.num_scheduled_tokens.max()),
        "max_seq_len": int(seq_lens.max()),
        "causal": common.causal,
        "actual_seq_lengths_q": [],
        "attn_state": attn_state_rule(  # on the pieces' global tokens and computed tokens
            type(common.attn_state), has_context=bool(computed.any()),
            one_token_each=bool((stage.tokens.num_scheduled_tokens == 1).all()),
            chunked_prefill=chunked_prefill),
        "prefill_context_parallel_metadata": None,  # rebuilt by the plugin's stage rebuild
    }


def _stage_values(common, layout, stage: PcpStageRows, positions, chunked_prefill: bool) -> dict:
    """Every field of the layout for one stage, by its pinned rule."""
    recomputed = _recomputed(common, stage, chunked_prefill)
    requests = slice(stage.tokens.request_start,
                     stage.tokens.request_start + len(stage.rank_rows))
    values = {}
    for name in layout.fields:
        rule = ASCEND_FIELD_RULES[name]
        if rule is FieldRule.RECOMPUTE:
            if name not in recomputed:
                raise UnsupportedSplitError(f"{layout.describe()}: no PCP stage rule for {name}")
            values[name] = recomputed[name]
        elif rule is FieldRule.REQUEST_ROWS:
            value = getattr(common, name)
            values[name] = None if value is None else value[requests]
        elif rule is FieldRule.TOKEN_ROWS and name == "positions":
            values[name] = positions[stage.row_slice]
        elif rule is FieldRule.TOKEN_ROWS and name in REBUILT_BY_STAGE_PCP:
            values[name] = None  # rebuilt by the plugin's stage rebuild
        elif rule is FieldRule.CLEAR:
            values[name] = None
        elif rule in (FieldRule.TOKEN_ROWS, FieldRule.FRESH_BUFFER) and field_is_set(common, name):
            raise UnsupportedSplitError(
                f"{layout.describe()}: {name} ({rule.value}) is set; its rows are not relaid "
                "under PCP")
    return values


def pcp_stage_metadata(plan: SplitPlan, common, num_computed_tokens, relayout: RankRelayout,
                       stage_positions, *, chunked_prefill: bool) -> list:
    """Per stage, ``common`` rebuilt for the stage's relaid rows on this rank.

    ``stage_positions`` is the device tensor of every relaid row's position (all
    stages, ``relayout.stage_positions`` on the engine's device); each stage's
    ``positions`` is its slice. The pieces are request-level checked on their
    global counts (``check_split_arrays``) and the rank-local arrays against them.
    """
    layout = _pcp_layout(common)
    counts = np.asarray(plan.token_counts, dtype=np.int64)
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    if common.num_reqs != len(counts):
        raise UnsupportedSplitError(
            f"parent num_reqs={common.num_reqs} but the plan has {len(counts)} requests")
    stages = stage_rows_of(plan, computed, relayout)
    _check_pieces(plan, counts, computed, stages)
    results = [replaced(common, _stage_values(common, layout, stage, stage_positions,
                                              chunked_prefill)) for stage in stages]
    _check_rank_local(results, stages)
    return results


def _check_pieces(plan: SplitPlan, counts: np.ndarray, computed: np.ndarray, stages) -> None:
    """The pieces as a split of the global batch: the plan's request-level check."""
    qsl = np.concatenate([[0], np.cumsum(counts)])
    parts = []
    for stage in stages:
        pieces = stage.tokens.num_scheduled_tokens
        parts.append((np.concatenate([[0], np.cumsum(pieces)]),
                      stage.tokens.num_computed_tokens + pieces, stage.tokens.num_computed_tokens))
    check_split_arrays(plan, qsl, computed + counts, computed, parts)


def _check_rank_local(results: list, stages) -> None:
    """Each built stage's rank-local host arrays read back: rows per piece, and seq_len minus
    those rows is the piece's computed tokens (the runner's PCP convention)."""
    for index, (built, stage) in enumerate(zip(results, stages, strict=True)):
        qsl = host_numpy(built.query_start_loc_cpu).astype(np.int64)
        seq_lens = host_numpy(built._seq_lens_cpu).astype(np.int64)
        if not np.array_equal(np.diff(qsl), stage.rank_rows):
            raise UnsupportedSplitError(f"stage {index}: query_start_loc_cpu rows {np.diff(qsl)} "
                                        f"are not the pieces' rank rows {stage.rank_rows}")
        if not np.array_equal(seq_lens - np.diff(qsl), stage.tokens.num_computed_tokens):
            raise UnsupportedSplitError(
                f"stage {index}: seq_len - rank rows = {seq_lens - np.diff(qsl)} is not the "
                f"pieces' computed tokens {stage.tokens.num_computed_tokens}")

"""``token_balanced`` under PCP on afd-plugin release/v0.19.1rc1: the per-stage PCP seam.

Facts (afd-plugin release/v0.19.1rc1 2f4f462, ``v1/worker/npu/attention_model_runner.py``
and ``model_executor/models/npu/deepseek_v2_async_cam_forward.py``; vllm-ascend
v0.19.1rc1 da421afad719, ``worker/pcp_utils.py`` and ``worker/model_runner_v1.py``):

* ``_build_attention_metadata_with_ubatches`` slices each attention group with the
  runner module's ``split_attn_metadata`` and, for every stage in that list, calls
  its inner ``_build_stage_local_pcp_metadata(common_attn_metadata, ubatch_slice,
  ubid, kv_cache_gid, attn_gid)``: it reads the stage's counts as
  ``pcp_manager.query_lens_pcp_full.cpu[:num_reqs][request_slice]`` and its global
  token range as the sums before ``request_slice.start`` / ``.stop``, re-runs the
  PCP manager's ``init_batch_info``, ``update_tokens_for_pcp``,
  ``generate_pcp_metadata`` and ``get_padded_slot_mapping`` (on
  ``input_batch.block_table[kv_cache_gid].slot_mapping.gpu`` of that range), and
  restores the manager. main has no PCP path.
* Upstream bug: that call hands ``generate_pcp_metadata`` the whole batch's
  ``self.input_batch``, which reads ``num_computed_tokens_cpu`` from index 0: stage
  1's cached-context lengths are those of the batch's first requests.
* Under PCP the runner overwrites ``num_scheduled_tokens_np`` with its rank-local
  counts; ``query_lens_pcp_full`` keeps the global ones, the same on every PCP rank.
* ``_prepare_inputs`` lays the batch out (one zigzag per whole request) before any
  planner seam, the dense layers run the whole batch on those rows, and
  ``run_async_moe_ubatch_afd_forward`` slices each stage's rows by
  ``UBatchSlice.token_slice``.

So the hook plans token_balanced on the global counts (a cut may fall inside a
request), lays each stage out as its own zigzag (``afd_split.pcp.relayout``:
the forward patch moves the rows of the requests whose layout differs, by one
PCP all-to-all each way), builds each stage's metadata for its relaid rows
(``afd_split.engine.ascend_pcp``), and lets the plugin's own stage rebuild
regenerate the PCP metadata and slots from the stage's own counts: while it
iterates, ``query_lens_pcp_full`` holds the stage's pieces (zero elsewhere) and
``input_batch`` is a stage-local view whose computed tokens are the pieces' (the
AFD-only fix of the whole-batch input_batch) and whose slot-mapping rows start at
the stage's first token. ``check_rebuilt_stages`` then holds what it produced
against the pieces before any stage runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from afd_split.engine.slicing import host_numpy
from afd_split.errors import UnsupportedSplitError
from afd_split.hook.glue.step_facts import runner_step_facts
from afd_split.hook.planning.engine_step import plan_engine_step
from afd_split.hook.planning.stages import (
    HookSession,
    PlannedUBatchSlices,
    record_step,
)
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.relayout import AllToAll, RankRelayout, rank_relayout
from afd_split.pcp.stage import PcpStageTokens, num_decode_requests, stage_tokens
from afd_split.plan.constraints import SplitPolicy
from afd_split.plan.planner import SplitPlan

PCP_STAGE_RULE = (
    "token_balanced under PCP: every stage laid out as its own zigzag (the head of a cut "
    "request scheduled alone, its tail as a continuation); rows of requests whose layout "
    "differs move by one PCP all-to-all each way (afd_split.pcp.relayout)"
)
"""Recorded in every PCP step's evidence line (``pcp_stage_rule``)."""


def global_scheduled_counts(pcp_manager, num_reqs: int) -> np.ndarray:
    """The step's global per-request scheduled tokens (``query_lens_pcp_full``): identical on
    every PCP rank, unlike the rank-local ``num_scheduled_tokens_np``."""
    return pcp_manager.query_lens_pcp_full.cpu[:num_reqs].numpy().astype(np.int64)


def check_pcp_alignment(alignment: EngineAlignment) -> None:
    """PCP with sequence parallelism fails closed: under FlashComm1 a stage's rows are
    scattered over the TP ranks, which the relaid layout does not model."""
    if alignment.rank_local_unit > 1:
        raise UnsupportedSplitError(
            f"PCP stages with sequence parallelism ({alignment.describe()}): the relaid "
            "stage rows are not modelled under FlashComm1's TP scatter; not supported")


def plan_pcp_step(num_scheduled_tokens, num_computed_tokens,
                  alignment: EngineAlignment, min_split_tokens: int = 0) -> SplitPlan:
    """Token-balanced stages on the global counts, each request piece padded to 2 * pcp
    (unsplit below ``min_split_tokens`` global tokens: ``planning.threshold``)."""
    return plan_engine_step(num_scheduled_tokens, policy=SplitPolicy.TOKEN_BALANCED,
                            constraints=alignment.constraints(None),
                            num_computed_tokens=num_computed_tokens,
                            min_split_tokens=min_split_tokens)


@dataclass(frozen=True)
class SlotRows:
    """``slot_mapping.gpu`` of one KV-cache group seen from a stage's first token."""

    gpu: Any


@dataclass(frozen=True)
class StageBlockTable:
    """What the stage rebuild reads of ``input_batch.block_table[gid]``: its slot rows."""

    slot_mapping: SlotRows


@dataclass(frozen=True)
class StageBlockTables:
    """``input_batch.block_table`` for one stage: group ``gid``'s slot rows from ``offset``.

    The rebuild reads ``block_table[gid].slot_mapping.gpu[start:stop]`` with the stage's
    token range; the stage's counts start at 0 (``stage_scheduled_counts``), so rows
    from the stage's first global token give its slots. Nothing else is exposed: an
    upstream change reading more fails loudly here.
    """

    parent: Any
    offset: int

    def __getitem__(self, kv_cache_gid: int) -> StageBlockTable:
        return StageBlockTable(SlotRows(self.parent[kv_cache_gid].slot_mapping.gpu[self.offset:]))


def stage_input_batch(input_batch, stage: PcpStageTokens):
    """``input_batch`` as one stage's PCP rebuild must read it: its pieces' computed tokens
    from index 0 and its slot rows from its first token (a shallow copy; buffers shared)."""
    view = copy.copy(input_batch)
    view.num_computed_tokens_cpu = stage.num_computed_tokens.copy()
    view.block_table = StageBlockTables(input_batch.block_table, stage.token_start)
    return view


def stage_scheduled_counts(stage: PcpStageTokens, num_reqs: int) -> np.ndarray:
    """``query_lens_pcp_full[:num_reqs]`` while the stage is rebuilt: its pieces at its
    requests, zero elsewhere (so its token range starts at 0)."""
    counts = np.zeros(num_reqs, dtype=np.int64)
    counts[stage.request_start:stage.request_start + len(stage.num_scheduled_tokens)] = (
        stage.num_scheduled_tokens)
    return counts


class StageLocalInputBatches(list):
    """One stage list of the plugin's stage build; iterating it sets up each stage's rebuild.

    ``_build_attention_metadata_with_ubatches`` runs the inner stage-PCP rebuild for
    stage ``ubid`` while it iterates this list: for exactly that step
    ``runner.input_batch`` is the stage's view and ``query_lens_pcp_full`` holds the
    stage's counts; both are the runner's own again when the loop ends.
    """

    def __init__(self, stages: Sequence, runner, pcp_stages: PcpStages) -> None:
        super().__init__(stages)
        if len(pcp_stages.stages) != len(stages):
            raise ValueError(f"{len(pcp_stages.stages)} PCP stages for {len(stages)} stages")
        self._runner = runner
        self._pcp = pcp_stages

    def __iter__(self):
        runner = self._runner
        runner_batch = runner.input_batch
        counts = runner.pcp_manager.query_lens_pcp_full
        num_reqs = len(self._pcp.plan.token_counts)
        global_counts = counts.cpu[:num_reqs].clone()
        try:
            for item, stage in zip(list.__iter__(self), self._pcp.stages, strict=True):
                runner.input_batch = stage_input_batch(runner_batch, stage)
                counts.cpu[:num_reqs] = _tensor_like(stage_scheduled_counts(stage, num_reqs),
                                                     global_counts)
                yield item
        finally:
            runner.input_batch = runner_batch
            counts.cpu[:num_reqs] = global_counts
            counts.copy_to_gpu()


def _tensor_like(array: np.ndarray, like):
    import torch

    return torch.from_numpy(array).to(dtype=like.dtype)


@dataclass
class PcpStages:
    """One PCP step on this rank: the plan, its relayout, and what the stage build made."""

    plan: SplitPlan
    num_computed_tokens: np.ndarray
    relayout: RankRelayout
    stages: tuple[PcpStageTokens, ...]
    all_to_all: AllToAll
    runner: Any
    chunked_prefill: bool
    built: list = field(default_factory=list)
    _positions: dict = field(default_factory=dict)

    @classmethod
    def for_rank(cls, plan: SplitPlan, num_computed_tokens, pcp_rank: int,
                 all_to_all: AllToAll, runner, *, chunked_prefill: bool) -> PcpStages:
        computed = np.asarray(num_computed_tokens, dtype=np.int64)
        return cls(plan, computed, rank_relayout(plan, computed, pcp_rank),
                   stage_tokens(plan, computed), all_to_all, runner, chunked_prefill)

    def ubatch_slices(self, slice_type) -> list:
        """The plugin's ``UBatchSlice`` per stage: its requests and its relaid rows."""
        return [slice_type(slice(stage.request_start,
                                 stage.request_start + len(stage.num_scheduled_tokens)), rows)
                for stage, rows in zip(self.stages, self.relayout.stage_row_slices, strict=True)]

    def positions_on(self, device):
        """Every relaid row's position as a device tensor (made once per device and step)."""
        key = str(device)
        if key not in self._positions:
            import torch

            self._positions[key] = torch.from_numpy(self.relayout.stage_positions).to(device)
        return self._positions[key]

    def split(self, common) -> StageLocalInputBatches:
        """Each stage's metadata for its relaid rows, iterated with its stage-local rebuild."""
        from afd_split.engine.ascend_pcp import pcp_stage_metadata  # lazy: engine glue

        stages = pcp_stage_metadata(self.plan, common, self.num_computed_tokens, self.relayout,
                                    self.positions_on(common.query_start_loc.device),
                                    chunked_prefill=self.chunked_prefill)
        self.built.append(stages)
        return StageLocalInputBatches(stages, self.runner, self)

    def evidence(self) -> dict:
        """What the relayout moved on this rank (the step line's ``pcp_relayout``)."""
        return {
            "stage_rank_rows": list(self.relayout.stage_row_counts),
            "parent_rank_rows": self.relayout.parent_rows,
            "exchanged_requests": self.relayout.exchanged_requests.tolist(),
            "rows_received": [self.relayout.inbound.received_rows,
                              self.relayout.outbound.received_rows],
            "rows_sent": [len(self.relayout.inbound.send_rows),
                          len(self.relayout.outbound.send_rows)],
        }


def group_all_to_all(device_group) -> AllToAll:
    """The relayout's all-to-all on a process group: ``torch.distributed.all_to_all_single``
    with unequal split sizes, as vLLM-Ascend's MoE token dispatch calls it
    (vllm_ascend/ops/fused_moe/comm_utils.py at v0.19.1rc1)."""

    def all_to_all(rows, send_counts, recv_counts):
        import torch.distributed as dist  # lazy: the engine's torch

        received = rows.new_empty((int(sum(recv_counts)), *rows.shape[1:]))
        dist.all_to_all_single(received, rows.contiguous(),
                               output_split_sizes=list(recv_counts),
                               input_split_sizes=list(send_counts), group=device_group)
        return received

    return all_to_all


def check_rebuilt_stages(pcp: PcpStages) -> None:
    """Host checks of what the plugin's stage rebuild wrote into every built stage, before any
    stage runs: slots and PCP metadata for the stage's own rows, counts and context.

    Fails closed (``UnsupportedSplitError``) when the rebuild did not run for a stage or
    built it from other counts or cached lengths (e.g. an upstream change the drift check
    missed).
    """
    pcp_size = pcp.relayout.pcp_size
    for stages in pcp.built:
        for index, (common, stage, rows) in enumerate(zip(
                stages, pcp.stages, pcp.relayout.stage_row_counts, strict=True)):
            metadata = common.prefill_context_parallel_metadata
            if metadata is None or common.slot_mapping is None:
                raise UnsupportedSplitError(
                    f"stage {index}: the per-stage PCP rebuild did not run (slot_mapping or "
                    "prefill_context_parallel_metadata unset)")
            pieces = stage.num_scheduled_tokens
            counts = host_numpy(metadata.query_lens_pcp_full_cpu)[:len(pieces)]
            decodes = num_decode_requests(pieces)
            context = stage.num_computed_tokens.copy()
            context[:decodes] += pieces[:decodes]
            built_context = host_numpy(metadata.num_computed_tokens_of_pcp_dcp).reshape(
                len(pieces), -1).sum(axis=1)
            problems = [
                f"{name} {got} != {want}" for name, got, want in (
                    ("slot rows", int(common.slot_mapping.shape[0]), rows * pcp_size),
                    ("num_actual_tokens_pcp_padded", int(metadata.num_actual_tokens_pcp_padded),
                     rows * pcp_size),
                    ("query_lens_pcp_full", counts.tolist(), pieces.tolist()),
                    ("context tokens", built_context.tolist(), context.tolist()))
                if got != want]
            if problems:
                raise UnsupportedSplitError(
                    f"stage {index}: the per-stage PCP rebuild built other rows than the "
                    "relayout: " + "; ".join(problems))


def runner_computed_tokens(runner, num_reqs: int) -> np.ndarray:
    """The step's computed tokens per request: the runner's host copy (no device read)."""
    return runner.input_batch.num_computed_tokens_cpu_tensor[:num_reqs].numpy()


def plan_pcp_runner_stages(runner, session: HookSession, num_reqs: int, slice_type: type,
                           ensure_forward: Callable[[], None]) -> PlannedUBatchSlices | None:
    """Token-balanced stages on the GLOBAL counts (``query_lens_pcp_full``; the rank-local
    ``num_scheduled_tokens_np`` is never planned on), each laid out as its own zigzag on
    this rank (``pcp_seam.PcpStages``). ``ensure_forward()`` (from ``install``) makes sure
    the pipeline that runs a relaid stage is the patched one before any is planned."""
    check_pcp_alignment(session.alignment)  # before any agreement collective
    if session.pcp_all_to_all is None:
        raise UnsupportedSplitError("PCP stages need the PCP group's all-to-all; the hook "
                                    "session has none")
    global_counts = global_scheduled_counts(runner.pcp_manager, num_reqs)
    if session.skips_step(global_counts):  # below the split threshold, nothing recording
        return None
    computed = runner_computed_tokens(runner, num_reqs)
    plan = plan_pcp_step(global_counts, computed, session.alignment, session.min_split_tokens)
    pcp = None
    if plan.is_split:
        ensure_forward()  # relaid rows never reach upstream slicing
        pcp = PcpStages.for_rank(plan, computed, session.ranks.pcp_rank,
                                 session.pcp_all_to_all, runner,
                                 chunked_prefill=session.chunked_prefill)
    from afd_split.hook.glue.load_rows import pcp_parent_rows, pcp_stage_rows

    record_step(session, plan, alignment=session.alignment.describe(),
                stage_rows=(pcp_parent_rows(plan, session.ranks.pcp_rank) if pcp is None
                            else pcp_stage_rows(plan, computed, pcp.relayout)),
                pcp_stage_rule=PCP_STAGE_RULE,
                **(runner_step_facts(runner, global_counts, computed)
                   if session.writer is not None else {}),
                **({} if pcp is None else {"pcp_relayout": pcp.evidence()}))
    if pcp is None:
        return None
    return PlannedUBatchSlices(
        pcp.ubatch_slices(slice_type), plan=plan,
        block_size=runner.cache_config.block_size, session=session, pcp=pcp)

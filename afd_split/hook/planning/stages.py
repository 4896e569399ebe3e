"""Token-balanced stage planning for the AFD plugin's runner: the hook's per-step work.

Everything the patched seams do beyond routing lives here as small functions
over explicit inputs, so it is tested without the plugin: plan the step with
``engine_step.plan_engine_step``, check ranks agree (debug mode), write the
step's evidence line, and hand the runner ``PlannedUBatchSlices``: the plugin's
own ``UBatchSlice`` list plus the plan, which the patched ``split_attn_metadata``
recognises and slices through afd_split's adapter, followed by the per-step
request-level check the adapter runs on what it produced (``check="requests"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from afd_split.hook.planning.engine_step import (
    StepRanks,
    agree_across_groups,
    agreement_enabled,
    plan_engine_step,
    step_record,
)
from afd_split.hook.planning.expert_load import NATURAL, ExpertLoadRecorder, StageRows
from afd_split.hook.planning.threshold import (
    below_split_threshold,
    scheduled_total,
    split_min_tokens,
)
from afd_split.hook.planning.worker_evidence import EvidenceWriter
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.relayout import AllToAll
from afd_split.plan.constraints import SplitPolicy
from afd_split.plan.planner import SplitPlan

NO_SP_NO_PCP = EngineAlignment(tp_size=1, sequence_parallel=False)
"""A session's alignment unless the engine gives one: stages unpadded (align 1). With SP
the engine's ``EngineAlignment`` gives the TP unit and the parent's padded rows instead."""

SESSION_ATTRIBUTE = "_afd_split_hook_session"
"""AFD-only runner attribute holding its ``HookSession`` (one per runner, never global)."""

Splitter = Callable[[SplitPlan, Any, int], list]
"""(plan, parent common metadata, block size) -> one sliced metadata object per ubatch,
request-level checked on what it produced (afd_split's adapters do this every call)."""


@dataclass
class HookSession:
    """Per-runner state of the hook: where it runs, its groups, its evidence file, its step count."""

    ranks: StepRanks
    groups: Sequence[Any]
    splitter: Splitter
    writer: EvidenceWriter | None = None
    check_agreement: bool = False
    agreement_device: Any = "cpu"
    alignment: EngineAlignment = NO_SP_NO_PCP
    steps_planned: int = field(default=0)
    expert_load: ExpertLoadRecorder | None = None
    """Routed counts of the steps this session plans (evidence on, MoE model)."""
    pcp_all_to_all: AllToAll | None = None
    """The PCP group's all-to-all that moves relaid stage rows (PCP > 1)."""
    chunked_prefill: bool = False
    """``scheduler_config.enable_chunked_prefill``: decides a PCP stage's ``attn_state``."""
    min_split_tokens: int = 0
    """Steps of fewer scheduled tokens run unsplit (``planning.threshold``); 0 here splits
    every step the plan can. ``from_environment`` (the deployed hook) reads
    ``AFD_SPLIT_MIN_TOKENS``, default ``DEFAULT_SPLIT_MIN_TOKENS``."""

    @property
    def records_steps(self) -> bool:
        """Something reads each step's plan: the evidence file, the expert-load recorder or
        the debug agreement collective (then even an unsplit step is planned in full)."""
        return self.writer is not None or self.expert_load is not None or self.check_agreement

    def skips_step(self, num_scheduled_tokens) -> bool:
        """The step runs unsplit below the threshold and nothing records it: counted, and
        nothing else done (the host's whole share of a short step)."""
        if not self.min_split_tokens or self.records_steps:
            return False
        if not below_split_threshold(scheduled_total(num_scheduled_tokens), self.min_split_tokens):
            return False
        self.steps_planned += 1
        return True

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], *, ranks: StepRanks,
                         groups: Sequence[Any], splitter: Splitter,
                         alignment: EngineAlignment = NO_SP_NO_PCP,
                         num_layers: int | None = None, routing: str = NATURAL,
                         pcp_all_to_all: AllToAll | None = None,
                         chunked_prefill: bool = False) -> HookSession:
        """Evidence on when ``AFD_EVIDENCE_DIR`` is set (with expert load when the model's
        ``num_layers`` is given); agreement when ``AFD_SPLIT_DEBUG_AGREE=1``; the split
        threshold from ``AFD_SPLIT_MIN_TOKENS`` (``planning.threshold``)."""
        writer = EvidenceWriter.from_env(environ, ranks.label)
        recorder = None
        if writer is not None and num_layers is not None:
            recorder = ExpertLoadRecorder(num_layers=num_layers, routing=routing,
                                          ranks=ranks.to_dict(), write=writer.append)
        return cls(
            ranks=ranks,
            groups=groups,
            splitter=splitter,
            writer=writer,
            check_agreement=agreement_enabled(environ),
            alignment=alignment,
            expert_load=recorder,
            pcp_all_to_all=pcp_all_to_all,
            chunked_prefill=chunked_prefill,
            min_split_tokens=split_min_tokens(environ),
        )


class PlannedUBatchSlices(list):
    """The plugin's ``UBatchSlices`` for a plan, carrying what the patched slicer needs."""

    def __init__(self, slices, *, plan: SplitPlan, block_size: int,
                 session: HookSession, pcp: Any = None) -> None:
        super().__init__(slices)
        self.plan = plan
        self.block_size = block_size
        self.session = session
        self.pcp = pcp

    def split(self, common_attn_metadata) -> list:
        """Per-stage metadata from afd_split's adapter, request-level checked (every step).

        Under PCP (``pcp`` set) each stage is built for its relaid rows and iterated with
        its stage-local PCP rebuild (``pcp_seam.PcpStages.split``).
        """
        if self.pcp is not None:
            return self.pcp.split(common_attn_metadata)
        stages = self.session.splitter(self.plan, common_attn_metadata, self.block_size)
        if len(stages) != len(self.plan.ubatches):
            raise ValueError(f"the adapter returned {len(stages)} stages for a plan of "
                             f"{len(self.plan.ubatches)} ubatches")
        return stages


def ubatch_slices_for(plan: SplitPlan, slice_type) -> list:
    """The plan's ubatches as the plugin's ``UBatchSlice(request_slice, token_slice)``.

    The token slice is the stage's rows in the parent: its real tokens plus the
    parent's padding rows on the last stage (SP-aligned stages; the head of an
    aligned cut has none), so every stage's hidden rows meet the SP unit.
    """
    slices, row = [], 0
    for ubatch in plan.ubatches:
        if ubatch.token_slice.start != row:
            raise ValueError(f"ubatch {ubatch.index} starts at token {ubatch.token_slice.start} "
                             f"but row {row}: only the last stage may carry padding")
        slices.append(slice_type(ubatch.request_slice, slice(row, row + ubatch.num_rows)))
        row += ubatch.num_rows
    return slices


def planned_stage_rows(plan: SplitPlan, num_input_tokens: int | None = None) -> tuple:
    """Each stage's rows as the pipeline slices them from the parent (``ubatch_slices_for``):
    its real tokens, then padding (the SP parent's padding on the last stage). Unsplit: the
    whole parent, ``num_input_tokens`` rows when the engine padded it."""
    if not plan.is_split:
        real = int(sum(ubatch.num_real_tokens for ubatch in plan.ubatches))
        rows = real if num_input_tokens is None else max(int(num_input_tokens), real)
        return (StageRows.leading(real, rows),)
    return tuple(StageRows.leading(ubatch.num_real_tokens, ubatch.num_rows)
                 for ubatch in plan.ubatches)


def record_step(session: HookSession, plan: SplitPlan, *,
                stage_rows: tuple | None = None, **facts) -> None:
    """Agreement (debug mode) and the step's evidence line, before anything is built;
    ``stage_rows`` (``expert_load.StageRows`` per stage on this rank) lets the expert-load
    recorder count real rows only."""
    if session.check_agreement:
        agree_across_groups(plan, session.groups, device=session.agreement_device)
    step = session.steps_planned
    session.steps_planned += 1
    if session.writer is not None:
        session.writer.append(step_record(plan, step=step, ranks=session.ranks, pid=os.getpid(),
                                          **facts))
    if session.expert_load is not None:
        session.expert_load.begin_step(step, len(plan.ubatches) if plan.is_split else 1,
                                       stage_rows)


def plan_stages(session: HookSession, num_scheduled_tokens, *, num_computed_tokens,
                block_size: int, slice_type,
                num_input_tokens: int | None = None,
                step_facts: dict | None = None) -> PlannedUBatchSlices | None:
    """Plan one step for the runner; None when it runs unsplit (its line says why).

    ``num_input_tokens`` is the parent's padded rows; the session's alignment
    turns it into the step's constraints, or fails closed (``UnsupportedSplitError``
    naming the rule) before any agreement collective when the parent is unaligned.
    ``step_facts`` go into the step line as they are (the glue's request ids and schedule).
    Below the session's split threshold the step runs unsplit: with nothing recording it,
    before any planning; else planned unsplit with the reason in its line.
    """
    if session.skips_step(num_scheduled_tokens):
        return None
    plan = plan_engine_step(num_scheduled_tokens, policy=SplitPolicy.TOKEN_BALANCED,
                            constraints=session.alignment.constraints(num_input_tokens),
                            num_computed_tokens=num_computed_tokens,
                            min_split_tokens=session.min_split_tokens)
    record_step(session, plan, stage_rows=planned_stage_rows(plan, num_input_tokens),
                alignment=session.alignment.describe(), **(step_facts or {}))
    if not plan.is_split:
        return None
    return PlannedUBatchSlices(ubatch_slices_for(plan, slice_type), plan=plan,
                               block_size=block_size, session=session)


def ascend_splitter(*, chunked_prefill: bool) -> Splitter:
    """afd_split's vLLM-Ascend adapter as the hook's ``Splitter``.

    ``chunked_prefill`` is the engine's ``scheduler_config.enable_chunked_prefill``
    (it decides the stage ``attn_state``). The adapter slices the ``positions``
    field itself and runs its own request-level check on what it produced; no
    PCP stage builder is passed: PCP stages are cut by the plugin's own slicer and
    stage-PCP rebuild (``pcp_seam``), never by this adapter.
    """

    from afd_split.engine.ascend import split_ascend_common_metadata  # lazy: engine glue

    def split(plan: SplitPlan, common, block_size: int) -> list:
        pairs = split_ascend_common_metadata(plan, common, common.positions, block_size,
                                             chunked_prefill=chunked_prefill)
        return [stage for stage, _ in pairs]

    return split

"""Token-balanced stage planning for the AFD plugin's runner: the hook's per-step work.

Everything the patched seams do beyond routing lives here as small functions
over explicit inputs, so it is tested without the plugin: plan the step with
``engine_step.plan_engine_step``, check ranks agree (debug mode), write the
step's evidence line, and hand the runner ``PlannedUBatchSlices``: the plugin's
own ``UBatchSlice`` list plus the plan, which the patched ``split_attn_metadata``
recognises and slices through afd_split's adapter, followed by the per-step
request-level check of what the adapter produced.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from afd_split.constraints import SplitConstraints, SplitPolicy
from afd_split.integrations.engine_step import (
    StepRanks,
    agree_across_groups,
    agreement_enabled,
    check_engine_step,
    parent_request_fields,
    plan_engine_step,
    step_record,
)
from afd_split.integrations.worker_evidence import EvidenceWriter
from afd_split.plan import SplitPlan
from afd_split.requests import RequestFields

TOKEN_BALANCED_SPLIT = "token_balanced"
"""The ``async_moe_split`` value this hook adds; distinct from PR #203's ``"token"``."""

HOOK_CONSTRAINTS = SplitConstraints(align=1, pcp_size=1)
"""The pinned plugin slices stage hidden states by ``UBatchSlice.token_slice`` and has no
stage-local padding rows, so stages are planned unpadded (align 1) without PCP (PCP is
rejected by the validator seam)."""

SESSION_ATTRIBUTE = "_afd_split_hook_session"
"""AFD-only runner attribute holding its ``HookSession`` (one per runner, never global)."""

Splitter = Callable[[SplitPlan, Any, int], list]
"""(plan, parent common metadata, block size) -> one sliced metadata object per ubatch."""

FieldsReader = Callable[[Any, int], RequestFields]
"""(sliced metadata object, its real request count) -> the request-level fields it carries."""


@dataclass
class HookSession:
    """Per-runner state of the hook: where it runs, its groups, its evidence file, its step count."""

    ranks: StepRanks
    groups: Sequence[Any]
    splitter: Splitter
    read_fields: FieldsReader
    writer: EvidenceWriter | None = None
    check_agreement: bool = False
    agreement_device: Any = "cpu"
    steps_planned: int = field(default=0)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], *, ranks: StepRanks,
                         groups: Sequence[Any], splitter: Splitter,
                         read_fields: FieldsReader) -> HookSession:
        """Evidence on when ``AFD_EVIDENCE_DIR`` is set; agreement when ``AFD_SPLIT_DEBUG_AGREE=1``."""
        return cls(
            ranks=ranks,
            groups=groups,
            splitter=splitter,
            read_fields=read_fields,
            writer=EvidenceWriter.from_env(environ, ranks.label),
            check_agreement=agreement_enabled(environ),
        )


class PlannedUBatchSlices(list):
    """The plugin's ``UBatchSlices`` for a plan, carrying what the patched slicer needs."""

    def __init__(self, slices, *, plan: SplitPlan, parent: RequestFields, block_size: int,
                 session: HookSession) -> None:
        super().__init__(slices)
        self.plan = plan
        self.parent = parent
        self.block_size = block_size
        self.session = session

    def split(self, common_attn_metadata) -> list:
        """Per-stage metadata from afd_split's adapter, request-level checked (every step)."""
        stages = self.session.splitter(self.plan, common_attn_metadata, self.block_size)
        if len(stages) != len(self.plan.ubatches):
            raise ValueError(f"the adapter returned {len(stages)} stages for a plan of "
                             f"{len(self.plan.ubatches)} ubatches")
        read = self.session.read_fields
        check_engine_step(self.plan, self.parent, [
            read(stage, ubatch.request_slice.stop - ubatch.request_slice.start)
            for stage, ubatch in zip(stages, self.plan.ubatches, strict=True)
        ])
        return stages


def ubatch_slices_for(plan: SplitPlan, slice_type) -> list:
    """The plan's ubatches as the plugin's ``UBatchSlice(request_slice, token_slice)``."""
    return [slice_type(ubatch.request_slice, ubatch.token_slice) for ubatch in plan.ubatches]


def plan_stages(session: HookSession, num_scheduled_tokens, *, num_computed_tokens,
                query_start_loc, seq_lens, block_size: int,
                slice_type) -> PlannedUBatchSlices | None:
    """Plan one step for the runner; None when it runs unsplit (its line says why)."""
    plan = plan_engine_step(num_scheduled_tokens, policy=SplitPolicy.TOKEN_BALANCED,
                            constraints=HOOK_CONSTRAINTS,
                            num_computed_tokens=num_computed_tokens)
    if session.check_agreement:
        agree_across_groups(plan, session.groups, device=session.agreement_device)
    step = session.steps_planned
    session.steps_planned += 1
    if session.writer is not None:
        session.writer.append(step_record(plan, step=step, ranks=session.ranks, pid=os.getpid()))
    if not plan.is_split:
        return None
    parent = parent_request_fields(query_start_loc, seq_lens, num_computed_tokens,
                                   plan.num_requests)
    return PlannedUBatchSlices(ubatch_slices_for(plan, slice_type), plan=plan, parent=parent,
                               block_size=block_size, session=session)


def ascend_request_fields(stage, num_reqs: int) -> RequestFields:
    """Request-level host fields of an ``AscendCommonAttentionMetadata`` stage.

    ``query_start_loc_cpu``, ``seq_lens_cpu`` and ``num_computed_tokens_cpu``
    are fields of the class at vLLM-Ascend v0.19.1rc1 and v0.26.0rc (the pinned
    plugin passes all three to its constructor); speculative decoding, which
    would leave the CPU copies unset, is rejected by the validator seam.
    """
    return RequestFields(
        stage.query_start_loc_cpu[: num_reqs + 1].numpy(),
        stage.seq_lens_cpu[:num_reqs].numpy(),
        stage.num_computed_tokens_cpu[:num_reqs].numpy(),
    )


def positions_field_splitter(split_common_metadata) -> Splitter:
    """A ``Splitter`` over an adapter entry point ``(plan, common, positions, block_size)``.

    Ascend metadata carries its positions as a field, so the stage positions the
    adapter returns are written back into each stage object (a copy; the parent
    is never mutated).
    """
    def split(plan: SplitPlan, common, block_size: int) -> list:
        pairs = split_common_metadata(plan, common, common.positions, block_size)
        return [dataclasses.replace(stage, positions=positions) for stage, positions in pairs]

    return split


def ascend_splitter(*, chunked_prefill: bool) -> Splitter:
    """afd_split's vLLM-Ascend adapter as the hook's ``Splitter``.

    ``chunked_prefill`` is the engine's ``scheduler_config.enable_chunked_prefill``
    (it decides the stage ``attn_state``). The adapter slices the ``positions``
    field itself and runs its own request-level check on what it produced; no
    PCP stage builder is passed because the validator seam rejects PCP.
    """

    def split(plan: SplitPlan, common, block_size: int) -> list:
        from afd_split.adapters.ascend import split_ascend_common_metadata  # lazy: vllm_ascend

        pairs = split_ascend_common_metadata(plan, common, common.positions, block_size,
                                             chunked_prefill=chunked_prefill)
        return [stage for stage, _ in pairs]

    return split

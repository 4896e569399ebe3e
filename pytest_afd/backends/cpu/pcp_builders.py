"""The CPU PCP emulation's full-batch and stage builds, through upstream's builder buffers.

On every emulated rank, as the AFD runner does on hardware (afd-plugin
release/v0.19.1rc1 2f4f462 ``_build_attention_metadata_with_ubatches``; vllm-ascend
v0.19.1rc1 da421af ``NPUModelRunner._build_attention_metadata``): the full batch is
built with builder 0 of a two-builder attention group, its slots the PCP manager's
padded-slot buffer (``PaddedSlotBuffer``); then the stage build re-pads the full
batch's slots, pads each stage's slots in the same buffer (the plugin's stage
rebuild, which clones them) and builds stage ``i`` with builder ``i or 0``, inside
the same guard the hook uses (``builder_state``: builder bindings and buffer
contents preserved, stage views owned). The dense layers' KV is then written with
the full batch's slots read back from its built metadata after the stage builds
(``RankBuild.full_slots``), so a stage build that reaches them changes the logits.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from afd_split.engine.standin_builders import (
    PaddedSlotBuffer,
    StandInAttentionGroup,
    StandInMlaCpBuilder,
    StandInSfaCpBuilder,
)
from afd_split.engine.state import preserved_state
from afd_split.hook.glue.builder_state import (
    builder_state_targets,
    own_stage_views,
    stage_written_buffers,
)
from afd_split.pcp.stage import PcpStageTokens, ZigzagLayout
from afd_split.pcp.stage_metadata import stage_metadata_of_ranks

SFA_CP = "sfa_cp"
"""DeepSeek V3.2's builder (``AscendSFACPMetadataBuilder``): the CPU model's."""
MLA_CP = "mla_cp"
"""``AscendMlaCPMetadataBuilder`` (DeepSeek V3 without the indexer)."""
BUILDER_KINDS = (SFA_CP, MLA_CP)
NUM_METADATA_BUILDERS = 2
"""The plugin's ``_ensure_two_metadata_builders``: one per async-MoE stage."""
MAX_NUM_SEQS = 32
"""The recipe's Attention ``--max-num-seqs``; sizes the SFA-CP slot buffer."""


def _builder(kind: str, pcp: int, max_tokens: int, max_seqs: int):
    if kind == SFA_CP:
        return StandInSfaCpBuilder(max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs,
                                   pcp_size=pcp)
    if kind == MLA_CP:
        return StandInMlaCpBuilder(pcp_size=pcp)
    raise ValueError(f"builder kind {kind!r}; expected one of {BUILDER_KINDS}")


@dataclass
class PcpManagerBuffers:
    """The PCP manager's padded-slot buffer (``pcp_padded_slot_mapping_list``) that the
    builders view; one class for every rank and step (a class made per call grows the
    interpreter's subclass registry, which the soak gate reads as a leak)."""

    pad_buffer: PaddedSlotBuffer
    pcp_padded_slot_mapping_list: list = field(default_factory=list)


@dataclass
class RankPcpState:
    """One emulated rank's PCP manager buffer and attention group (persist across builds)."""

    pcp_manager: PcpManagerBuffers
    group: StandInAttentionGroup

    @classmethod
    def make(cls, kind: str, pcp: int, max_tokens: int, num_reqs: int = 0) -> RankPcpState:
        """``max_tokens``: the batch's global tokens (``max_num_batched_tokens``), ``max_num_seqs``
        the recipe's or the batch's requests if more; the padded buffer has
        ``max_tokens * pcp + 2 * pcp * max_num_seqs`` entries (``full_indices``)."""
        max_seqs = max(MAX_NUM_SEQS, num_reqs)
        pad_buffer = PaddedSlotBuffer(max_tokens * pcp + 2 * pcp * max_seqs)
        manager = PcpManagerBuffers(pad_buffer, [pad_buffer.buffer])
        builders = [_builder(kind, pcp, max_tokens, max_seqs)
                    for _ in range(NUM_METADATA_BUILDERS)]
        return cls(manager, StandInAttentionGroup(builders))


@dataclass
class RankBuild:
    """What one rank's full-batch and stage builds left: the full batch's metadata (read
    after the stage builds), its values before them, and each stage's metadata."""

    full: object
    before: dict
    stages: list = field(default_factory=list)

    @property
    def full_slots(self) -> np.ndarray:
        return self.full.slot_mapping.numpy()


def full_batch_fields(metadata) -> dict:
    """Copies of the full batch's slot mapping, positions and PCP metadata (compared
    bit for bit before and after the stage builds)."""
    pcp = metadata.prefill_context_parallel_metadata
    return {
        "slot_mapping": metadata.slot_mapping.clone(),
        "positions": metadata.positions.clone(),
        "pcp": dict(_array_copies(vars(pcp))),
    }


def _array_copies(fields: dict, prefix: str = ""):
    """``(name, copy)`` of every field; a dict's entries one by one (``kv_idx.<name>``), so
    an index list changed in place is seen (a copied dict would hold the same arrays)."""
    for name, value in fields.items():
        if isinstance(value, dict):
            yield from _array_copies(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", np.array(value, copy=True)


def changed_fields(before: dict, metadata) -> list[str]:
    """Names of the full batch's fields that differ from ``before`` (empty: bit-identical)."""
    now = full_batch_fields(metadata)
    changed = [name for name in ("slot_mapping", "positions")
               if before[name].shape != now[name].shape or not torch.equal(before[name],
                                                                           now[name])]
    changed += [f"pcp.{name}" for name, value in before["pcp"].items()
                if not np.array_equal(value, now["pcp"][name])]
    return changed


@dataclass(frozen=True)
class StepPcp:
    """One step's PCP layouts and metadata on every rank, made once per step for all ranks
    (each rank's arrays its own): the full batch's (``whole``: its global per-request
    counts) and each stage's, the stage ``PcpStageTokens`` scheduled alone."""

    layout: ZigzagLayout
    full: tuple  # per rank: PcpStageMetadata of the full batch
    stage_layouts: tuple[ZigzagLayout, ...]
    stages: tuple[tuple, ...]  # per stage, per rank
    unpad_mask: np.ndarray
    """``layout.unpad_mask``, derived once for every rank's builds (read only)."""
    stage_unpad_masks: tuple[np.ndarray, ...]
    """Each stage layout's ``unpad_mask``, derived once for every rank's builds (read only)."""

    @classmethod
    def make(cls, stages: list, computed: np.ndarray, pcp: int, layout: ZigzagLayout,
             stage_layouts: tuple[ZigzagLayout, ...]) -> StepPcp:
        """``layout`` / ``stage_layouts``: the zigzags the emulation already laid out; the
        metadata refuses any that is not of the pieces' counts."""
        full = PcpStageTokens(0, 0, 0, _whole_counts(stages), np.asarray(computed, dtype=np.int64))
        return cls(layout, stage_metadata_of_ranks(full, pcp, layout=layout), stage_layouts,
                   tuple(stage_metadata_of_ranks(stage, pcp, layout=stage_layout)
                         for stage, stage_layout in zip(stages, stage_layouts, strict=True)),
                   layout.unpad_mask, tuple(stage.unpad_mask for stage in stage_layouts))


def build_rank(state: RankPcpState, common, slots: np.ndarray, stage_commons: list,
               stages: list, step: StepPcp, pcp: int, rank: int) -> RankBuild:
    """The full batch, then the stages, on one rank (``stages``: ``PcpStageTokens``)."""
    layout = step.layout
    pad = state.pcp_manager.pad_buffer

    def full_common():
        full = copy.copy(common)
        # One per step, as the runner's PCP manager makes it; both full builds read it.
        full.prefill_context_parallel_metadata = step.full[rank]
        full.slot_mapping = pad.padded(layout.rows_per_rank, layout.rows_per_rank, pcp,
                                       step.unpad_mask, slots)
        return full

    built = RankBuild(state.group.get_metadata_builder(0).build(0, full_common()), {})
    built.before = full_batch_fields(built.full)
    builders = state.group.metadata_builders
    buffers = stage_written_buffers(builders, state.pcp_manager)
    with preserved_state(*builder_state_targets(builders, buffers)):
        full_common()  # the stage build's own _get_block_table_and_slot_mapping(0)
        for index, (stage_common, stage, stage_layout, unpad_mask) in enumerate(
                zip(stage_commons, stages, step.stage_layouts, step.stage_unpad_masks,
                    strict=True)):
            stage_cm = copy.copy(stage_common)
            stage_cm.prefill_context_parallel_metadata = step.stages[index][rank]
            stage_slots = slots[stage.token_start:stage.token_start + stage.num_tokens]
            stage_cm.slot_mapping = pad.padded(stage_layout.rows_per_rank,
                                               stage_layout.rows_per_rank, pcp,
                                               unpad_mask, stage_slots).clone()
            built.stages.append(state.group.get_metadata_builder(index or 0).build(0, stage_cm))
        own_stage_views(built.stages, buffers)
    return built


def _whole_counts(stages: list) -> np.ndarray:
    """The global per-request counts from the stage pieces (a cut request's pieces summed)."""
    counts: dict[int, int] = {}
    for stage in stages:
        for offset, tokens in enumerate(stage.num_scheduled_tokens):
            request = stage.request_start + offset
            counts[request] = counts.get(request, 0) + int(tokens)
    return np.array([counts[r] for r in sorted(counts)], dtype=np.int64)


def logical_slots(layout, padded_slots: np.ndarray, unpad_mask: np.ndarray | None = None
                  ) -> np.ndarray:
    """The real tokens' slots in logical order from a padded all-gather slot array
    (``unpad_mask``: ``layout.unpad_mask`` where the caller already derived it)."""
    mask = layout.unpad_mask if unpad_mask is None else unpad_mask
    return np.asarray(padded_slots)[:int(layout.padded_tokens.sum())][mask]


def full_batch_problems(emulation, metadata) -> list[str]:
    """After ``emulation.kernel_metadata`` ran: every rank's full batch compared with its
    values before the stage builds, and (SFA-CP) its real tokens' slots with the batch's
    own slots (``metadata.slot_mapping``, an independent reference). Empty: kept."""
    problems = []
    if not emulation.rank_builds:
        return ["no rank built the full batch"]
    for rank, build in enumerate(emulation.rank_builds):
        problems += [f"rank {rank}: the full batch's {name} changed across the stage builds"
                     for name in changed_fields(build.before, build.full)]
        if emulation.builder_kind == SFA_CP:
            lost = np.flatnonzero(logical_slots(emulation.parent, build.full_slots)
                                  != np.asarray(metadata.slot_mapping))
            if len(lost):
                problems.append(f"rank {rank}: {len(lost)} real tokens of the full batch lost "
                                f"their slot (first at token {int(lost[0])})")
    return problems

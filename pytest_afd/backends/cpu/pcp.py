"""The CPU backend's PCP emulation: every rank of a split step, through the engine's PCP glue.

One process stands for the ``pcp_size`` ranks, and the split runs the code the
AFD-plugin hook runs on each Attention rank under PCP:

* rows (``afd_split.pcp.relayout``): every rank's rows of the whole batch (one
  zigzag per whole request, as the runner lays them out) move to each stage's own
  zigzag (``relay_all_ranks``; the all-gather is the ranks' contributions
  concatenated), each stage's rows are all-gathered and put back in padded
  request order with the stage's restore index, which is what the CPU model runs;
  its outputs go the opposite way (``restore_all_ranks``, then the whole batch's
  restore index and unpad mask, as the runner's final PCP restore);
* metadata (``afd_split.engine.ascend_pcp.pcp_stage_metadata``): every rank's
  vLLM-Ascend v0.19.1rc1 metadata of the batch, filled as the runner fills it
  under PCP, is built per stage for the relaid rows; the ubatch the CPU kernels
  read takes its computed tokens, block table rows and positions (all ranks'
  relaid positions, restored) from there.

So a wrong map, position or computed count in the glue changes the logits the
gates compare. Every rank also builds the full batch and the stages through the
pinned builders' persistent buffers (``pcp_builders``); the dense layers write
their KV with the full batch's slots read back after the stage builds
(``dense_kernels``), so a stage build that leaks into the full batch changes them. The slots the plugin's stage rebuild regenerates on hardware come
from the plan's split here (the CPU has no PCP helper).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from afd_split import SplitInvariantError
from afd_split.checks.metadata import BatchMetadata, split_metadata
from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.engine.ascend_pcp import PCP_LAYOUT_TAG, pcp_stage_metadata
from afd_split.engine.standins import attn_state_enum, standin_class
from afd_split.pcp.relayout import all_rank_relayouts, relay_all_ranks, restore_all_ranks
from afd_split.pcp.rows import rank_rows
from afd_split.pcp.stage import rank_positions, stage_tokens, zigzag_layout
from afd_split.plan.constraints import MIN_PCP_FOR_ZIGZAG
from pytest_afd.backends.cpu.pcp_builders import (
    SFA_CP,
    RankPcpState,
    StepPcp,
    build_rank,
    logical_slots,
)

PCP_ENGINE_LAYOUT = next(layout for layout in ASCEND_LAYOUTS if layout.version == PCP_LAYOUT_TAG)
"""vLLM-Ascend v0.19.1rc1: the one pinned layout with PCP on model runner v1."""


def pcp_enabled(plan) -> bool:
    return plan is not None and plan.constraints.pcp_size >= MIN_PCP_FOR_ZIGZAG


class PcpEmulation:
    """One PCP split step on every rank: the layouts and each rank's relayout."""

    def __init__(self, plan, metadata: BatchMetadata, builder_kind: str = SFA_CP) -> None:
        self.plan = plan
        self.builder_kind = builder_kind
        self.rank_builds: list = []
        """Every rank's full-batch and stage builds (``pcp_builders.RankBuild``)."""
        self.dense_kernels: list = []
        """Per ubatch, its kernel metadata with the full batch's slots read back after the
        stage builds: what the dense layers write KV with (the full batch's metadata)."""
        self.pcp = plan.constraints.pcp_size
        self.computed = np.asarray(metadata.num_computed_tokens, dtype=np.int64)
        self.parent = zigzag_layout(np.asarray(plan.token_counts, dtype=np.int64), self.pcp)
        self.stage_pieces = stage_tokens(plan, self.computed)
        """Each stage's request pieces (``PcpStageTokens``), made once for the whole step."""
        # Each stage's own zigzag: ``stage.stage_rows(plan, computed, pcp).stages``.
        self.stages = tuple(zigzag_layout(stage.num_scheduled_tokens, self.pcp)
                            for stage in self.stage_pieces)
        self.relayouts = all_rank_relayouts(plan, self.computed)
        # Read by every rank, every stage and every move of the step: derived once.
        self._restore = [torch.from_numpy(layout.allgather_restore_idx) for layout in self.stages]
        self._unpad = [torch.from_numpy(layout.unpad_mask) for layout in self.stages]
        self._real_rows = [torch.from_numpy(np.array(ubatch.real_row_indices, dtype=np.int64))
                           for ubatch in plan.ubatches]
        self._shared = None
        """(metadata, what every rank's ``engine_common`` shares) of this step."""

    def _gathered(self, per_rank_rows, index: int):
        """Stage ``index``'s real rows in logical order from every rank's rows of the stage:
        the PCP all-gather, the stage's restore index, its unpad mask."""
        gathered = torch.cat(list(per_rank_rows))
        return gathered[self._restore[index]][self._unpad[index]]

    def stage_inputs(self, logical_rows, pad_value) -> list:
        """Each ubatch's planner rows (``gather_ubatch_rows`` layout) of ``logical_rows`` [T, ...],
        as the stage's ranks hold them after the relayout and its all-gather."""
        parent = [rank_rows(self.parent, rank, logical_rows, pad_value)
                  for rank in range(self.pcp)]
        relaid = relay_all_ranks(self.relayouts, parent)
        inputs = []
        row_slices = self.relayouts[0].stage_row_slices
        for index, ubatch in enumerate(self.plan.ubatches):
            out = logical_rows.new_full((ubatch.num_rows, *logical_rows.shape[1:]), pad_value)
            rows = row_slices[index]
            out[self._real_rows[index]] = self._gathered([stage[rows] for stage in relaid], index)
            inputs.append(out)
        return inputs

    def merged(self, stage_outputs: list):
        """The logical rows [T, ...] from each ubatch's output rows, back through every rank's
        relaid rows, the restore to the parent's rows and the whole batch's restore."""
        real_outputs = [output[real] for output, real in zip(stage_outputs, self._real_rows,
                                                              strict=True)]
        per_rank = []
        for rank in range(self.pcp):
            per_rank.append(torch.cat([
                rank_rows(layout, rank, output)
                for layout, output in zip(self.stages, real_outputs, strict=True)]))
        parent = restore_all_ranks(self.relayouts, per_rank)
        gathered = torch.cat(parent)[torch.from_numpy(self.parent.allgather_restore_idx)]
        return gathered[torch.from_numpy(self.parent.unpad_mask)]

    def engine_common(self, metadata: BatchMetadata, rank: int):
        """Rank ``rank``'s v0.19.1rc1 metadata of the whole batch, as the runner fills it under
        PCP: its rows per request, their positions, computed tokens plus rows as seq_lens.
        Every rank's tensors are its own (copies of the step's rank-invariant arrays)."""
        shared = self._rank_invariant(metadata)
        rows = self.parent.rank_tokens
        positions = rank_positions(rows, self.computed, shared["decode"], self.pcp, rank)
        qsl, seq_lens = shared["qsl"], shared["seq_lens"]
        return standin_class(PCP_ENGINE_LAYOUT)(
            query_start_loc=torch.from_numpy(qsl.copy()),
            query_start_loc_cpu=torch.from_numpy(qsl.copy()),
            seq_lens=torch.from_numpy(seq_lens.copy()),
            _seq_lens_cpu=torch.from_numpy(seq_lens.copy()),
            seq_lens_cpu=torch.from_numpy(seq_lens.copy()),
            num_computed_tokens_cpu=torch.from_numpy(shared["computed"].copy()),
            num_reqs=len(rows), num_actual_tokens=shared["num_tokens"],
            max_query_len=shared["max_query_len"], max_seq_len=shared["max_seq_len"],
            block_table_tensor=torch.from_numpy(shared["block_table"].copy()),
            slot_mapping=torch.from_numpy(shared["slot_mapping"].copy()),
            num_input_tokens=shared["num_tokens"], positions=torch.from_numpy(positions),
            attn_state=shared["attn_state"],
        )

    def _rank_invariant(self, metadata: BatchMetadata) -> dict:
        """What every rank's ``engine_common`` shares, derived once per step and metadata."""
        if self._shared is not None and self._shared[0] is metadata:
            return self._shared[1]
        rows = self.parent.rank_tokens
        seq_lens = (self.computed + rows).astype(np.int32)
        states = attn_state_enum(PCP_ENGINE_LAYOUT)
        shared = {
            "qsl": np.concatenate([[0], np.cumsum(rows)]).astype(np.int32),
            "seq_lens": seq_lens,
            "computed": self.computed.astype(np.int32),
            "decode": np.arange(len(rows)) < self.parent.num_decode_reqs,
            "num_tokens": int(rows.sum()),
            "max_query_len": int(np.max(self.plan.token_counts)),
            "max_seq_len": int(seq_lens.max()),
            # torch.tensor(..., dtype=int32 / int64) of the batch's arrays, as numpy.
            "block_table": torch.tensor(np.asarray(metadata.block_table),
                                        dtype=torch.int32).numpy(),
            "slot_mapping": torch.tensor(np.asarray(metadata.slot_mapping),
                                         dtype=torch.int64).numpy(),
            "attn_state": states.ChunkedPrefill if self.computed.any() else states.PrefillNoCache,
        }
        self._shared = (metadata, shared)
        return shared

    def kernel_metadata(self, metadata: BatchMetadata, *, chunked_prefill: bool) -> list:
        """The ubatches the CPU kernels run: the plan's split, with computed tokens, block
        table rows and positions taken from every rank's stage metadata built by the glue
        (``pcp_stage_metadata``), which must agree across ranks."""
        per_rank, self.rank_builds = [], []
        stages = self.stage_pieces
        step = StepPcp.make(list(stages), self.computed, self.pcp, self.parent, self.stages)
        slots = np.asarray(metadata.slot_mapping, dtype=np.int64)
        for rank, relayout in enumerate(self.relayouts):
            positions = torch.from_numpy(relayout.stage_positions)
            common = self.engine_common(metadata, rank)
            per_rank.append(pcp_stage_metadata(self.plan, common, self.computed, relayout,
                                               positions, chunked_prefill=chunked_prefill))
            state = RankPcpState.make(self.builder_kind, self.pcp, self.plan.num_tokens,
                                      len(self.plan.token_counts))
            self.rank_builds.append(build_rank(state, common, slots, per_rank[-1], list(stages),
                                               step, self.pcp, rank))
        full_slots = _agreed([logical_slots(self.parent, build.full_slots, step.unpad_mask)
                              for build in self.rank_builds], "full-batch slots", -1)
        parts = split_metadata(self.plan, metadata)
        kernels, self.dense_kernels = [], []
        for index, (part, stage) in enumerate(zip(parts, stages, strict=True)):
            built = [stages[index] for stages in per_rank]
            computed = _agreed([b._seq_lens_cpu.numpy().astype(np.int64)
                                - np.diff(b.query_start_loc_cpu.numpy().astype(np.int64))
                                for b in built], "computed tokens", index)
            table = _agreed([b.block_table_tensor.numpy() for b in built], "block table", index)
            positions = self._gathered([b.positions for b in built], index)
            query = np.diff(np.asarray(part.query_start_loc))
            kernels.append(BatchMetadata(
                query_start_loc=part.query_start_loc, seq_lens=computed + query,
                num_computed_tokens=computed, slot_mapping=part.slot_mapping,
                block_table=table.astype(np.int64),
                positions=positions.numpy()[:stage.num_tokens], block_size=metadata.block_size))
            self.dense_kernels.append(dataclasses.replace(
                kernels[-1], slot_mapping=full_slots[stage.token_start:
                                                     stage.token_start + stage.num_tokens]))
        return kernels


def _agreed(values: list, name: str, index: int) -> np.ndarray:
    first = values[0]
    for rank, value in enumerate(values[1:], start=1):
        if not np.array_equal(value, first):
            raise SplitInvariantError(f"stage {index}: PCP rank {rank}'s {name} {value.tolist()} "
                                      f"differs from rank 0's {first.tolist()}")
    return first

"""What vLLM-Ascend v0.19.1rc1's model runner holds for a prefill batch under PCP, on one rank.

Facts read at vllm-project/vllm-ascend tag v0.19.1rc1, commit da421afad719,
``vllm_ascend/worker/model_runner_v1.py`` and ``vllm_ascend/worker/pcp_utils.py``:

* ``_prepare_inputs``: the slot mapping is computed from the global (pre-PCP)
  positions; ``PCPManager.update_tokens_for_pcp`` then turns the scheduled counts
  into this rank's rows per request (padded to 2 * pcp, over pcp; a leading
  one-token request is a decode, its token on every rank) and this rank's
  positions (computed tokens plus the row's offset in its padded request; a
  decode's own index); ``query_start_loc`` is their cumulative sum and
  ``optimistic_seq_lens_cpu`` / ``seq_lens`` are computed tokens plus the rank rows.
* ``execute_model`` takes ``max_query_len`` from the global counts before
  ``_prepare_inputs``; ``_build_attn_state`` judges the global counts.
* ``_build_attention_metadata`` (no SP, no graph): ``num_actual_tokens`` and
  ``num_input_tokens`` are the rank's rows, ``max_seq_len`` the largest optimistic
  seq_len, ``slot_mapping`` the global slots placed at the unpad mask
  (``get_padded_slot_mapping``), ``positions`` the runner's positions buffer,
  ``actual_seq_lengths_q`` empty, ``decode_token_per_req`` 1.

The rank layout comes from ``tests/afd_split/pcp_helper_reference.py`` (plain
per-request Python), so it shares no code with ``afd_split``. Used as "the
stage scheduled alone": a split stage built by afd_split must equal this for the
stage's pieces (a cut request's tail with its computed tokens advanced).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from afd_split import BatchMetadata
from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.engine.standins import attn_state_enum, standin_class
from tests.afd_split.pcp_helper_reference import helper_layout, helper_metadata

VLLM_ASCEND_TAG = "v0.19.1rc1"
LAYOUT = next(layout for layout in ASCEND_LAYOUTS if layout.version == VLLM_ASCEND_TAG)
POSITIONS_BUFFER_SLACK = 7
"""The runner's positions buffer is longer than the batch (``self.positions`` is passed whole)."""


@dataclass(frozen=True)
class RunnerBatch:
    """One rank's view of a batch: the runner's metadata and what it was built from."""

    common: object
    rank_rows: list  # rows of every request on every rank
    positions: np.ndarray  # this rank's rows' positions
    global_slots: np.ndarray  # the logical-order slot mapping (pre-PCP)


def rank_positions(scheduled, computed, pcp, rank) -> tuple[list, np.ndarray]:
    """(rows per request, this rank's rows' positions) by the helper's layout."""
    layout = helper_layout(list(scheduled), pcp)
    offsets, rows = layout["rank_rows"][rank], layout["rank_tokens"]
    decodes = 0
    for n in scheduled:
        if n > 1:
            break
        decodes += 1
    positions, row, padded_start = [], 0, 0
    for index, (n, local) in enumerate(zip(scheduled, rows, strict=True)):
        for j in range(local):
            offset = offsets[row + j] - padded_start
            positions.append(computed[index] + (j if index < decodes else offset))
        row += local
        padded_start += n * pcp if index < decodes else local * pcp
    return list(rows), np.array(positions, dtype=np.int64)


def attn_state(scheduled, computed, *, chunked_prefill: bool):
    """``_build_attn_state`` without speculation, on global counts."""
    states = attn_state_enum(LAYOUT)
    if not any(computed):
        return states.PrefillNoCache
    if all(n == 1 for n in scheduled):
        return states.DecodeOnly
    return states.ChunkedPrefill if chunked_prefill else states.PrefillCacheHit


def _table_tensor(table) -> torch.Tensor:
    if isinstance(table, torch.Tensor):
        return table.to(torch.int32)
    return torch.from_numpy(np.array(table, dtype=np.int32))


def runner_batch(scheduled, computed, pcp: int, rank: int, *, block_size: int,
                 chunked_prefill: bool = False, block_table=None,
                 global_slots=None) -> RunnerBatch:
    """The runner's v0.19.1rc1 ``AscendCommonAttentionMetadata`` on PCP rank ``rank``.

    ``block_table`` / ``global_slots`` default to a fresh batch's (``BatchMetadata``);
    a stage passes its requests' rows of the parent's and its tokens' slots.
    """
    scheduled, computed = list(map(int, scheduled)), list(map(int, computed))
    meta = BatchMetadata.from_requests(scheduled, computed, block_size=block_size)
    table = meta.block_table if block_table is None else block_table
    slots = meta.slot_mapping if global_slots is None else np.asarray(global_slots)
    rows, positions = rank_positions(scheduled, computed, pcp, rank)
    qsl = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    seq_lens = (np.array(computed) + np.array(rows)).astype(np.int32)
    unpad = helper_layout(scheduled, pcp)["unpad_mask"]
    padded_slots = np.full(len(unpad), -1, dtype=np.int64)
    padded_slots[np.array(unpad, dtype=bool)] = slots
    buffer = np.concatenate([positions, np.zeros(POSITIONS_BUFFER_SLACK, np.int64)])
    common = standin_class(LAYOUT)(
        query_start_loc=torch.from_numpy(qsl.copy()),
        query_start_loc_cpu=torch.from_numpy(qsl.copy()),
        seq_lens=torch.from_numpy(seq_lens.copy()),
        _seq_lens_cpu=torch.from_numpy(seq_lens.copy()),
        seq_lens_cpu=torch.from_numpy(seq_lens.copy()),
        num_computed_tokens_cpu=torch.tensor(computed, dtype=torch.int32),
        num_reqs=len(scheduled),
        num_actual_tokens=int(sum(rows)),
        max_query_len=max(scheduled),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=_table_tensor(table),
        slot_mapping=torch.from_numpy(padded_slots),
        causal=True,
        num_input_tokens=int(sum(rows)),
        actual_seq_lengths_q=[],
        positions=torch.from_numpy(buffer),
        attn_state=attn_state(scheduled, computed, chunked_prefill=chunked_prefill),
        decode_token_per_req=1,
        prefill_context_parallel_metadata=SimpleNamespace(
            **helper_metadata(scheduled, computed, pcp, rank)),
    )
    return RunnerBatch(common, rows, positions, np.asarray(slots))

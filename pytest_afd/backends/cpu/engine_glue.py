"""The CPU backend's split through the engine glue: engine-layout metadata, the hook's adapters,
the per-step checks on what was produced, then the ubatches the CPU kernels read.

One path: where the AFD-plugin hook hands ``CommonAttentionMetadata`` to
afd_split's adapters, the CPU backend does the same with an engine-layout
object built from its ``BatchMetadata`` (a structural stand-in of the pinned
class, :mod:`afd_split.engine.standins`, filled as the model runner fills
the real one: int32 device fields, host copies, slot_mapping, block table).

* ``vllm`` layout (vLLM 0.19.1 ``CommonAttentionMetadata``): split with
  ``afd_split.engine.vllm.split_common_metadata``, the vLLM adapter's entry
  point (the in-process executor, a vLLM GPU model runner's stand-in).
* ``ascend`` layout (vLLM-Ascend v0.26.0rc ``AscendCommonAttentionMetadata``):
  split through the hook's own seam, ``stages.PlannedUBatchSlices.split`` with
  ``stages.ascend_splitter`` (the AFD runtime's Attention ranks, the Ascend
  Attention worker's stand-in).

Each adapter runs its own request-level check on what it produced. Then the
backend reads the produced ubatches back and runs ``check_engine_step`` with
those ``parts`` twice: on the host copies (``*_cpu`` fields, what the check on
hardware reads) and on the fields the kernels read (device ``query_start_loc``
and ``seq_lens``). What the CPU model runs is built from those kernel fields,
so a slicing bug in the adapter reaches the outputs and the gates' checker.

A plan with ``pcp_size > 1`` goes through the hook's PCP glue instead
(``pcp.PcpEmulation``): every emulated rank's v0.19.1rc1 metadata built per
relaid stage by ``afd_split.engine.ascend_pcp``, whose computed tokens, block
table rows and positions the kernels read.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch

from afd_split import SplitPlan
from afd_split.checks.metadata import BatchMetadata
from afd_split.checks.requests import RequestFields
from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.engine.standins import attn_state_enum, standin_class
from afd_split.engine.vllm import VLLM_LAYOUTS, split_common_metadata
from afd_split.hook.planning.engine_step import StepRanks, check_engine_step
from afd_split.hook.planning.stages import (
    HookSession,
    PlannedUBatchSlices,
    ascend_splitter,
    ubatch_slices_for,
)
from pytest_afd.backends.cpu.pcp import PcpEmulation, pcp_enabled

VLLM_ENGINE_LAYOUT = "vllm"
ASCEND_ENGINE_LAYOUT = "ascend"
ENGINE_LAYOUTS = {
    VLLM_ENGINE_LAYOUT: VLLM_LAYOUTS[0],  # vLLM 0.19.1: _seq_lens_cpu / _num_computed_tokens_cpu
    ASCEND_ENGINE_LAYOUT: ASCEND_LAYOUTS[-1],  # vLLM-Ascend v0.26.0rc
}
"""The pinned layout each CPU engine path builds (see the module docstring)."""

HOST_COPIES = {
    VLLM_ENGINE_LAYOUT: (("query_start_loc_cpu", "_seq_lens_cpu", "_num_computed_tokens_cpu"),),
    ASCEND_ENGINE_LAYOUT: (
        ("query_start_loc_cpu", "_seq_lens_cpu", "_num_computed_tokens_cpu"),
        ("query_start_loc_cpu", "seq_lens_cpu", "num_computed_tokens_cpu"),
    ),
}
"""Per layout, each (query_start_loc, seq_lens, computed) set of host copies the backend
sets on the parent and reads back from every produced ubatch."""

PADDED_ROWS = {VLLM_ENGINE_LAYOUT: False, ASCEND_ENGINE_LAYOUT: True}
"""Token fields of a produced ubatch hold its padding rows too (Ascend: stage-local rows)."""

CHUNKED_PREFILL = True
"""``scheduler_config.enable_chunked_prefill`` of the emulated engine (vLLM V1's default).
The CPU attention ignores ``attn_state``; the Ascend adapter recomputes it from this."""

CPU_HOOK_RANKS = StepRanks(global_rank=0)

UBatchSlice = namedtuple("UBatchSlice", ("request_slice", "token_slice"))
"""The plugin's ``UBatchSlice(request_slice, token_slice)`` (the plugin is not installed)."""


def _device(array, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor(np.asarray(array), dtype=dtype)  # a copy: the parent stays read-only


def engine_common(metadata: BatchMetadata, layout_name: str):
    """(engine-layout parent, positions) for ``metadata``, filled as the model runner does."""
    layout = ENGINE_LAYOUTS[layout_name]
    qsl, seq_lens = metadata.query_start_loc, metadata.seq_lens
    computed = metadata.num_computed_tokens
    positions = _device(metadata.positions, torch.int64)
    values = {
        "query_start_loc": _device(qsl),
        "query_start_loc_cpu": _device(qsl),
        "seq_lens": _device(seq_lens),
        "num_reqs": metadata.num_reqs,
        "num_actual_tokens": metadata.num_tokens,
        "max_query_len": metadata.max_query_len,
        "max_seq_len": metadata.max_seq_len,
        "block_table_tensor": _device(metadata.block_table),
        "slot_mapping": _device(metadata.slot_mapping, torch.int64),
        "is_prefilling": torch.ones(metadata.num_reqs, dtype=torch.bool),
        "_seq_lens_cpu": _device(seq_lens),
        "_num_computed_tokens_cpu": _device(computed),
    }
    if layout_name == ASCEND_ENGINE_LAYOUT:
        states = attn_state_enum(layout)
        values.update(
            seq_lens_cpu=_device(seq_lens),
            num_computed_tokens_cpu=_device(computed),
            positions=positions,
            positions_cpu=positions.clone(),
            actual_seq_lengths_q=qsl[1:].tolist(),
            num_input_tokens=metadata.num_tokens,
            attn_state=states.ChunkedPrefill if computed.any() else states.PrefillNoCache,
        )
    return standin_class(layout)(**values), positions


def adapter_split(plan: SplitPlan, common, positions, block_size: int, layout_name: str):
    """Per-ubatch ``(engine metadata, positions)`` from the adapter entry point of the layout."""
    if layout_name == VLLM_ENGINE_LAYOUT:
        return split_common_metadata(plan, common, positions, block_size)
    session = HookSession(ranks=CPU_HOOK_RANKS, groups=(),
                          splitter=ascend_splitter(chunked_prefill=CHUNKED_PREFILL))
    slices = PlannedUBatchSlices(ubatch_slices_for(plan, UBatchSlice), plan=plan,
                                 block_size=block_size, session=session)
    return [(stage, stage.positions) for stage in slices.split(common)]


def _host(tensor) -> np.ndarray:
    return np.asarray(tensor.numpy() if isinstance(tensor, torch.Tensor) else tensor)


def host_copies(stage, names: tuple[str, str, str]) -> RequestFields:
    """One set of a produced ubatch's host copies, read back (query_start_loc, seq_lens, computed)."""
    return RequestFields(*(_host(getattr(stage, name)) for name in names))


def kernel_metadata(stage, stage_positions, ubatch, block_size: int, *,
                    padded_rows: bool) -> BatchMetadata:
    """The ubatch as the kernels read it: device query_start_loc, seq_lens, slots, block table,
    positions (computed tokens are seq_len - query_len, as the attention backends derive them)."""
    num_reqs = stage.num_reqs
    qsl = _host(stage.query_start_loc)[: num_reqs + 1]
    seq_lens = _host(stage.seq_lens)[:num_reqs]
    slots = _host(stage.slot_mapping)
    rows = np.asarray(ubatch.real_row_indices) if padded_rows else slice(None)
    return BatchMetadata(
        query_start_loc=qsl,
        seq_lens=seq_lens,
        num_computed_tokens=seq_lens.astype(np.int64) - np.diff(qsl.astype(np.int64)),
        slot_mapping=slots[rows],
        block_table=_host(stage.block_table_tensor)[:num_reqs],
        positions=_host(stage_positions)[..., rows],
        block_size=block_size,
    )


def split_engine_metadata(plan: SplitPlan, metadata: BatchMetadata, *,
                          layout_name: str = VLLM_ENGINE_LAYOUT,
                          pcp_emulation: PcpEmulation | None = None) -> list[BatchMetadata]:
    """The ubatches the CPU kernels run for ``plan``, split by the engine glue and checked.

    Raises what the adapter raises (``UnsupportedSplitError``, ``ValueError``,
    ``SplitInvariantError``) and ``SplitInvariantError`` when the read-back
    host copies or kernel fields break the split. PCP plans: the PCP glue on every
    emulated rank (``pcp_emulation``, made here when not given).
    """
    if pcp_enabled(plan):
        emulation = pcp_emulation or PcpEmulation(plan, metadata)
        kernels = emulation.kernel_metadata(metadata, chunked_prefill=CHUNKED_PREFILL)
        check_engine_step(plan, RequestFields.of(metadata),
                          [RequestFields.of(part) for part in kernels])
        return kernels
    common, positions = engine_common(metadata, layout_name)
    pairs = adapter_split(plan, common, positions, metadata.block_size, layout_name)
    parent = RequestFields.of(metadata)
    for names in HOST_COPIES[layout_name]:
        check_engine_step(plan, parent, [host_copies(stage, names) for stage, _ in pairs])
    kernels = [
        kernel_metadata(stage, stage_positions, ubatch, metadata.block_size,
                        padded_rows=PADDED_ROWS[layout_name])
        for ubatch, (stage, stage_positions) in zip(plan.ubatches, pairs, strict=True)
    ]
    check_engine_step(plan, parent, [RequestFields.of(part) for part in kernels])
    return kernels

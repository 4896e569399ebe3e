"""Real-layout common metadata for engine_path_bench, and the plugin-style per-field slicing.

The object is vLLM's own ``CommonAttentionMetadata`` when vLLM imports (its
pinned layout is matched by afd_split's adapter), else a structural stand-in
of vLLM-Ascend v0.19.1rc1's ``AscendCommonAttentionMetadata`` made from the
pinned field list (required fields, defaults and the AscendAttentionState
values recorded there). Tensors are CPU torch tensors shaped as the runners
hold them (int32 request arrays, int64 slot_mapping and positions).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from afd_split.engine.layout import PinnedLayout, load_layout, match_layout
from afd_split.engine.standins import standin_class

ASCEND_STANDIN = "vllm-ascend-v0.19.1rc1"

REQUEST_INDEXED = ("seq_lens", "_seq_lens_cpu", "seq_lens_cpu", "seq_lens_cpu_upper_bound",
                   "_num_computed_tokens_cpu", "num_computed_tokens_cpu", "block_table_tensor",
                   "is_prefilling")
"""Request-indexed fields the plugin's _make_metadata_with_slice slices (when present, set)."""

TOKEN_INDEXED = ("slot_mapping", "positions", "positions_cpu")
"""Token-indexed fields it slices by the stage's token slice."""


@dataclass(frozen=True)
class StandInUBatchSlice:
    """vLLM's UBatchSlice fields, for runs without vLLM."""

    request_slice: slice
    token_slice: slice


@dataclass
class LayoutBatch:
    layout: PinnedLayout
    common: Any
    positions: torch.Tensor
    splitter: Any  # None: the hook's Ascend splitter
    slice_type: type


STANDIN_SUFFIX = "-standin"
ASCEND_STANDINS = ("vllm-ascend-v0.19.1rc1", "vllm-ascend-v0.26.0rc")
VLLM_STANDIN = "vllm-0.19.1"
"""Measured without vLLM installed: its pinned layout as a stand-in class."""


def layout_kind_here() -> str:
    """``vllm-<version>`` when vLLM imports, else the Ascend stand-in."""
    if importlib.util.find_spec("vllm") is None:
        return f"{ASCEND_STANDIN}{STANDIN_SUFFIX}"
    import vllm

    return f"vllm-{vllm.__version__}"


def layout_kinds_here() -> list[str]:
    """Every layout this environment measures: the real vLLM class where vLLM imports (else
    its 0.19.1 stand-in), then both vLLM-Ascend stand-ins."""
    if importlib.util.find_spec("vllm") is None:
        first = f"{VLLM_STANDIN}{STANDIN_SUFFIX}"
    else:
        first = layout_kind_here()
    return [first, *(f"{name}{STANDIN_SUFFIX}" for name in ASCEND_STANDINS)]


def _values(layout: PinnedLayout, lengths: np.ndarray, computed: np.ndarray, block_size: int):
    qsl = np.concatenate([[0], np.cumsum(lengths)])
    seq_lens = computed + lengths
    blocks = -(-seq_lens // block_size)
    table = np.zeros((lengths.size, int(blocks.max())), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    for row, (start, count) in enumerate(zip(starts, blocks, strict=True)):
        table[row, :count] = np.arange(start, start + count)
    token_request = np.repeat(np.arange(lengths.size), lengths)
    positions = np.arange(int(qsl[-1])) - np.repeat(qsl[:-1], lengths) + computed[token_request]
    slots = table[token_request, positions // block_size] * block_size + positions % block_size

    def i32(array):
        return torch.from_numpy(np.asarray(array)).to(torch.int32)

    def i64(array):
        return torch.from_numpy(np.asarray(array, dtype=np.int64))

    values = {
        "query_start_loc": i32(qsl), "query_start_loc_cpu": i32(qsl), "seq_lens": i32(seq_lens),
        "num_reqs": int(lengths.size), "num_actual_tokens": int(qsl[-1]),
        "max_query_len": int(lengths.max()), "max_seq_len": int(seq_lens.max()),
        "block_table_tensor": i32(table), "slot_mapping": i64(slots),
    }
    optional = {
        "_seq_lens_cpu": i32(seq_lens), "seq_lens_cpu": i32(seq_lens),
        "seq_lens_cpu_upper_bound": i32(seq_lens), "_num_computed_tokens_cpu": i32(computed),
        "num_computed_tokens_cpu": i32(computed), "positions": i64(positions),
        "num_input_tokens": int(qsl[-1]),
    }
    values.update({name: value for name, value in optional.items() if name in layout.field_set})
    return values, i64(positions)


def _vllm_splitter(positions):
    from afd_split.engine.vllm import split_common_metadata

    def splitter(plan, common, block):
        return [stage for stage, _ in split_common_metadata(plan, common, positions, block)]

    return splitter


def build_layout_batch(kind: str, lengths: np.ndarray, computed: np.ndarray,
                       block_size: int) -> LayoutBatch:
    """The batch as ``kind``'s class holds it: ``<pinned layout>-standin`` (a structural
    stand-in of that layout) or ``vllm-<version>`` (the installed vLLM's own class)."""
    if kind.endswith(STANDIN_SUFFIX):
        layout = load_layout(kind.removesuffix(STANDIN_SUFFIX))
        values, positions = _values(layout, lengths, computed, block_size)
        if "attn_state" not in layout.field_set:  # a vLLM layout: the vLLM adapter
            return LayoutBatch(layout, standin_class(layout)(**values), positions,
                               _vllm_splitter(positions), StandInUBatchSlice)
        states = enum.Enum("AscendAttentionState", dict(layout.extra["attn_state_enum"]))
        values["attn_state"] = states.ChunkedPrefill
        return LayoutBatch(layout, standin_class(layout)(**values), positions, None,
                           StandInUBatchSlice)
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    from afd_split.engine.vllm import VLLM_LAYOUTS, common_attention_metadata_type

    cls = common_attention_metadata_type()
    layout = match_layout(cls, VLLM_LAYOUTS)
    values, positions = _values(layout, lengths, computed, block_size)
    return LayoutBatch(layout, cls(**values), positions, _vllm_splitter(positions), UBatchSlice)


def plugin_style_slice(batch: LayoutBatch, request_slice: slice, token_slice: slice):
    """One stage as the plugin's _make_metadata_with_slice builds it, for a boundary cut."""
    common = batch.common
    fields = batch.layout.field_set
    start, stop = request_slice.start, request_slice.stop
    qsl_cpu = common.query_start_loc_cpu[start : stop + 1] - common.query_start_loc_cpu[start]
    values = {
        "query_start_loc": common.query_start_loc[start : stop + 1] - common.query_start_loc[start],
        "query_start_loc_cpu": qsl_cpu,
    }
    for name in REQUEST_INDEXED:
        if name in fields and getattr(common, name) is not None:
            values[name] = getattr(common, name)[request_slice]
    for name in TOKEN_INDEXED:
        if name in fields and getattr(common, name) is not None:
            values[name] = getattr(common, name)[token_slice]
    # The plugin reads the host copy, or copies seq_lens to the host when there is none.
    host_seq = next((values[name] for name in ("_seq_lens_cpu", "seq_lens_cpu") if name in values),
                    None)
    if host_seq is None:
        host_seq = values["seq_lens"].to("cpu")
    values["num_reqs"] = stop - start
    values["num_actual_tokens"] = token_slice.stop - token_slice.start
    values["max_query_len"] = int(torch.max(torch.abs(qsl_cpu[1:] - qsl_cpu[:-1])).item())
    values["max_seq_len"] = int(host_seq.max())
    if "num_input_tokens" in fields:
        values["num_input_tokens"] = values["num_actual_tokens"]
    return dataclasses.replace(common, **values)

"""Engine-shaped batches and the per-ubatch checks shared by the adapter tests.

``build_common`` fills any class with a pinned layout (the real vLLM class, or a
structural stand-in built from the pinned field list) the way the engines'
model runners do: int32 device tensors padded past the real requests and
tokens, host copies on the CPU, slot_mapping padded with -1. The expected
per-ubatch values come from ``expected_pieces``, a plain-Python walk over the
requests that shares no code with afd_split.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from afd_split import BatchMetadata
from afd_split.engine.standins import attn_state_enum, standin_class  # noqa: F401 (re-exported)

BLOCK = 16
PREFIX_HIT_TOKENS = (40, 100, 20, 36)
PREFIX_HIT_COMPUTED = (0, 64, 0, 128)
"""Two prefix-cache hits; token_balanced with align 8 cuts at 96, inside request 1."""
PAD_REQS = 2
"""Zero-token padding requests of a vLLM parent (the GPU runner's padded num_reqs)."""
PAD_TOKENS = 12
MAX_NUM_BATCHED_TOKENS = 2048
"""scheduler_config.max_num_batched_tokens of the stand-in runner: the length of the runner
buffers that back group_len / group_key_idx / group_key_cache_idx (v0.26.0rc)."""


def build_common(cls, layout, tokens=PREFIX_HIT_TOKENS, computed=PREFIX_HIT_COMPUTED, *,
                 device="cpu", attn_state=None, fia_dummy=False, **overrides):
    """(metadata, positions, BatchMetadata of the real part) for one padded prefill batch.

    A vLLM parent pads requests (zero-token entries) and tokens. A vLLM-Ascend parent is one
    of the layouts its runner builds (pinned ``runner_layouts``): the SP-padded one
    (PAD_TOKENS padding rows, no padding request), or with ``fia_dummy`` the FIA one (one
    dummy request holding the padding tokens, seq_len 0).
    """
    meta = BatchMetadata.from_requests(list(tokens), list(computed), block_size=BLOCK)
    num_reqs, num_tokens = meta.num_reqs, meta.num_tokens
    ascend = "num_input_tokens" in layout.field_set
    pad_reqs = (1 if fia_dummy else 0) if ascend else PAD_REQS
    padded_reqs, padded_tokens = num_reqs + pad_reqs, num_tokens + PAD_TOKENS

    def padded(array, length, fill):
        return np.concatenate([array, np.full(length - array.shape[-1], fill)])

    def dev(array, dtype=torch.int32):
        return torch.from_numpy(np.asarray(array)).to(dtype=dtype, device=device)

    def cpu(array, dtype=torch.int32):
        return torch.from_numpy(np.asarray(array)).to(dtype=dtype)

    qsl = padded(meta.query_start_loc, padded_reqs + 1, padded_tokens if fia_dummy else num_tokens)
    seq_lens = padded(meta.seq_lens, padded_reqs, 0)
    computed_all = padded(meta.num_computed_tokens, padded_reqs, 0)
    table = np.zeros((padded_reqs, meta.block_table.shape[1]), np.int64)
    table[:num_reqs] = meta.block_table
    positions = padded(meta.positions, padded_tokens, 0)
    values = {
        "query_start_loc": dev(qsl),
        "query_start_loc_cpu": cpu(qsl),
        "seq_lens": dev(seq_lens),
        # vLLM's GPU runner pads num_actual_tokens; vLLM-Ascend pads num_reqs.
        "num_reqs": padded_reqs,
        "num_actual_tokens": num_tokens if ascend else padded_tokens,
        "max_query_len": meta.max_query_len,
        "max_seq_len": meta.max_seq_len,
        "block_table_tensor": dev(table),
        "slot_mapping": dev(padded(meta.slot_mapping, padded_tokens, -1), torch.int64),
    }
    optional = {
        "_seq_lens_cpu": cpu(seq_lens),
        "_num_computed_tokens_cpu": cpu(computed_all),
        "seq_lens_cpu_upper_bound": cpu(seq_lens),
        "seq_lens_cpu": cpu(seq_lens),
        "num_computed_tokens_cpu": cpu(computed_all),
        "is_prefilling": dev(np.arange(padded_reqs) < num_reqs, torch.bool),
        "positions": dev(positions, torch.int64),
        "positions_cpu": cpu(positions, torch.int64),
        "num_input_tokens": padded_tokens,
        "attn_state": attn_state,
        # Views [:num_reqs_padded] of max_num_batched_tokens-long runner buffers.
        **{name: dev(np.zeros(MAX_NUM_BATCHED_TOKENS))[:padded_reqs]
           for name in ("group_len", "group_key_idx", "group_key_cache_idx")},
    }
    values.update({k: v for k, v in optional.items() if k in layout.field_set})
    values.update(overrides)
    return cls(**values), dev(positions, torch.int64), meta


def expected_pieces(tokens, computed, cut):
    """Per ubatch, per request piece: (query_len, num_computed_tokens, seq_len); plain Python."""
    head, tail = [], []
    start = 0
    for query, done in zip(tokens, computed, strict=True):
        stop = start + query
        if stop <= cut:
            head.append((query, done, done + query))
        elif start >= cut:
            tail.append((query, done, done + query))
        else:
            in_head = cut - start
            head.append((in_head, done, done + in_head))
            tail.append((query - in_head, done + in_head, done + query))
        start = stop
    return head, tail


def _host(tensor):
    return tensor.detach().cpu().numpy().astype(np.int64)


def host_seq_lens(sub, layout):
    """The host seq_lens a backend would read: the first set of the known host copies."""
    for name in ("_seq_lens_cpu", "seq_lens_cpu", "seq_lens_cpu_upper_bound"):
        if name in layout.field_set and getattr(sub, name) is not None:
            return _host(getattr(sub, name))
    raise AssertionError("no host seq_lens in the produced ubatch")


def snapshot(common):
    """Deep copies of every tensor field, to prove the parent is not mutated."""
    return {
        f.name: getattr(common, f.name).clone()
        for f in dataclasses.fields(common)
        if isinstance(getattr(common, f.name), torch.Tensor)
    }


def assert_ubatches(plan, common, positions, meta, results, layout, *, padded_rows):
    """The checks every adapter/class pair must pass (real vLLM classes and stand-ins)."""
    tokens, computed = meta.query_lens.tolist(), meta.num_computed_tokens.tolist()
    expected = expected_pieces(tokens, computed, plan.split_token)
    assert len(results) == 2
    offset = 0
    for ubatch, (sub, sub_positions), pieces in zip(plan.ubatches, results, expected, strict=True):
        assert type(sub) is type(common)
        query_lens = [p[0] for p in pieces]
        qsl = _host(sub.query_start_loc_cpu)
        assert qsl.tolist() == [0, *np.cumsum(query_lens).tolist()]
        assert _host(sub.query_start_loc).tolist() == qsl.tolist()
        seq = host_seq_lens(sub, layout)
        assert seq.tolist() == [p[2] for p in pieces]
        assert _host(sub.seq_lens).tolist() == seq.tolist()
        for name in ("_num_computed_tokens_cpu", "num_computed_tokens_cpu"):
            if name in layout.field_set and getattr(sub, name) is not None:
                assert _host(getattr(sub, name)).tolist() == [p[1] for p in pieces], name
        # The invariant, request by request.
        assert (seq - np.diff(qsl)).tolist() == [p[1] for p in pieces]
        # Padding stays out of every real count.
        real = sum(query_lens)
        assert sub.num_reqs == len(pieces) and sub.num_actual_tokens == real
        assert sub.max_query_len == max(query_lens) and sub.max_seq_len == max(seq.tolist())
        slots = _host(sub.slot_mapping)
        pos = _host(sub_positions)
        rows = ubatch.num_rows if padded_rows else real
        assert slots.shape[-1] == rows and pos.shape[-1] == rows
        assert slots[:real].tolist() == meta.slot_mapping[offset : offset + real].tolist()
        assert (slots[real:] == -1).all() and (slots[:real] >= 0).all()
        assert pos[:real].tolist() == meta.positions[offset : offset + real].tolist()
        assert _host(sub.block_table_tensor).tolist() == meta.block_table[ubatch.request_slice].tolist()
        if "positions" in layout.field_set and sub.positions is not None:
            assert _host(sub.positions)[:real].tolist() == pos[:real].tolist()
        if "num_input_tokens" in layout.field_set:
            assert sub.num_input_tokens == ubatch.num_rows
        offset += real
    assert offset == meta.num_tokens

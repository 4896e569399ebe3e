"""Host reads and device slicing shared by the vLLM and vLLM-Ascend adapters.

API: ``parent_request_fields(plan, common, host) -> RequestFields``;
``ubatch_request_rows`` / ``ubatch_token_rows`` (device views, index ops only);
``rebased_query_start_loc`` / ``cut_seq_lens`` (device arithmetic by plan ints);
``host_tensor``; ``check_split(plan, parent, produced, mode)``.

Host-side values come only from the ``*_cpu`` fields the engine already holds
(``query_start_loc_cpu``, ``_seq_lens_cpu`` / ``seq_lens_cpu_upper_bound``,
``_num_computed_tokens_cpu``); device tensors are only viewed, index-selected
or combined with plain Python integers taken from the plan, so the split makes
no device-to-host transfer and reads no device scalar (guarded by the
TorchDispatchMode test in tests/adapters/test_device_path.py).
"""

from __future__ import annotations

import numpy as np

from afd_split.errors import UnsupportedSplitError
from afd_split.plan import SplitPlan, UBatch
from afd_split.request_checks import validate_split_requests
from afd_split.requests import RequestFields

CHECK_REQUESTS = "requests"
"""Default per-step check: request-level invariants on the host fields (O(R), no sync)."""
CHECK_FULL = "full"
"""Debug check: also token-level ``validate_split``; copies slot_mapping/block table to host."""
CHECK_MODES = (CHECK_REQUESTS, CHECK_FULL)

PAD_SLOT_ID = -1
"""slot_mapping value of a padding row: the KV-cache write kernels skip it."""
PAD_POSITION = 0
"""positions value of a padding row (its rotary embedding is computed and discarded)."""


def host_numpy(tensor) -> np.ndarray:
    """int64 numpy copy of a host tensor or array (refuses a device tensor: that would sync)."""
    if hasattr(tensor, "device") and tensor.device.type != "cpu":
        raise UnsupportedSplitError(
            f"host field on device {tensor.device}: reading it would be a device-to-host copy"
        )
    array = tensor.numpy() if hasattr(tensor, "numpy") else np.asarray(tensor)
    return array.astype(np.int64)


def parent_request_fields(
    plan: SplitPlan, query_start_loc_cpu, seq_lens_cpu, computed_cpu, *, source: str
) -> RequestFields:
    """The parent's real-request fields, with padding requests/tokens checked and cut off.

    Real counts come from the plan (``plan.num_requests``, ``plan.num_tokens``),
    never from the engine's possibly padded ``num_reqs`` / ``num_actual_tokens``.
    ``computed_cpu=None`` derives computed tokens as seq_len - query_len.
    """
    num_reqs, num_tokens = plan.num_requests, plan.num_tokens
    qsl = host_numpy(query_start_loc_cpu)
    seq_lens = host_numpy(seq_lens_cpu)
    if qsl.shape[0] < num_reqs + 1 or seq_lens.shape[0] < num_reqs:
        raise ValueError(
            f"{source}: query_start_loc_cpu has {qsl.shape[0]} entries and the host seq_lens "
            f"{seq_lens.shape[0]}, but the plan has {num_reqs} requests"
        )
    real_qsl = qsl[: num_reqs + 1]
    if not np.array_equal(np.diff(real_qsl), plan.token_counts) or real_qsl[0] != 0:
        raise ValueError(
            f"{source}: query_start_loc_cpu[:{num_reqs + 1}] does not hold the plan's "
            f"per-request tokens {list(plan.num_scheduled_tokens)[:8]}...; the plan was made "
            "for a different batch"
        )
    padding = qsl[num_reqs + 1 :]
    if padding.size and (padding != num_tokens).any():
        raise ValueError(
            f"{source}: a padding request entry of query_start_loc_cpu past request "
            f"{num_reqs} holds tokens ({padding.tolist()[:8]}), but the plan has all "
            f"{num_tokens} real tokens in its {num_reqs} requests"
        )
    real_seq_lens = seq_lens[:num_reqs]
    query_lens = plan.token_counts
    if computed_cpu is None:
        computed = real_seq_lens - query_lens
    else:
        computed = host_numpy(computed_cpu)[:num_reqs]
    return RequestFields(real_qsl, real_seq_lens, computed)


def check_engine_counts(plan: SplitPlan, num_reqs: int, num_tokens: int, *, source: str) -> None:
    """The engine's (possibly padded) counts must hold at least the plan's real ones."""
    if num_reqs < plan.num_requests or num_tokens < plan.num_tokens:
        raise ValueError(
            f"{source}: num_reqs={num_reqs}, num_actual_tokens={num_tokens} hold fewer than "
            f"the plan's {plan.num_requests} requests / {plan.num_tokens} tokens"
        )


def ubatch_request_rows(tensor, ubatch: UBatch):
    """The ubatch's requests of a request-indexed tensor or array (a view)."""
    return tensor[ubatch.request_slice]


def ubatch_token_rows(tensor, ubatch: UBatch, *, with_padding: bool, pad_value: int):
    """The ubatch's rows of a token-indexed tensor (last dim), device-side only.

    Without padding rows this is the view ``tensor[..., token_slice]``. With
    padding (``with_padding=True``) the real tokens are placed at
    ``ubatch.real_row_indices`` of ``num_rows`` rows filled with ``pad_value``:
    still a view when the real rows are a prefix and no row is padding,
    otherwise one ``new_full`` plus a ``cat`` or an ``index_copy`` on the device.
    """
    import torch  # lazy: adapters only

    real = tensor[..., ubatch.token_slice]
    if not with_padding or not ubatch.num_padded_tokens:
        return real
    shape = (*tensor.shape[:-1], ubatch.num_rows)
    if ubatch.real_rows_are_prefix:
        pad = real.new_full((*tensor.shape[:-1], ubatch.num_padded_tokens), pad_value)
        return torch.cat([real, pad], dim=-1)
    rows = real.new_full(shape, pad_value)
    index = torch.tensor(ubatch.real_row_indices, device=tensor.device)  # host-to-device only
    return rows.index_copy_(-1, index, real)


def rebased_query_start_loc(query_start_loc, ubatch: UBatch):
    """Device query_start_loc of the ubatch: the parent's slice, rebased and pinned at its ends."""
    start, stop = ubatch.request_slice.start, ubatch.request_slice.stop
    local = query_start_loc[start : stop + 1] - ubatch.token_slice.start
    local[0] = 0
    local[-1] = ubatch.num_real_tokens
    return local


def cut_seq_lens(seq_lens, ubatch: UBatch, left_over: int):
    """The ubatch's seq_lens: a view, or a copy whose last request ends ``left_over`` earlier."""
    part = seq_lens[ubatch.request_slice]
    if not left_over:
        return part
    part = part.clone()
    part[-1] -= left_over
    return part


def host_tensor(array: np.ndarray, like):
    """A new host tensor (or array) of ``array`` with ``like``'s dtype (the parent's host copy).

    ``from_numpy`` of a fresh ``astype`` copy: the part arrays are read-only and
    shared, and this is several times cheaper than ``torch.tensor`` per step.
    """
    import torch  # lazy: adapters only

    if isinstance(like, np.ndarray):
        return array.astype(like.dtype)
    return torch.from_numpy(array.astype(like.numpy().dtype))  # like is a host tensor


def check_split(plan: SplitPlan, parent: RequestFields, produced: list[RequestFields], mode: str):
    """Run the chosen check on what the adapter produced (read back from the ubatch objects)."""
    if mode not in CHECK_MODES:
        raise ValueError(f"check={mode!r} is not one of {CHECK_MODES}")
    validate_split_requests(plan, parent, produced)

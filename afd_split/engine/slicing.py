"""Host reads and device slicing shared by the vLLM and vLLM-Ascend adapters.

API: ``parent_host_arrays(plan, qsl_cpu, seq_lens_cpu, computed_cpu, source=)``
(numpy views of the real requests, engine dtype); ``ubatch_request_rows`` /
``ubatch_token_rows`` (device views, index ops only); ``rebased_query_start_loc``
/ ``cut_seq_lens`` (device arithmetic by plan ints); ``host_like`` / ``host_like_read`` (a
ubatch's host tensor over its array, and the array it reads back as); ``check_split(plan, parent, produced, mode)``.

Host-side values come only from the ``*_cpu`` fields the engine already holds
(``query_start_loc_cpu``, ``_seq_lens_cpu`` / ``seq_lens_cpu_upper_bound``,
``_num_computed_tokens_cpu``); device tensors are only viewed, index-selected
or combined with plain Python integers taken from the plan, so the split makes
no device-to-host transfer and reads no device scalar (guarded by the
TorchDispatchMode test in tests/adapters/test_adapter_device_path.py).
"""

from __future__ import annotations

import functools
import itertools
import operator

import numpy as np

from afd_split.checks.request_checks import check_split_arrays
from afd_split.errors import UnsupportedSplitError
from afd_split.plan.planner import SplitPlan, UBatch

CHECK_REQUESTS = "requests"
"""Default per-step check: request-level invariants on the host fields (O(R), no sync)."""
CHECK_FULL = "full"
"""Debug check: also token-level ``validate_split``; copies slot_mapping/block table to host."""
CHECK_MODES = (CHECK_REQUESTS, CHECK_FULL)

SCALAR_MAX_REQUESTS = 16
"""Up to this many requests a Python max over ``tolist()`` beats a numpy reduction."""

PAD_SLOT_ID = -1
"""slot_mapping value of a padding row: the KV-cache write kernels skip it."""
PAD_POSITION = 0
"""positions value of a padding row (its rotary embedding is computed and discarded)."""


def host_numpy(tensor) -> np.ndarray:
    """A numpy view of a host tensor or array (refuses a device tensor: that would sync).

    A view, not a copy: the split reads the engine's host buffers of this step,
    as the parent's own fields do.
    """
    if type(tensor) is np.ndarray:
        return tensor
    if getattr(tensor, "is_cpu", False):  # a host torch tensor: the per-step case
        return tensor.numpy()
    if hasattr(tensor, "numpy"):
        if tensor.device.type != "cpu":
            raise UnsupportedSplitError(
                f"host field on device {tensor.device}: reading it would be a device-to-host copy"
            )
        return tensor.numpy()
    return np.asarray(tensor)


def parent_host_arrays(
    plan: SplitPlan, query_start_loc_cpu, seq_lens_cpu, computed_cpu, *, source
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parent's real-request host arrays: numpy views in the engine's dtype, no copy.

    Padding requests/tokens are checked and cut off: real counts come from the
    plan (``plan.num_requests``, ``plan.num_tokens``), never from the engine's
    possibly padded ``num_reqs`` / ``num_actual_tokens``. ``computed_cpu=None``
    derives computed tokens as seq_len - query_len. The views live as long as
    the engine's host buffers hold this step, as the parent's own fields do.
    ``source()`` names where the fields came from (formatted only for an error).
    """
    num_reqs, num_tokens = plan.num_requests, plan.num_tokens
    qsl = host_numpy(query_start_loc_cpu)
    seq_lens = host_numpy(seq_lens_cpu)
    if qsl.shape[0] < num_reqs + 1 or seq_lens.shape[0] < num_reqs:
        raise ValueError(
            f"{source()}: query_start_loc_cpu has {qsl.shape[0]} entries and the host seq_lens "
            f"{seq_lens.shape[0]}, but the plan has {num_reqs} requests"
        )
    padded = qsl.shape[0] > num_reqs + 1  # slice only what the engine padded
    real_qsl = qsl[: num_reqs + 1] if padded else qsl
    if real_qsl.item(0) != 0 or not _same_prefix_sums(plan, real_qsl):
        raise ValueError(
            f"{source()}: query_start_loc_cpu[:{num_reqs + 1}] does not hold the plan's "
            f"per-request tokens {list(plan.num_scheduled_tokens)[:8]}...; the plan was made "
            "for a different batch"
        )
    padding = qsl[num_reqs + 1 :] if padded else None
    if padded and (padding != num_tokens).any():
        raise ValueError(
            f"{source()}: a padding request entry of query_start_loc_cpu past request "
            f"{num_reqs} holds tokens ({padding.tolist()[:8]}), but the plan has all "
            f"{num_tokens} real tokens in its {num_reqs} requests"
        )
    real_seq_lens = seq_lens[:num_reqs] if seq_lens.shape[0] > num_reqs else seq_lens
    if computed_cpu is None:
        computed = real_seq_lens - (real_qsl[1:] - real_qsl[:-1])
    else:
        computed = host_numpy(computed_cpu)
        if computed.shape[0] != num_reqs:
            computed = computed[:num_reqs]
    return real_qsl, real_seq_lens, computed


def _same_prefix_sums(plan: SplitPlan, qsl: np.ndarray) -> bool:
    """``qsl[1:]`` equals the plan's prefix sums (Python lists when small: no plan array)."""
    if qsl.shape[0] <= SCALAR_MAX_REQUESTS + 1:
        return qsl[1:].tolist() == list(itertools.accumulate(plan.num_scheduled_tokens))
    # By value, never through a cast: a fractional entry must fail here as on the list path.
    return np.array_equal(qsl[1:], plan.cu_tokens)


def check_engine_counts(plan: SplitPlan, num_reqs: int, num_tokens: int, *, source) -> None:
    """The engine's (possibly padded) counts must hold at least the plan's real ones
    (``source()`` names where they came from)."""
    if num_reqs < plan.num_requests or num_tokens < plan.num_tokens:
        raise ValueError(
            f"{source()}: num_reqs={num_reqs}, num_actual_tokens={num_tokens} hold fewer than "
            f"the plan's {plan.num_requests} requests / {plan.num_tokens} tokens"
        )


def ubatch_request_rows(tensor, ubatch: UBatch):
    """The ubatch's requests of a request-indexed tensor or array (a view)."""
    return tensor[ubatch.request_slice]


def ubatch_token_rows(
    tensor, ubatch: UBatch, *, with_padding: bool, pad_value: int, index_cache=None
):
    """The ubatch's rows of a token-indexed tensor (last dim), device-side only.

    Without padding rows this is the view ``tensor[..., token_slice]``. With
    padding (``with_padding=True``) the real tokens are placed at
    ``ubatch.real_row_indices`` of ``num_rows`` rows filled with ``pad_value``:
    still a view when the real rows are a prefix and no row is padding,
    otherwise one ``new_full`` plus a ``cat`` or an ``index_copy`` on the device.
    ``index_cache`` (a dict per ubatch) shares the row-index tensor of one device
    between the ubatch's token fields.
    """
    real = tensor[ubatch.token_slice] if tensor.ndim == 1 else tensor[..., ubatch.token_slice]
    if not with_padding or not ubatch.num_padded_tokens:
        return real
    torch = torch_module()
    shape = (*tensor.shape[:-1], ubatch.num_rows)
    if ubatch.real_rows_are_prefix:
        pad = real.new_full((*tensor.shape[:-1], ubatch.num_padded_tokens), pad_value)
        return torch.cat([real, pad], dim=-1)
    rows = real.new_full(shape, pad_value)
    device = tensor.device
    index = None if index_cache is None else index_cache.get(device)
    if index is None:
        index = torch.tensor(ubatch.real_row_indices, device=device)  # host-to-device only
        if index_cache is not None:
            index_cache[device] = index
    return rows.index_copy_(-1, index, real)


def rebased_query_start_loc(query_start_loc, ubatch: UBatch, already_done: int, left_over: int):
    """Device query_start_loc of the ubatch: the parent's slice, rebased and pinned at its ends.

    The entries are sorted and the request slice holds exactly the requests that
    overlap the token slice, so only the two ends can fall outside [0, real
    tokens] once rebased, and only when a request is cut there (``already_done``
    / ``left_over``): one clamp pins them. A head that cuts nothing is a view.
    """
    window = query_start_loc[ubatch.request_slice.start : ubatch.request_slice.stop + 1]
    token_start = ubatch.token_slice.start
    if token_start:
        window = window - token_start
    if not (already_done or left_over):
        return window
    if token_start:  # a new tensor already: pin in place
        return window.clamp_(0, ubatch.num_real_tokens)
    return window.clamp(0, ubatch.num_real_tokens)  # out of place: the window is the parent's


def cut_seq_lens(seq_lens, ubatch: UBatch, left_over: int):
    """The ubatch's seq_lens: a view, or a copy whose last request ends ``left_over`` earlier."""
    part = seq_lens[ubatch.request_slice]
    if not left_over:
        return part
    part = part.clone()
    part.select(0, -1).sub_(left_over)  # in place on a view: no scalar write-back copy
    return part


def host_like(array: np.ndarray, like):
    """``array`` as the parent's host field ``like`` holds it: a host tensor sharing its memory
    (``from_numpy``), in ``like``'s dtype, or an array when ``like`` is one."""
    return host_like_read(array, like)[0]


def host_like_read(array: np.ndarray, like) -> tuple:
    """``(host_like(array, like), its host array)``: the made copy and a numpy view of its
    memory, so the check reads what was produced without a ``.numpy()`` call per copy.

    ``from_numpy`` shares ``array``'s memory, so ``array`` is that view; a dtype
    conversion makes new memory, read back from the converted tensor.
    """
    if isinstance(like, np.ndarray):
        made = array if array.dtype == like.dtype else array.astype(like.dtype)
        return made, made
    tensor = torch_module().from_numpy(array)
    if tensor.dtype is like.dtype:
        return tensor, array
    tensor = tensor.to(like.dtype)
    return tensor, tensor.numpy()


@functools.cache
def torch_module():
    """torch, imported on first use (afd_split does not import it at import time)."""
    import torch

    return torch


def host_max(array: np.ndarray) -> int:
    """``int(array.max())`` of a host request array (plain Python for small batches;
    ``argmax`` skips the ufunc-reduce machinery of ``max`` on large ones)."""
    if array.shape[0] <= SCALAR_MAX_REQUESTS:
        return max(array.tolist())
    return array.item(array.argmax())


def max_query_len(query_start_loc: np.ndarray) -> int:
    """The largest per-request token count of a host query_start_loc (plain Python when small)."""
    if query_start_loc.shape[0] <= SCALAR_MAX_REQUESTS:
        starts = query_start_loc.tolist()
        return max(map(operator.sub, starts[1:], starts[:-1]))
    return host_max(query_start_loc[1:] - query_start_loc[:-1])


def check_split(plan: SplitPlan, parent: tuple, produced: list[tuple], mode: str):
    """Run the chosen check on what the adapter produced (host arrays read back from the
    ubatches' new fields, ``(qsl, seq_lens, computed)`` each, like ``parent``)."""
    if mode not in CHECK_MODES:
        raise ValueError(f"check={mode!r} is not one of {CHECK_MODES}")
    check_split_arrays(plan, *parent, produced)

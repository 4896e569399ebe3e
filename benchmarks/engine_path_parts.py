"""Per-part callables of the engine path, for engine_path_bench's side-by-side breakdown.

For one batch and its (already made) plan:

* ``adapter_split``: the hook's splitter alone (adapter split + its request-level
  check), so engine_path = plan + this + the hook's small glue;
* ``request_check``: the adapter's check alone, on the host arrays of the
  ubatches it produced (read back from their fields, as the adapter does);
* ``torch_ops_floor``: only the torch calls the adapter makes for this layout
  (host ``.numpy()`` reads of the parent, device views and plan-integer
  arithmetic, ``from_numpy`` of the ubatches' host fields, read back as the arrays
  they share), replayed with precomputed
  indices and no Python logic around them: what no Python rewrite of the
  split could go below without fewer torch calls. ``aten_ops`` counts the aten
  ops of a callable; the bench records that the floor dispatches exactly the
  adapter's (``floor_matches_adapter_ops``).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from afd_split.checks.request_checks import check_split_arrays
from afd_split.engine.common import parent_arrays_of, produced_arrays, split_fields


def field_program(batch):
    """The adapter's field program of the batch's metadata class (vLLM or Ascend)."""
    if batch.splitter is None:
        from afd_split.engine.ascend import ascend_field_program

        return ascend_field_program(type(batch.common))
    from afd_split.engine.vllm import vllm_field_program

    return vllm_field_program(type(batch.common))


def _recompute_table(batch):
    if batch.splitter is None:
        from afd_split.engine.ascend import ASCEND_RECOMPUTE_BY_MODE

        return ASCEND_RECOMPUTE_BY_MODE[True, False]
    from afd_split.engine.vllm import VLLM_RECOMPUTE

    return VLLM_RECOMPUTE


def part_callables(batch, plan, splitter, block_size: int) -> dict:
    """``{name: zero-argument callable}`` of the parts (see the module docstring)."""
    common = batch.common
    program = field_program(batch)
    parent = parent_arrays_of(plan, common, program)
    padded = batch.splitter is None
    values = split_fields(plan, common, program, _recompute_table(batch), parent, padded_rows=padded)

    def request_check():
        check_split_arrays(plan, *parent, [produced_arrays(v, program) for v in values])

    return {
        "adapter_split": lambda: splitter(plan, common, block_size),
        "request_check": request_check,
        "torch_ops_floor": torch_floor(batch, plan, program,
                                       [sub.__dict__ for sub in splitter(plan, common, block_size)]),
    }


def torch_floor(batch, plan, program, values):
    """The adapter's torch calls for this batch, replayed bare (see the module docstring);
    ``values`` are the field dicts of the ubatches the adapter produced."""
    common = batch.common

    def first_set(names):  # the adapter reads the first set host copy of each field
        return [next(getattr(common, n) for n in names if getattr(common, n) is not None)]

    host_in = [common.query_start_loc_cpu, *first_set(program.seq_lens_sources)]
    if any(getattr(common, name) is not None for name in program.computed_sources):
        host_in += first_set(program.computed_sources)
    host_out = [name for name in ("query_start_loc_cpu", *program.seq_lens_sources,
                                  *program.computed_sources) if values[0].get(name) is not None]
    request_rows = [getattr(common, n) for n in program.request_rows if getattr(common, n) is not None]
    token_rows = [getattr(common, n) for n, _ in program.token_rows if getattr(common, n) is not None]
    if batch.splitter is not None and batch.positions is not getattr(common, "positions", None):
        token_rows.append(batch.positions)  # the vLLM adapter slices the runner's positions too
    stages = []
    for ubatch, stage_values in zip(plan.ubatches, values, strict=True):
        request_slice, token_slice = ubatch.request_slice, ubatch.token_slice
        # One host tensor per distinct produced copy (the compiled split shares one tensor
        # between the host copies of one ubatch array, and the check reads it once).
        distinct = {id(stage_values[name]): stage_values[name] for name in host_out}
        arrays = [tensor.numpy() for tensor in distinct.values()]
        left_over = plan.cu_tokens[request_slice.stop - 1] - token_slice.stop
        stages.append((request_slice, token_slice, ubatch.num_real_tokens, int(left_over), arrays))
    qsl, seq_lens = common.query_start_loc, common.seq_lens

    def replay():
        for tensor in host_in:
            tensor.numpy()
        for request_slice, token_slice, real, left_over, arrays in stages:
            start, stop = request_slice.start, request_slice.stop
            window = qsl[start : stop + 1]
            if token_slice.start:
                window = window - token_slice.start
                window.clamp_(0, real)
            else:
                window.clamp(0, real)
            part = seq_lens[request_slice]
            if left_over:
                part.clone().select(0, -1).sub_(left_over)
            for tensor in request_rows:
                tensor[request_slice]
            for tensor in token_rows:
                tensor[token_slice]
            for array in arrays:
                # Made; the check reads it as the array from_numpy shares (host_like_read).
                torch.from_numpy(array)

    return replay


class OpCounter(TorchDispatchMode):
    """Counts the aten ops a callable dispatches (under the mode ``.numpy()`` shows as a detach,
    ``from_numpy`` as a lift_fresh)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def aten_ops(function) -> dict:
    """``{op: count}`` of one call of ``function``."""
    counter = OpCounter()
    with counter:
        function()
    return dict(sorted(counter.ops.items()))

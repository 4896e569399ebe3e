"""The seeded faults' own code: how each one breaks the split path the CPU backend runs.

Wrappers of the split entry (``split_engine_metadata``), of ``gather_ubatch_rows`` and
``merge_outputs``, installs on the PCP relayout and on the executor. Which fault is which,
and how one is selected and applied, is the registry in :mod:`pytest_afd.faults.registry`; the
engine glue's faults are :mod:`pytest_afd.faults.glue`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from pytest_afd.faults.glue import patched as _patched

EXECUTOR_MODULE = "pytest_afd.backends.cpu.executor"
METADATA_MODULE = "afd_split.checks.metadata"
RETAINED_ATTRIBUTE = "_retained_splits"
"""Module attribute the leak fault adds to afd_split.checks.metadata (what the soak's scan must see)."""
MODEL_LEAK_ATTRIBUTE = "forward_metadata_log"
"""Attribute the executor-leak fault adds to the model (a list of every forward's metadata)."""
MODEL_BYTES_LEAK_ATTRIBUTE = "forward_logits_bytes"
"""Attribute the bytes-leak fault adds to the model (every forward's last logits as bytes)."""


# ---- faults in the split the executor runs (split_engine_metadata) -------------


def tail_computed_unadjusted(split: Callable) -> Callable:
    """vLLM's bug: the tail keeps the parent's num_computed_tokens for the cut request."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        if plan.boundary_request is None:
            return parts
        head, tail = parts
        computed = np.array(tail.num_computed_tokens)
        computed[0] = metadata.num_computed_tokens[plan.boundary_request]
        return [head, replace(tail, num_computed_tokens=computed)]

    return faulty


def positions_not_sliced(split: Callable) -> Callable:
    """Every ubatch reads the parent's positions from token 0 (the slice offset dropped)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        return [replace(p, positions=metadata.positions[..., : p.num_tokens]) for p in parts]

    return faulty


def slot_mapping_shifted(split: Callable) -> Callable:
    """Ubatches after the first take slot_mapping one token early (an off-by-one slice)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        shifted = [parts[0]]
        for ubatch, part in zip(plan.ubatches[1:], parts[1:], strict=True):
            start = ubatch.token_slice.start - 1
            slots = metadata.slot_mapping[start : start + part.num_tokens]
            shifted.append(replace(part, slot_mapping=slots))
        return shifted

    return faulty


def block_table_wrong_rows(split: Callable) -> Callable:
    """Each ubatch takes the block-table rows of the request before its own (rows rolled)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        rolled = np.roll(metadata.block_table, 1, axis=0)
        return [
            replace(part, block_table=rolled[ubatch.request_slice])
            for ubatch, part in zip(plan.ubatches, parts, strict=True)
        ]

    return faulty


def head_seq_len_not_truncated(split: Callable) -> Callable:
    """The head keeps the cut request's whole seq_len (it then attends to tokens not yet there)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        if plan.boundary_request is None:
            return parts
        head, *rest = parts
        seq_lens = np.array(head.seq_lens)
        seq_lens[-1] = metadata.seq_lens[plan.boundary_request]
        return [replace(head, seq_lens=seq_lens), *rest]

    return faulty


def retained_reference(split: Callable) -> Callable:
    """The leak: the split keeps every (plan, metadata, parts) in a module-level list."""
    module = importlib.import_module(METADATA_MODULE)

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        getattr(module, RETAINED_ATTRIBUTE).append((plan, metadata, parts))
        return parts

    return faulty


@contextlib.contextmanager
def retained_list() -> Iterator[None]:
    """The leak's module-level list; nested applications share the outer one."""
    module = importlib.import_module(METADATA_MODULE)
    if hasattr(module, RETAINED_ATTRIBUTE):
        yield
        return
    setattr(module, RETAINED_ATTRIBUTE, [])
    try:
        yield
    finally:
        delattr(module, RETAINED_ATTRIBUTE)


def parent_mutated(split: Callable) -> Callable:
    """The tail's computed-token advance is written into the parent (an in-place adjustment)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        if plan.boundary_request is not None:
            computed = np.array(metadata.num_computed_tokens)
            computed[plan.boundary_request] = parts[-1].num_computed_tokens[0]
            seq_lens = np.array(metadata.seq_lens)
            seq_lens[plan.boundary_request] = parts[0].seq_lens[-1]
            object.__setattr__(metadata, "num_computed_tokens", computed)
            object.__setattr__(metadata, "seq_lens", seq_lens)
        return parts

    return faulty


# ---- gather / merge faults -------------------------------------------------------


def roll_rows(rows, shift: int):
    if isinstance(rows, np.ndarray):
        return np.roll(rows, shift, axis=0)
    import torch  # lazy: only tensors reach this branch

    return torch.roll(rows, shift, dims=0)


def rows_shifted_in_gather(gather: Callable) -> Callable:
    """Ubatches after the first gather their rows one token early (the slice start off by one)."""

    def faulty(plan, ubatch_index, parent_rows, pad_value=0):
        if ubatch_index == 0 or not plan.is_split:
            return gather(plan, ubatch_index, parent_rows, pad_value=pad_value)
        return gather(plan, ubatch_index, roll_rows(parent_rows, 1), pad_value=pad_value)

    return faulty


def merge_order_swapped(merge: Callable) -> Callable:
    """The ubatches' real rows are concatenated tail first."""

    def faulty(plan, outputs):
        outputs = list(outputs)
        merged = merge(plan, outputs)
        if not plan.is_split:
            return merged
        head = plan.ubatches[0].num_real_tokens
        return roll_rows(merged, -head)

    return faulty


# ---- faults in the PCP relayout (the hook's rows under PCP) --------------------

PCP_EMULATION_MODULE = "pytest_afd.backends.cpu.pcp"
"""Binds ``all_rank_relayouts``: the CPU backend's every PCP split goes through it."""


def relayout_fault(edit: Callable) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """An install that wraps every rank's relayout with ``edit(relayout) -> relayout``."""

    @contextlib.contextmanager
    def install() -> Iterator[None]:
        module = importlib.import_module(PCP_EMULATION_MODULE)
        original = module.all_rank_relayouts

        def faulty(plan, computed):
            return [edit(relayout) for relayout in original(plan, computed)]

        with _patched(module, "all_rank_relayouts", faulty):
            yield

    return install


def rows_swapped_into_stages(relayout):
    """The inbound map swaps the first and the last real stage rows of every rank."""
    sources = relayout.stage_sources.copy()
    real = np.flatnonzero(sources >= 0)
    sources[real[[0, -1]]] = sources[real[[-1, 0]]]
    return replace(relayout, stage_sources=sources)


def restore_rows_shifted(relayout):
    """The outbound map gives every real parent row its predecessor's stage row."""
    sources = relayout.parent_sources.copy()
    real = np.flatnonzero(sources >= 0)
    sources[real] = np.roll(sources[real], 1)
    return replace(relayout, parent_sources=sources)


# ---- executor faults -----------------------------------------------------------


@contextlib.contextmanager
def _model_keeps(attribute: str, kept: Callable) -> Iterator[None]:
    """The executor appends ``kept(metadata, output)`` of every forward to a list it adds
    to the model as ``attribute`` (removed on exit)."""
    executor = importlib.import_module(EXECUTOR_MODULE).Executor
    original = executor.execute
    touched = []

    def execute(self, input_ids, metadata, plan=None, **kwargs):
        output = original(self, input_ids, metadata, plan, **kwargs)
        if not hasattr(self.model, attribute):
            setattr(self.model, attribute, [])
            touched.append(self.model)
        getattr(self.model, attribute).append(kept(metadata, output))
        return output

    with _patched(executor, "execute", execute):
        try:
            yield
        finally:
            for model in touched:
                delattr(model, attribute)


def executor_keeps_metadata() -> contextlib.AbstractContextManager[None]:
    """The second leak: the executor appends every forward's metadata to a list on the model."""
    return _model_keeps(MODEL_LEAK_ATTRIBUTE, lambda metadata, output: metadata)


def executor_keeps_logits_bytes() -> contextlib.AbstractContextManager[None]:
    """A leak only the soak's memory bound sees: the executor keeps every forward's last
    logits as ``bytes`` on the model. No plan or metadata is kept and bytes are not
    gc-tracked, so neither the weak references nor the gc count move, and a buffer
    above 512 B is no pymalloc block: the traced window must see it."""
    return _model_keeps(MODEL_BYTES_LEAK_ATTRIBUTE,
                        lambda metadata, output: output.last_logits.numpy().tobytes())

"""Named, seeded split-path faults: the bugs the gates exist to catch, injectable on demand.

Each :class:`Fault` is a context manager that patches the split path where the
CPU backend calls it (the split entry ``split_engine_metadata``, gather and
merge as bound in the in-process executor and in the CPU AFD runtime's roles
module, or the executor itself), or, for the glue faults of
:mod:`pytest_afd.glue_faults`, one function of the engine glue (the adapters,
the per-step checks, the plan fingerprint, the step record), for the
duration of the block. They are the fault classes of docs/gates.md ("Seeded
faults"): the mutation check (``python -m pytest_afd fault-check``) applies
each one to a ``pytest -m gate`` subprocess and asserts that the gates fail.

Another process selects a fault by name through the environment variable
:data:`FAULT_ENV` (``PYTEST_AFD_FAULT=merge_order_swapped``):
``fault_from_env()`` resolves it (an unknown name is an error naming the
variable) and ``applied_from_env()`` is the context manager that applies it,
or does nothing when the variable is unset. The suites' conftest, the CPU
HTTP server and every rank process of the CPU AFD runtime (which inherits the
environment) apply it for their whole lifetime.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pytest_afd import glue_faults
from pytest_afd.glue_faults import patched as _patched

FAULT_ENV = "PYTEST_AFD_FAULT"
"""Environment variable naming the fault another process (pytest, HTTP server) applies."""

EXECUTOR_MODULE = "pytest_afd.backends.cpu.executor"
ROLES_MODULE = "pytest_afd.backends.cpu.afd.roles"
# The modules that bind the afd_split functions the CPU backend calls: the
# in-process executor and the AFD runtime's Attention role.
SPLIT_CALLERS = (EXECUTOR_MODULE, ROLES_MODULE)
METADATA_MODULE = "afd_split.checks.metadata"
RETAINED_ATTRIBUTE = "_retained_splits"
"""Module attribute the leak fault adds to afd_split.checks.metadata (what the soak's scan must see)."""
MODEL_LEAK_ATTRIBUTE = "forward_metadata_log"
"""Attribute the executor-leak fault adds to the model (a list of every forward's metadata)."""

SPLIT_ENTRY = "split_engine_metadata"
"""The split the CPU executors run (``engine_glue``: the adapters and checks, or
``split_metadata`` for PCP), with ``split_metadata``'s (plan, metadata) -> parts shape."""

Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Fault:
    """One seeded fault: which split-path function it wraps, and how."""

    name: str
    description: str
    # Function name bound in SPLIT_CALLERS that is wrapped ("split_engine_metadata", ...),
    # or None when ``install`` patches something else.
    target: str | None
    wrap: Wrapper | None = None
    install: Callable[[], contextlib.AbstractContextManager[None]] | None = None

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Patch the split path for the duration of the block; restored on exit."""
        with contextlib.ExitStack() as stack:
            if self.target is not None:
                for module_name in SPLIT_CALLERS:
                    module = importlib.import_module(module_name)
                    original = getattr(module, self.target)
                    stack.enter_context(_patched(module, self.target, self.wrap(original)))
            if self.install is not None:
                stack.enter_context(self.install())
            yield


# ---- faults in the split the executor runs (split_engine_metadata) -------------


def _tail_computed_unadjusted(split: Callable) -> Callable:
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


def _positions_not_sliced(split: Callable) -> Callable:
    """Every ubatch reads the parent's positions from token 0 (the slice offset dropped)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        return [replace(p, positions=metadata.positions[..., : p.num_tokens]) for p in parts]

    return faulty


def _slot_mapping_shifted(split: Callable) -> Callable:
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


def _block_table_wrong_rows(split: Callable) -> Callable:
    """Each ubatch takes the block-table rows of the request before its own (rows rolled)."""

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        rolled = np.roll(metadata.block_table, 1, axis=0)
        return [
            replace(part, block_table=rolled[ubatch.request_slice])
            for ubatch, part in zip(plan.ubatches, parts, strict=True)
        ]

    return faulty


def _head_seq_len_not_truncated(split: Callable) -> Callable:
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


def _retained_reference(split: Callable) -> Callable:
    """The leak: the split keeps every (plan, metadata, parts) in a module-level list."""
    module = importlib.import_module(METADATA_MODULE)

    def faulty(plan, metadata, **kwargs):
        parts = split(plan, metadata, **kwargs)
        getattr(module, RETAINED_ATTRIBUTE).append((plan, metadata, parts))
        return parts

    return faulty


@contextlib.contextmanager
def _retained_list() -> Iterator[None]:
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


def _parent_mutated(split: Callable) -> Callable:
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


def _roll_rows(rows, shift: int):
    if isinstance(rows, np.ndarray):
        return np.roll(rows, shift, axis=0)
    import torch  # lazy: only tensors reach this branch

    return torch.roll(rows, shift, dims=0)


def _rows_shifted_in_gather(gather: Callable) -> Callable:
    """Ubatches after the first gather their rows one token early (the slice start off by one)."""

    def faulty(plan, ubatch_index, parent_rows, pad_value=0):
        if ubatch_index == 0 or not plan.is_split:
            return gather(plan, ubatch_index, parent_rows, pad_value=pad_value)
        return gather(plan, ubatch_index, _roll_rows(parent_rows, 1), pad_value=pad_value)

    return faulty


def _merge_order_swapped(merge: Callable) -> Callable:
    """The ubatches' real rows are concatenated tail first."""

    def faulty(plan, outputs):
        outputs = list(outputs)
        merged = merge(plan, outputs)
        if not plan.is_split:
            return merged
        head = plan.ubatches[0].num_real_tokens
        return _roll_rows(merged, -head)

    return faulty


# ---- faults in the PCP relayout (the hook's rows under PCP) --------------------

PCP_EMULATION_MODULE = "pytest_afd.backends.cpu.pcp"
"""Binds ``all_rank_relayouts``: the CPU backend's every PCP split goes through it."""


def _relayout_fault(edit: Callable) -> Callable[[], contextlib.AbstractContextManager[None]]:
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


def _rows_swapped_into_stages(relayout):
    """The inbound map swaps the first and the last real stage rows of every rank."""
    sources = relayout.stage_sources.copy()
    real = np.flatnonzero(sources >= 0)
    sources[real[[0, -1]]] = sources[real[[-1, 0]]]
    return replace(relayout, stage_sources=sources)


def _restore_rows_shifted(relayout):
    """The outbound map gives every real parent row its predecessor's stage row."""
    sources = relayout.parent_sources.copy()
    real = np.flatnonzero(sources >= 0)
    sources[real] = np.roll(sources[real], 1)
    return replace(relayout, parent_sources=sources)


PCP_ROW_FAULTS = ("relaid_rows_swapped", "restore_rows_shifted")
"""Faults on the PCP path's rows; they reach only a split with pcp_size > 1."""
NON_PCP_ROW_FAULTS = ("merge_order_swapped", "rows_shifted_in_gather")
"""Faults in ``gather_ubatch_rows`` / ``merge_outputs``, which a PCP split does not call
(its rows move through ``afd_split.pcp.relayout``, as on the engine)."""


def fault_reaches(name: str, pcp_size: int) -> bool:
    """Whether fault ``name`` is on the split path of a topology with ``pcp_size``."""
    if name in PCP_ROW_FAULTS or name in glue_faults.PCP_BUILDER_FAULTS:
        return pcp_size > 1
    if name in NON_PCP_ROW_FAULTS:
        return pcp_size <= 1
    return True


# ---- executor faults -----------------------------------------------------------


@contextlib.contextmanager
def _executor_keeps_metadata() -> Iterator[None]:
    """The second leak: the executor appends every forward's metadata to a list on the model."""
    executor = importlib.import_module(EXECUTOR_MODULE).Executor
    original = executor.execute
    touched = []

    def execute(self, input_ids, metadata, plan=None, **kwargs):
        if not hasattr(self.model, MODEL_LEAK_ATTRIBUTE):
            setattr(self.model, MODEL_LEAK_ATTRIBUTE, [])
            touched.append(self.model)
        getattr(self.model, MODEL_LEAK_ATTRIBUTE).append(metadata)
        return original(self, input_ids, metadata, plan, **kwargs)

    with _patched(executor, "execute", execute):
        try:
            yield
        finally:
            for model in touched:
                delattr(model, MODEL_LEAK_ATTRIBUTE)


FAULTS: Mapping[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault("tail_computed_unadjusted", "tail num_computed_tokens not advanced past the head",
              SPLIT_ENTRY, _tail_computed_unadjusted),
        Fault("positions_not_sliced", "token-indexed positions taken from token 0",
              SPLIT_ENTRY, _positions_not_sliced),
        Fault("slot_mapping_shifted", "slot_mapping of later ubatches one token early",
              SPLIT_ENTRY, _slot_mapping_shifted),
        Fault("block_table_wrong_rows", "block-table rows of the previous request",
              SPLIT_ENTRY, _block_table_wrong_rows),
        Fault("head_seq_len_not_truncated", "head keeps the cut request's whole seq_len",
              SPLIT_ENTRY, _head_seq_len_not_truncated),
        Fault("merge_order_swapped", "merged real rows in tail-first order",
              "merge_outputs", _merge_order_swapped),
        Fault("rows_shifted_in_gather", "later ubatches gather rows one token early",
              "gather_ubatch_rows", _rows_shifted_in_gather),
        Fault("relaid_rows_swapped", "PCP relayout: two stage rows swapped on every rank",
              None, install=_relayout_fault(_rows_swapped_into_stages)),
        Fault("restore_rows_shifted", "PCP relayout: restored parent rows one row off",
              None, install=_relayout_fault(_restore_rows_shifted)),
        Fault("retained_reference", "the split keeps every (plan, metadata, parts)",
              SPLIT_ENTRY, _retained_reference, install=_retained_list),
        Fault("executor_keeps_metadata", "executor appends every metadata to a list on the model",
              None, install=_executor_keeps_metadata),
        Fault("parent_mutated", "tail/head adjustments written into the parent metadata",
              SPLIT_ENTRY, _parent_mutated),
        # The engine glue (pytest_afd.glue_faults).
        Fault("adapter_token_rows_by_request", "adapters slice token-indexed fields by request rows",
              None, install=glue_faults.token_rows_by_request),
        Fault("adapter_head_device_seq_lens_full",
              "adapters leave the head's device seq_lens at the cut request's full length",
              None, install=glue_faults.head_device_seq_lens_full),
        Fault("adapter_tail_host_computed_plus_one",
              "adapters' tail host computed-tokens copy one too high",
              None, install=glue_faults.tail_host_computed_plus_one),
        Fault("adapter_check_reads_plan",
              "the adapters' check reads the plan instead of the produced host copies",
              None, install=glue_faults.check_reads_plan),
        Fault("engine_check_unchecked", "check_engine_step returns the split unchecked",
              None, install=glue_faults.engine_check_unchecked),
        Fault("adapter_readback_unchecked",
              "the adapters' read-back check (checked_results) returns the split unchecked",
              None, install=glue_faults.readback_unchecked),
        Fault("request_check_tail_plus_one",
              "the request check (bytes path, > 32 requests) accepts a tail computed count + 1",
              None, install=glue_faults.request_check_tail_plus_one),
        Fault("fingerprint_without_cut", "SplitPlan.fingerprint leaves out the cut",
              None, install=glue_faults.fingerprint_without_cut),
        Fault("step_record_padding_as_real", "step_record reports padding rows as real tokens",
              None, install=glue_faults.padding_reported_as_real),
        Fault("stage_build_shares_builder_slot_buffer",
              "stage build writes through the shared builder slot buffer (full batch's slots)",
              None, install=glue_faults.stage_build_shares_builder_slot_buffer),
        Fault("pcp_padded_slot_buffer_reused",
              "PCPManager padded-slot buffer reused by the stage rebuild (full batch's slots)",
              None, install=glue_faults.pcp_padded_slot_buffer_reused),
    )
}  # fmt: skip


GLUE_FAULTS = tuple(name for name, fault in FAULTS.items()
                    if fault.install is not None and fault.install.__module__ == glue_faults.__name__)
"""The faults in the engine glue (adapters, checks, fingerprint, step record)."""


def get_fault(name: str, *, source: str = "fault name") -> Fault:
    """The fault called ``name``; an unknown name is an error naming it and ``source``."""
    try:
        return FAULTS[name]
    except KeyError:
        raise ValueError(
            f"{source}: unknown split-path fault {name!r}; expected one of {sorted(FAULTS)}"
        ) from None


def fault_from_env(environ: Mapping[str, str] | None = None) -> Fault | None:
    """The fault named by ``$PYTEST_AFD_FAULT``, or None when it is unset or empty."""
    name = (os.environ if environ is None else environ).get(FAULT_ENV, "").strip()
    return get_fault(name, source=f"${FAULT_ENV}") if name else None


@contextlib.contextmanager
def applied_from_env(environ: Mapping[str, str] | None = None) -> Iterator[Fault | None]:
    """Apply the fault ``$PYTEST_AFD_FAULT`` names for the block (nothing when unset)."""
    fault = fault_from_env(environ)
    if fault is None:
        yield None
        return
    with fault.applied():
        yield fault

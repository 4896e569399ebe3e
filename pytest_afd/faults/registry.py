"""Named, seeded split-path faults: the bugs the gates exist to catch, injectable on demand.

Each :class:`Fault` is a context manager that patches the split path where the
CPU backend calls it (the split entry ``split_engine_metadata``, gather and
merge as bound in the in-process executor and in the CPU AFD runtime's Attention
role, or the executor itself; the code of each is :mod:`pytest_afd.faults.split`), or, for the glue faults of
:mod:`pytest_afd.faults.glue`, one function of the engine glue (the adapters,
the per-step checks, the plan fingerprint, the step record), for the
duration of the block. They are the fault classes of docs/gates.md ("Seeded
faults"): the mutation check (``pytest-afd fault-check``) applies
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
from dataclasses import dataclass
from typing import Any

from pytest_afd.faults import glue as glue_faults
from pytest_afd.faults import split as split_faults
from pytest_afd.faults.glue import patched as _patched
from pytest_afd.faults.split import EXECUTOR_MODULE

FAULT_ENV = "PYTEST_AFD_FAULT"
"""Environment variable naming the fault another process (pytest, HTTP server) applies."""

ROLES_MODULE = "pytest_afd.backends.cpu.afd.attention"  # the Attention role
# The modules that bind the afd_split functions the CPU backend calls: the
# in-process executor and the AFD runtime's Attention role.
SPLIT_CALLERS = (EXECUTOR_MODULE, ROLES_MODULE)

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


FAULTS: Mapping[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault("tail_computed_unadjusted", "tail num_computed_tokens not advanced past the head",
              SPLIT_ENTRY, split_faults.tail_computed_unadjusted),
        Fault("positions_not_sliced", "token-indexed positions taken from token 0",
              SPLIT_ENTRY, split_faults.positions_not_sliced),
        Fault("slot_mapping_shifted", "slot_mapping of later ubatches one token early",
              SPLIT_ENTRY, split_faults.slot_mapping_shifted),
        Fault("block_table_wrong_rows", "block-table rows of the previous request",
              SPLIT_ENTRY, split_faults.block_table_wrong_rows),
        Fault("head_seq_len_not_truncated", "head keeps the cut request's whole seq_len",
              SPLIT_ENTRY, split_faults.head_seq_len_not_truncated),
        Fault("merge_order_swapped", "merged real rows in tail-first order",
              "merge_outputs", split_faults.merge_order_swapped),
        Fault("rows_shifted_in_gather", "later ubatches gather rows one token early",
              "gather_ubatch_rows", split_faults.rows_shifted_in_gather),
        Fault("relaid_rows_swapped", "PCP relayout: two stage rows swapped on every rank",
              None, install=split_faults.relayout_fault(split_faults.rows_swapped_into_stages)),
        Fault("restore_rows_shifted", "PCP relayout: restored parent rows one row off",
              None, install=split_faults.relayout_fault(split_faults.restore_rows_shifted)),
        Fault("retained_reference", "the split keeps every (plan, metadata, parts)",
              SPLIT_ENTRY, split_faults.retained_reference, install=split_faults.retained_list),
        Fault("executor_keeps_metadata", "executor appends every metadata to a list on the model",
              None, install=split_faults.executor_keeps_metadata),
        Fault("executor_keeps_logits_bytes",
              "executor keeps every forward's last logits as bytes on the model",
              None, install=split_faults.executor_keeps_logits_bytes),
        Fault("parent_mutated", "tail/head adjustments written into the parent metadata",
              SPLIT_ENTRY, split_faults.parent_mutated),
        # The engine glue (pytest_afd.faults.glue).
        Fault("adapter_token_rows_by_request", "adapters slice token-indexed fields by request rows",
              None, install=glue_faults.token_rows_by_request),
        Fault("adapter_head_device_seq_lens_full",
              "adapters leave the head's device seq_lens at the cut request's full length",
              None, install=glue_faults.head_device_seq_lens_full),
        Fault("adapter_tail_host_computed_plus_one",
              "adapters' tail host computed-tokens copy one too high",
              None, install=glue_faults.tail_host_computed_plus_one),
        Fault("adapter_tail_host_field_plus_one",
              "adapters' produced tail host computed-tokens field one too high",
              None, install=glue_faults.tail_host_field_plus_one),
        Fault("adapter_check_rederives_split",
              "the adapters' check re-derives the split through cut_request_arrays",
              None, install=glue_faults.check_rederives_split),
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

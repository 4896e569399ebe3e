"""Seeded faults in the engine glue: the adapters, the per-step checks, the fingerprint, the evidence.

Each is an installer (a context manager patching one function where the CPU
backend's engine path reaches it) for :mod:`pytest_afd.faults.registry`. They are the
glue bugs docs/gates.md lists ("Seeded faults"): caught by ``pytest -m gate``
only because the CPU backend runs the hook's adapters and checks
(``engine_glue``) and the gates read the step evidence. Two of them are
production faults (``adapter_tail_host_computed_plus_one``,
``adapter_head_device_seq_lens_full``) that the gates' glue-check cases also
inject on purpose, to show which check rejects them; under a check fault that
check goes blind and the case fails.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

ADAPTER_COMMON_MODULE = "afd_split.engine.common"
ADAPTER_VLLM_MODULE = "afd_split.engine.vllm"
ADAPTER_ASCEND_MODULE = "afd_split.engine.ascend"
ENGINE_STEP_MODULE = "afd_split.hook.planning.engine_step"
ENGINE_GLUE_MODULE = "pytest_afd.backends.cpu.engine_glue"
ROLES_MODULE = "pytest_afd.backends.cpu.afd.attention"  # the Attention role
REQUEST_CHECKS_MODULE = "afd_split.checks.request_checks"
PLAN_TYPES_MODULE = "afd_split.plan.types"
BACKEND_MODULE = "pytest_afd.backends.cpu.backend"


@contextlib.contextmanager
def patched(owner: object, name: str, value: object) -> Iterator[None]:
    """``owner.name = value`` for the block (an unknown name fails: the seam moved)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _patched_in(modules: tuple[str, ...], name: str,
                make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Wrap ``name`` with ``make(original)`` in each of ``modules`` for the block."""
    with contextlib.ExitStack() as stack:
        for module_name in modules:
            module = importlib.import_module(module_name)
            stack.enter_context(patched(module, name, make(getattr(module, name))))
        yield


# ---- adapters ----------------------------------------------------------------


def token_rows_by_request() -> contextlib.AbstractContextManager[None]:
    """Token-indexed fields (slot_mapping, positions) sliced by the ubatch's request rows."""

    def make(_original):
        def faulty(tensor, ubatch, *, with_padding, pad_value, index_cache=None):
            return tensor[..., ubatch.request_slice]

        return faulty

    return _patched_in((ADAPTER_COMMON_MODULE,), "ubatch_token_rows", make)


def head_device_seq_lens_full() -> contextlib.AbstractContextManager[None]:
    """The device seq_lens keep the cut request's whole length in the head (host copies right)."""

    def make(_original):
        def faulty(seq_lens, ubatch, left_over):
            return seq_lens[ubatch.request_slice]

        return faulty

    return _patched_in((ADAPTER_VLLM_MODULE,), "cut_seq_lens", make)


def tail_host_computed_plus_one() -> contextlib.AbstractContextManager[None]:
    """The tail's host computed-tokens copy one too high for its first request (device right)."""

    def make(original):
        def faulty(plan, qsl, seq_lens, computed):
            pieces = original(plan, qsl, seq_lens, computed)
            moved = []
            for index, (part_qsl, part_seq, part_computed, done, left) in enumerate(pieces):
                if index > 0:
                    part_computed = part_computed.copy()
                    part_computed[0] += 1
                moved.append((part_qsl, part_seq, part_computed, done, left))
            return moved

        return faulty

    return _patched_in((ADAPTER_COMMON_MODULE,), "cut_request_arrays", make)


def tail_host_field_plus_one() -> contextlib.AbstractContextManager[None]:
    """The tail's produced host computed-tokens field one too high for its first request.

    Applied to the field values the split produced (``split_fields``'s result, every
    computed-tokens host copy alike), not to the helper that derives them: a check
    that re-derives the split through ``cut_request_arrays`` sees the right values
    and lets it through; only a check that reads the produced ubatches back sees it.
    """

    def make(original):
        def faulty(plan, common, program, recompute, parent, *, padded_rows):
            per_ubatch = original(plan, common, program, recompute, parent, padded_rows=padded_rows)
            for values in per_ubatch[1:]:
                for name in program.computed_sources:
                    field = values.get(name)
                    if field is not None:
                        field = field.clone()
                        field[0] += 1
                        values[name] = field
            return per_ubatch

        return faulty

    return _patched_in((ADAPTER_VLLM_MODULE, ADAPTER_ASCEND_MODULE), "split_fields", make)


def check_rederives_split() -> contextlib.AbstractContextManager[None]:
    """The adapters' check re-derives the split through ``afd_split.engine.common``'s
    ``cut_request_arrays`` (looked up there at each call) instead of reading the
    produced ubatches back: it inherits any fault of that helper and sees none of
    the produced fields."""
    from afd_split.engine.slicing import check_split

    common_module = importlib.import_module(ADAPTER_COMMON_MODULE)

    def make(_original):
        # Named as the function it replaces: a source mutant of it keeps its name in tracebacks.
        def checked_results(plan, common, positions, block_size, program, parent, per_ubatch,
                            results, check):
            produced = [pieces[:3] for pieces in common_module.cut_request_arrays(plan, *parent)]
            check_split(plan, parent, produced, check)
            return results

        return checked_results

    return _patched_in((ADAPTER_VLLM_MODULE, ADAPTER_ASCEND_MODULE), "checked_results", make)


def check_reads_plan() -> contextlib.AbstractContextManager[None]:
    """The adapter's check compares the plan's own split of the parent, not what it produced."""
    from afd_split.checks.requests import cut_request_arrays
    from afd_split.engine.slicing import check_split

    def make(_original):
        def faulty(plan, common, positions, block_size, program, parent, per_ubatch, results,
                   check):
            produced = [pieces[:3] for pieces in cut_request_arrays(plan, *parent)]
            check_split(plan, parent, produced, check)
            return results

        return faulty

    return _patched_in((ADAPTER_VLLM_MODULE, ADAPTER_ASCEND_MODULE), "checked_results", make)


def readback_unchecked() -> contextlib.AbstractContextManager[None]:
    """``checked_results`` (the adapters' field-by-field path: it reads each produced
    ubatch's host copies back and checks them) hands its results back unchecked."""

    def make(_original):
        def faulty(plan, common, positions, block_size, program, parent, per_ubatch, results,
                   check):
            return results

        return faulty

    return _patched_in((ADAPTER_VLLM_MODULE, ADAPTER_ASCEND_MODULE), "checked_results", make)


# ---- checks --------------------------------------------------------------------


def engine_check_unchecked() -> contextlib.AbstractContextManager[None]:
    """``check_engine_step`` hands back its parts (or the plan's own split) unchecked."""
    from afd_split.checks.requests import split_request_fields

    def make(_original):
        def faulty(plan, parent, parts=None):
            return list(parts) if parts is not None else split_request_fields(plan, parent)

        return faulty

    return _patched_in((ENGINE_STEP_MODULE, ENGINE_GLUE_MODULE, ROLES_MODULE), "check_engine_step",
                       make)


def request_check_tail_plus_one() -> contextlib.AbstractContextManager[None]:
    """The request check's bytes path (above 32 requests) accepts a tail's computed count
    one too high."""

    def make(original):
        def faulty(plan, qsl, seq_lens, computed, parts):
            if original(plan, qsl, seq_lens, computed, parts):
                return True
            eased = [parts[0]]
            for part_qsl, part_seq, part_computed in parts[1:]:
                part_computed = part_computed.copy()
                part_computed[0] -= 1
                eased.append((part_qsl, part_seq, part_computed))
            return original(plan, qsl, seq_lens, computed, eased)

        return faulty

    return _patched_in((REQUEST_CHECKS_MODULE,), "_values_hold_bytes", make)


# ---- fingerprint and evidence ----------------------------------------------------


def fingerprint_without_cut() -> contextlib.AbstractContextManager[None]:
    """``SplitPlan.fingerprint`` hashes the inputs and policy but leaves out the cut."""
    import hashlib
    import json

    import numpy as np

    plan_class = importlib.import_module(PLAN_TYPES_MODULE).SplitPlan

    def faulty(self) -> str:
        decision = {"policy": self.policy.value, "constraints": self.constraints.to_dict()}
        digest = hashlib.sha256(json.dumps(decision, sort_keys=True).encode())
        digest.update(np.ascontiguousarray(self.token_counts, dtype="<i8").tobytes())
        return digest.hexdigest()

    return patched(plan_class, "fingerprint", faulty)


def padding_reported_as_real() -> contextlib.AbstractContextManager[None]:
    """``step_record`` reports every ubatch's padding rows as real tokens."""

    def make(original):
        def faulty(plan, **kwargs):
            record = original(plan, **kwargs)
            ubatches = [{**ubatch, "num_real_tokens": ubatch["num_rows"], "num_padded_tokens": 0}
                        for ubatch in record["ubatches"]]
            return {**record, "ubatches": ubatches, "num_real_tokens": record["num_rows"],
                    "num_padded_tokens": 0}

        return faulty

    return _patched_in((BACKEND_MODULE,), "step_record", make)


# ---- PCP builder buffers (the full batch's views) ----------------------------

BUILDER_STATE_MODULE = "afd_split.hook.glue.builder_state"


def _buffers_left_out(name: str) -> contextlib.AbstractContextManager[None]:
    """``builder_state.<name>`` finds no buffer: the stage build writes through it unguarded."""
    module = importlib.import_module(BUILDER_STATE_MODULE)
    return patched(module, name, lambda *_args: [])


def stage_build_shares_builder_slot_buffer() -> contextlib.AbstractContextManager[None]:
    """Stage 0 is built with the full batch's builder and its slot buffer is neither
    restored nor owned by the stage: the full batch's slots become stage 0's padded slots
    (the bug afd-plugin's ``get_metadata_builder(ubid or 0)`` and SFA-CP's
    ``slot_mapping_buf`` make)."""
    return _buffers_left_out("builder_owned_buffers")


def pcp_padded_slot_buffer_reused() -> contextlib.AbstractContextManager[None]:
    """The stage rebuild's ``get_padded_slot_mapping`` leaves the PCP manager's padded-slot
    buffer, which the full batch's MLA-CP / attention-CP slots view, holding the last
    stage's slots (``restore_pcp_manager_state`` does not restore it)."""
    return _buffers_left_out("manager_owned_buffers")


PCP_BUILDER_FAULTS = ("stage_build_shares_builder_slot_buffer", "pcp_padded_slot_buffer_reused")
"""Faults on the PCP stage build's builder-owned buffers (reach PCP topologies only)."""

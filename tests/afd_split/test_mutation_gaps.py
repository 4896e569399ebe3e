"""Faults a second round of sampled mutation runs showed no test would catch (issue 40,
finding 8; docs/ci.md "Mutation testing").

Each test names the mutants it kills; each was checked by re-running those mutants with
``mutmut run NAME`` (or applying them by hand) and seeing the test fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from afd_split import SplitConstraints, SplitInvariantError, plan_split
from afd_split.checks.metadata import BatchMetadata
from afd_split.checks.request_checks import LIST_CHECK_MAX_REQUESTS, check_split_arrays
from afd_split.checks.requests import cut_request_arrays

TB = "token_balanced"


# --- The parent check's conditions, one at a time ---------------------------------------------


def parent_of(num_requests: int):
    rng = np.random.default_rng(num_requests)
    tokens = rng.integers(2, 40, num_requests)
    computed = rng.integers(3, 50, num_requests)
    meta = BatchMetadata.from_requests(tokens, computed)
    plan = plan_split(tokens, policy=TB, constraints=SplitConstraints(align=1))
    return plan, [meta.query_start_loc.copy(), meta.seq_lens.copy(),
                  meta.num_computed_tokens.copy()]


def _qsl_starts_at_one(qsl, seq_lens, computed):
    qsl[0] = 1


def _a_negative_computed_count(qsl, seq_lens, computed):
    computed[1] -= computed[1] + 2  # -2, with seq_len moved along: seq - query == computed
    seq_lens[1] = computed[1] + (qsl[2] - qsl[1])


def _a_seq_len_off_by_two(qsl, seq_lens, computed):
    seq_lens[1] += 2


def _an_interior_query_start_moved(qsl, seq_lens, computed):
    qsl[1] += 1  # query lens no longer the plan's; seq - computed still the plan's counts


PARENT_FAULTS = {
    # fault -> what the error names (diagnose_split's wording)
    _qsl_starts_at_one: r"parent: query_start_loc\[0\]=1, expected 0",
    _a_negative_computed_count: r"parent request 1: num_computed_tokens -2 < 0",
    _a_seq_len_off_by_two: r"parent request 1: num_computed_tokens \d+ != expected \d+",
    _an_interior_query_start_moved: r"parent request 0: query_len \d+ but the plan was made",
}


@pytest.mark.parametrize("num_requests", [3, LIST_CHECK_MAX_REQUESTS + 1])
@pytest.mark.parametrize("fault", list(PARENT_FAULTS), ids=lambda f: f.__name__.strip("_"))
def test_a_parent_fault_the_parts_were_cut_from_is_caught_alone(fault, num_requests):
    """Each fault breaks exactly one of the parent conditions of ``_values_hold_lists`` and
    the parts are cut from the broken parent, so they agree with it: only that condition
    can catch it. Kills the ``or`` -> ``and`` mutants of that condition chain
    (``x__values_hold_lists__mutmut_3`` .. ``_6``) on the list path."""
    plan, parent = parent_of(num_requests)
    fault(*parent)
    parts = [tuple(arrays[:3]) for arrays in cut_request_arrays(plan, *parent)]
    with pytest.raises(SplitInvariantError, match=PARENT_FAULTS[fault]):
        check_split_arrays(plan, *parent, parts)


# --- A part that shares the parent's memory but not its layout --------------------------------


@pytest.mark.parametrize("field", ["slot_mapping", "positions"])
def test_a_strided_view_at_the_parent_s_address_is_not_taken_for_its_slice(field):
    """The head's array starts at the parent's own address but steps over every other token
    (other strides, other values): it is not the parent's slice. Kills ``_same_or_equal``
    ``and`` -> ``or`` (``x__same_or_equal__mutmut_5``) and ``strides ==`` -> ``!=``
    (``_mutmut_13``), which would take a shared address for equality."""
    from afd_split.checks.metadata import split_metadata, validate_split

    tokens = [40, 100, 20]
    parent = BatchMetadata.from_requests(tokens, [0, 64, 0], block_size=16)
    plan = plan_split(tokens, policy=TB, constraints=SplitConstraints(align=8))
    head, tail = split_metadata(plan, parent)
    validate_split(plan, parent, [head, tail])
    whole = getattr(parent, field)
    strided = whole[: 2 * head.num_tokens : 2]
    assert strided.shape == getattr(head, field).shape
    assert strided.__array_interface__["data"][0] == whole.__array_interface__["data"][0]
    broken = dataclasses.replace(head, **{field: strided})
    with pytest.raises(SplitInvariantError, match=f"^ubatch 0: {field} is not the parent's"):
        validate_split(plan, parent, [broken, tail])


# --- PCP relayout of unsigned computed counts, and an all-to-all of mismatched ranks ---------


def test_unsigned_computed_counts_give_the_same_relayout_as_a_list():
    """uint64 counts (numpy promotes uint64 with int64 to float64) are cast to int64 first.
    Kills ``x__layouts__mutmut_9`` (the cast of ``num_computed_tokens`` dropped: the float
    row indices it then makes are refused by numpy)."""
    from afd_split.pcp.relayout import rank_relayout

    plan = plan_split([96, 40], policy=TB, constraints=SplitConstraints(pcp_size=2, align=1),
                      num_computed_tokens=[0, 8], allow_fallback=True)
    assert plan.is_split
    for rank in range(2):
        plain = rank_relayout(plan, [0, 8], rank)
        unsigned = rank_relayout(plan, np.array([0, 8], dtype=np.uint64), rank)
        for name in ("stage_sources", "parent_sources", "stage_positions"):
            assert np.array_equal(getattr(unsigned, name), getattr(plain, name)), name
        assert unsigned.inbound.send_counts == plain.inbound.send_counts


def test_an_all_to_all_of_more_senders_than_exchanges_is_refused():
    """Three ranks' rows and two ranks' counts: a mismatch, not a silent two-rank exchange.
    Kills ``x_emulated_all_to_all__mutmut_4``, ``_7`` and ``_8`` (``zip`` no longer strict)."""
    from afd_split.pcp.relayout import Exchange, emulated_all_to_all

    exchange = Exchange(send_rows=np.arange(2), send_counts=(1, 1), recv_counts=(1, 1))
    sends = [np.array([[10], [11]]), np.array([[20], [21]]), np.array([[30], [31]])]
    assert emulated_all_to_all(sends[:2], [exchange, exchange], 1).tolist() == [[11], [21]]
    with pytest.raises(ValueError, match="zip"):
        emulated_all_to_all(sends, [exchange, exchange], 0)


def test_computed_counts_of_another_length_are_refused_with_both_lengths():
    """Kills ``x_stage_tokens__mutmut_12`` (the ValueError's message dropped)."""
    from afd_split.pcp.stage import stage_tokens

    plan = plan_split([9, 30], policy=TB, constraints=SplitConstraints(pcp_size=2, align=1))
    with pytest.raises(ValueError,
                       match=r"^num_computed_tokens has shape \(3,\); the plan has 2 requests$"):
        stage_tokens(plan, [0, 0, 0])


# --- The diagnosis names the wrong value it found -----------------------------------------


def test_a_wrong_last_seq_len_of_a_three_request_part_is_named_with_its_value():
    """The tail holds requests 0-2 (the first one cut); its last seq_len and computed count
    are both moved by +5, so its own invariant holds and only the comparison with the parent
    finds it. The message names the part's value (request 2's, not request 1's). Kills
    ``x__diagnose_part_against_parent__mutmut_42`` (``seq_lens.item(-1)`` -> ``item(+1)``
    in the message)."""
    from afd_split.checks.diagnosis import diagnose_split

    counts = [40, 10, 10]
    plan = plan_split(counts, policy=TB, constraints=SplitConstraints(align=1))
    tail_ubatch = plan.ubatches[1]
    assert tail_ubatch.request_slice == slice(0, 3) and tail_ubatch.token_slice.start == 30
    parent = [np.asarray(a, dtype=np.int64) for a in request_arrays_of(counts, [0, 3, 7])]
    parts = [tuple(arrays[:3]) for arrays in cut_request_arrays(plan, *parent)]
    qsl, seq_lens, computed = (np.array(a) for a in parts[1])
    assert seq_lens.tolist() == [40, 13, 17] and computed.tolist() == [30, 3, 7]
    seq_lens[-1] += 5
    computed[-1] += 5
    with pytest.raises(SplitInvariantError,
                       match=r"ubatch 1 request 2: seq_len 22 != parent's 17 - 0 tokens left"):
        diagnose_split(plan, *parent, [parts[0], (qsl, seq_lens, computed)])


def request_arrays_of(counts, computed):
    meta = BatchMetadata.from_requests(counts, computed)
    return meta.query_start_loc, meta.seq_lens, meta.num_computed_tokens


# --- engine/slicing.py: a host tensor-like on "cpu", and an unknown check mode ---------------


class _HostTensorLike:
    """A tensor type without torch's ``is_cpu`` (a host buffer of another framework)."""

    def __init__(self, array, device_type):
        self._array = array
        self.device = type("Device", (), {"type": device_type, "__str__": lambda s: device_type})()

    def numpy(self):
        return self._array


def test_a_tensor_like_on_the_cpu_device_is_read_and_one_elsewhere_refused():
    """Kills ``x_host_numpy__mutmut_19`` (the device compared with ``"XXcpuXX"``: every
    host tensor-like would be refused as a device tensor)."""
    from afd_split import UnsupportedSplitError
    from afd_split.engine.slicing import host_numpy

    array = np.arange(4)
    assert host_numpy(_HostTensorLike(array, "cpu")) is array
    with pytest.raises(UnsupportedSplitError, match="host field on device npu"):
        host_numpy(_HostTensorLike(array, "npu"))


def test_an_unknown_check_mode_is_named_with_the_modes_there_are():
    """Kills ``x_check_split__mutmut_2`` (the ValueError's message dropped)."""
    from afd_split.engine.slicing import CHECK_MODES, check_split

    plan = plan_split([4, 4], policy=TB)
    with pytest.raises(ValueError, match=r"^check='everything' is not one of "):
        check_split(plan, (), [], "everything")
    assert "everything" not in CHECK_MODES


# --- PCP rows of torch tensors (the engine path), not only numpy ------------------------------


@pytest.mark.parametrize("pcp", [2, 4])
def test_rank_rows_and_the_gathered_stage_of_a_torch_tensor_equal_numpy_s(pcp):
    """The torch branch of ``rank_rows`` / ``gathered_stage_rows`` (the one engines take).
    Kills ``x_rank_rows__mutmut_16`` and ``x_gathered_stage_rows__mutmut_14``, which only
    the torch branch runs."""
    torch = pytest.importorskip("torch")
    from afd_split.pcp.rows import gathered_stage_rows, rank_rows
    from afd_split.pcp.stage import zigzag_layout

    layout = zigzag_layout([1, 37, 64, 5], pcp)
    rows = (np.arange(107 * 2) + 1000).reshape(107, 2)
    for rank in range(pcp):
        expected = rank_rows(layout, rank, rows, pad_value=-1)
        got = rank_rows(layout, rank, torch.from_numpy(rows), pad_value=-1)
        assert isinstance(got, torch.Tensor) and got.numpy().tolist() == expected.tolist()
    expected = gathered_stage_rows(layout, rows, pad_value=-1)
    got = gathered_stage_rows(layout, torch.from_numpy(rows), pad_value=-1)
    assert isinstance(got, torch.Tensor) and got.numpy().tolist() == expected.tolist()


# --- Messages and flags the recorded run (seed 2026) showed unread ---------------------------


def test_counts_are_returned_read_only():
    """Kills ``x_as_token_counts__mutmut_45`` (the array left writable: a caller's later
    write would change the plan)."""
    from afd_split.plan.planner import as_token_counts

    counts = as_token_counts([3, 4], name="num_scheduled_tokens", minimum=1)
    assert counts.tolist() == [3, 4] and not counts.flags.writeable


def test_computed_plus_scheduled_past_int64_is_named():
    """Kills ``RequestFields.from_requests__mutmut_31`` (the message dropped)."""
    from afd_split.checks.requests import RequestFields

    big = int(np.iinfo(np.int64).max) - 1
    with pytest.raises(ValueError,
                       match=r"^num_computed_tokens \+ num_scheduled_tokens exceed int64$"):
        RequestFields.from_requests([4, 4], [0, big])


def test_an_unknown_policy_lists_the_known_ones():
    """Kills ``x_unsupported_reasons__mutmut_3`` (the known policies dropped)."""
    from afd_split import SplitPolicy
    from afd_split.checks.support import SplitSupportConfig, unsupported_reasons

    known = [member.value for member in SplitPolicy]
    assert "token_balanced" in known
    assert unsupported_reasons(SplitSupportConfig("FlashAttentionBackend", split_policy="balanced")) == [
        f"unknown split policy 'balanced' (known: {known})"]


def test_host_arrays_shorter_than_the_plan_are_named_with_their_source():
    """Kills ``x_parent_host_arrays__mutmut_13`` (the message dropped)."""
    from afd_split.engine.slicing import parent_host_arrays

    plan = plan_split([4, 4, 4], policy=TB)
    with pytest.raises(ValueError, match=r"^engine step 7: query_start_loc_cpu has 3 entries "
                                         r"and the host seq_lens 3, but the plan has 3 requests$"):
        parent_host_arrays(plan, np.array([0, 4, 8]), np.array([4, 4, 4]), None,
                           source=lambda: "engine step 7")

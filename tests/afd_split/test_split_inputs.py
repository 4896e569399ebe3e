"""Bad or unusual inputs of the split path (issue 15): clear errors, no aliasing, no blow-up."""

import json
import tracemalloc

import numpy as np
import pytest

from afd_split import (
    BatchMetadata,
    SplitConstraints,
    SplitInvariantError,
    SplitRejectedError,
    plan_split,
    split_metadata,
)
from afd_split.cli import EXIT_BAD_INPUT, main
from afd_split.plan.scalar import SCALAR_PATH_MAX_REQUESTS

TB = "token_balanced"
HUGE_REQUEST = 2**31
CLI_PEAK_BYTES = 16 * 2**20
"""Far below the 16 GiB that per-token arrays of a 2**31-token request would take."""
VECTOR_PATH_REQUESTS = SCALAR_PATH_MAX_REQUESTS + 1


def run_main(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_block_size_zero_is_a_value_error_naming_block_size():
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        BatchMetadata.from_requests([4, 4], block_size=0)
    for bad in (True, 16.0, np.float64(16), "16"):
        with pytest.raises(ValueError, match="block_size must be an integer"):
            BatchMetadata.from_requests([4, 4], block_size=bad)


def test_cli_block_size_zero_prints_one_line(capsys):
    code, out, err = run_main(["plan", "--tokens", "4,4", "--block-size", "0"], capsys)
    assert code == EXIT_BAD_INPUT and out == ""
    assert err.count("\n") == 1 and "--block-size" in err and "Traceback" not in err


@pytest.mark.parametrize("policy", ["none", TB, "request_boundary"])
@pytest.mark.parametrize(
    "tokens",
    [[2**62, 2**62], np.array([2**62, 2**62]), [2**57] * VECTOR_PATH_REQUESTS],
    ids=["list", "array", "vectorised"],
)
def test_totals_past_int64_are_refused(tokens, policy):
    with pytest.raises(ValueError, match="past the int64 limit"):
        plan_split(tokens, policy=policy)


def test_counts_past_int64_are_refused_by_name():
    with pytest.raises(ValueError, match=r"num_scheduled_tokens\[1\]=9223372036854775808"):
        plan_split(np.array([1, 2**63], dtype=np.uint64), policy=TB)


def test_cli_reports_a_2_31_token_request_without_per_token_arrays(capsys):
    tracemalloc.start()
    try:
        code, out, err = run_main(
            ["plan", "--tokens", str(HUGE_REQUEST), "--align", "8", "--json"], capsys
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 0 and err == ""
    head, tail = json.loads(out)["ubatches"]
    assert head["seq_lens"] == [HUGE_REQUEST // 2] and tail["num_computed_tokens"] == [
        HUGE_REQUEST // 2
    ]
    assert tail["max_blocks"] == HUGE_REQUEST // 128
    assert peak < CLI_PEAK_BYTES


def test_pcp_plan_of_other_per_request_tokens_is_refused_by_validate():
    """Same R and T, other request lengths: the plan's rows would land in the wrong requests."""
    plan = plan_split([2, 2, 4], policy=TB, constraints=SplitConstraints(pcp_size=2))
    metadata = BatchMetadata.from_requests([1, 3, 4])
    with pytest.raises(SplitInvariantError, match=r"plan mismatch: parent request 0"):
        split_metadata(plan, metadata, validate=True)


def test_allow_fallback_falls_back_when_padded_total_cannot_hold_the_split():
    # Split pieces of 5 + 5 pad to 8 + 8 rows under PCP 2; the unsplit 10 tokens need 12.
    constraints = SplitConstraints(pcp_size=2, padded_total=12)
    with pytest.raises(SplitRejectedError, match="would get 4 rows"):
        plan_split([10], policy=TB, constraints=constraints)
    plan = plan_split([10], policy=TB, constraints=constraints, allow_fallback=True)
    assert not plan.is_split and plan.num_rows == 12
    assert "would get 4 rows" in plan.fallback_reason


def test_allow_fallback_names_both_reasons_when_the_fallback_cannot_fit_either():
    constraints = SplitConstraints(align=2, pcp_size=4, padded_total=48)
    with pytest.raises(SplitRejectedError, match="unsplit fallback does not fit either") as err:
        plan_split([5] * 7, policy=TB, constraints=constraints, allow_fallback=True)
    assert "cannot split this batch (ubatch 1 would get" in str(err.value)
    assert "ubatch 0 would get 48 rows" in str(err.value)


def test_numpy_integers_are_accepted_as_knobs_and_bools_floats_refused():
    numpy_knobs = SplitConstraints(
        align=np.int64(8),
        padded_total=np.int64(64),
        pcp_size=np.int32(2),
        min_ubatch_tokens=np.uint8(1),
    )
    assert numpy_knobs == SplitConstraints(align=8, padded_total=64, pcp_size=2)
    assert type(numpy_knobs.align) is int and type(numpy_knobs.padded_total) is int
    tokens = [20, 9]
    plain = plan_split(tokens, policy=TB, constraints=SplitConstraints(align=8, padded_total=64))
    assert plan_split(tokens, policy=TB, constraints=numpy_knobs).split_token == plain.split_token
    metadata = BatchMetadata.from_requests(tokens, block_size=np.int64(16))
    assert metadata.block_size == 16 and type(metadata.block_size) is int
    for name, bad in (
        ("align", True),
        ("align", 8.0),
        ("pcp_size", np.bool_(True)),
        ("padded_total", 64.0),
        ("min_ubatch_tokens", "1"),
    ):
        with pytest.raises(ValueError, match=f"SplitConstraints.{name} must be an integer"):
            SplitConstraints(**{name: bad})


@pytest.mark.parametrize("num_requests", [3, VECTOR_PATH_REQUESTS], ids=["scalar", "vectorised"])
@pytest.mark.parametrize("read_only_view", [False, True])
def test_plan_does_not_follow_later_writes_to_the_callers_array(num_requests, read_only_view):
    array = np.arange(5, 5 + num_requests, dtype=np.int64)
    given = array
    if read_only_view:  # read-only, but a view of memory the caller still writes
        given = array.view()
        given.setflags(write=False)
    plan = plan_split(given, policy=TB)
    before = (plan.token_counts.tolist(), plan.fingerprint())
    array[0] = 100
    assert (plan.token_counts.tolist(), plan.fingerprint()) == before
    assert not plan.token_counts.flags.writeable

"""--afd-ab A B: every stage case measured with option set A and with B, alternating
repetition by repetition in one session; both results written; the verdict compares them."""

from __future__ import annotations

import pytest
from scripted_backend import ab_case_sides, measure_ab_alternating

from pytest_afd.core.backend import CAP_CHUNKED_PREFILL, CAP_PREFIX_CACHE, CAP_SPLIT
from pytest_afd.run import ab
from pytest_afd.stats import conclusions

AB = ab.parse(["split_policy=request_boundary", "split_policy=token_balanced,chunk_size=64"])


def test_each_case_runs_with_both_option_sets_alternately(make_runner):
    # Side B chunks: without chunked prefill the case would skip and nothing would run.
    runner, backend = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE, CAP_CHUNKED_PREFILL})
    runner.ab = AB
    measured = measure_ab_alternating(runner)  # A, B, A, B ... per repetition
    assert measured["x/ab-A"].case.settings.split_policy == "request_boundary"
    assert measured["x/ab-B"].case.settings.split_policy == "token_balanced"
    assert measured["x/ab-B"].case.settings.chunk_size == 64
    assert measured["x"] is measured["x/ab-A"]  # the stage's own checks read side A
    ids = sorted(doc["case_id"] for doc in runner.writer.docs)
    assert ids == sorted(f"runner-test/{side}" for side in ab_case_sides())  # four results, once each
    ran = [settings for name, settings in backend.calls if name == "run"]
    assert len(ran) == 4 * (1 + 3)
    text = conclusions.ab_text(runner.writer.docs)
    assert text.startswith("interleaved A/B: B / A geometric mean x1 over 2 case(s)")
    assert text.endswith(": no difference")


@pytest.mark.parametrize(("values", "named"), [
    (["chunk_size=8192", "chunk_sise=16384"], "B 'chunk_sise=16384': unknown field 'chunk_sise'"),
    (["chunk_size", "chunk_size=1"], "A 'chunk_size': 'chunk_size' is not field=value"),
    (["instrument=true", "chunk_size=1"], "unknown field 'instrument'"),
])  # fmt: skip
def test_a_bad_option_set_names_the_flag_side_and_field(values, named):
    with pytest.raises(ValueError, match="--afd-ab") as error:
        ab.parse(values)
    assert named in str(error.value)


def test_values_are_typed():
    assert ab.parse_side("chunk_size=none,prefix_caching=true,split_align=8", "A") == {
        "chunk_size": None, "prefix_caching": True, "split_align": 8}

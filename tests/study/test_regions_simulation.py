"""The region pipeline by seeded simulation: the planted boundary is found, A/A studies call nothing.

Each simulated study is a full set of result documents (tests/support/study_data.py)
taken through ``tested_points`` and ``all_series``, as ``study publish`` does.
"""

import math

import pytest

from pytest_afd.study import effects, regions
from tests.support import study_data as sd

STUDIES = 40
CV = 0.03  # repetition noise (log-normal sigma) of every case
POLICY_CALLS = (effects.TOKEN_BALANCED, effects.REQUEST_BOUNDARY)


@pytest.fixture(scope="module")
def manifest():
    return sd.make_manifest()


def _series(manifest, seed, **kwargs):
    docs = sd.planted_pairs(manifest=manifest, seed=seed, cv=CV, **kwargs)
    (series,) = regions.all_series(regions.tested_points(docs))
    return series


def test_the_planted_boundary_is_recovered_in_nearly_every_study(manifest):
    recovered = 0
    for seed in range(STUDIES):
        series = _series(manifest, seed)
        into = [b["between"] for b in series["boundaries"] if b["to_call"] == effects.TOKEN_BALANCED]
        above = series["regions"][-1]
        effect = above["effect"]["prefill_tokens_per_s"]
        recovered += (into == [[0.2, 0.4]] and above["conditions"]["realized_imbalance"]["low"] == 0.4
                      and effect["low"] <= sd.PLANTED_RATIO <= effect["high"])
    assert recovered / STUDIES >= 0.9, f"boundary and effect recovered in {recovered} of {STUDIES}"


def test_aa_studies_make_no_policy_call(manifest):
    points = studies_with_a_call = 0
    false = 0
    for seed in range(STUDIES):
        series = _series(manifest, seed + 1000, threshold=math.inf)
        calls = [p["call"] for r in series["regions"] for p in r["points"]]
        points += len(calls)
        false += sum(call in POLICY_CALLS for call in calls)
        studies_with_a_call += any(call in POLICY_CALLS for call in calls)
    assert false / points <= 0.05, f"{false} false calls in {points} A/A points"
    # The series' intervals are simultaneous (Bonferroni): the family-wise rate stays under 5 %.
    assert studies_with_a_call / STUDIES <= 0.05

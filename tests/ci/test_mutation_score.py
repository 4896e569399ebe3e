"""The mutation score's arithmetic (benchmarks/mutation_score_bench.py): killed over killed plus
non-equivalent survivors; equivalent survivors need a reason; unjudged mutants never count
as killed; the checked-in equivalents file parses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import mutation_score_bench as ms  # noqa: E402

A, B, C, D, E = (f"afd_split.plan.constraints.x_f__mutmut_{i}" for i in range(1, 6))


def test_score_excludes_equivalents_and_unjudged():
    results = {A: 1, B: 3, C: 0, D: 0, E: 33}  # killed, killed (pytest error), 2 survived, no test
    doc = ms.score([A, B, C, D, E], results, {D: "the same value either way"})
    assert (doc["killed"], doc["survived_non_equivalent"], doc["survived_equivalent"],
            doc["not_judged"]) == (2, 1, 1, 1)
    assert doc["score"] == pytest.approx(2 / 3) and doc["met"] is False
    assert doc["survivors"] == [C] and doc["equivalent_survivors"] == {D: "the same value either way"}


def test_the_target_is_ninety_percent_and_nothing_judged_is_absent():
    nine = [f"m.x__mutmut_{i}" for i in range(10)]
    results = {m: 1 for m in nine[:9]} | {nine[9]: 0}
    assert ms.score(nine, results, {})["met"] is True  # 9 of 10
    results[nine[8]] = 0
    assert ms.score(nine, results, {})["met"] is False  # 8 of 10
    empty = ms.score([A], {A: None}, {})
    assert empty["score"] is None and empty["met"] is False
    assert empty["score_absent_reason"] == "no sampled mutant was judged"


def test_module_of_a_mutant_name():
    assert ms.module_of("afd_split.plan.constraints.x_round_up__mutmut_3") == \
        "afd_split.plan.constraints"
    assert ms.module_of("afd_split.pcp.stage.xǁZigzagLayoutǁrows__mutmut_1") == \
        "afd_split.pcp.stage"


def test_an_equivalent_without_a_reason_is_refused(tmp_path):
    path = tmp_path / "eq.toml"
    path.write_text(f'[[equivalent]]\nmutant = "{A}"\nreason = " "\n')
    with pytest.raises(ValueError, match=r"equivalent\[0\] needs a mutant name and a reason"):
        ms.load_equivalents(path)


def test_the_checked_in_equivalents_parse():
    found = ms.load_equivalents(ms.EQUIVALENTS)
    assert all(name.startswith("afd_split.") and reason for name, reason in found.items())


def test_the_score_carries_a_wilson_95_interval():
    """Reference values: Wilson's interval for 45 of 50 (0.7864-0.9565) and 0 of 10
    (0-0.2775), as scipy's ``binomtest(k, n).proportion_ci(method="wilson")`` gives them."""
    low, high = ms.wilson_interval(45, 50)
    assert low == pytest.approx(0.7864, abs=1e-4) and high == pytest.approx(0.9565, abs=1e-4)
    low, high = ms.wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    assert ms.wilson_interval(0, 0) is None
    doc = ms.score(["a", "b"], {"a": 1, "b": 0}, {})
    assert doc["score_95_interval"] == ms.wilson_interval(1, 2)

"""sequential_sim_bench runs end to end on the committed noise, every target with a met flag."""

import json
import math

import numpy as np
import pytest

from tests.support.bench_module import bench_fixture

bench = bench_fixture("sequential_sim_bench")


def test_noise_file_is_the_harness_record_with_provenance(bench):
    document = json.loads(bench.DATA.read_text())
    assert "command" in document["provenance"] and "commit" in document["provenance"]
    lengths = {len(v[m]) for v in document["cases"].values() for m in bench.METRICS}
    assert lengths == {document["protocol"]["repetitions"]}
    pool = bench.noise_pool(document, "cpu_time_s")
    cases = len(document["cases"])
    assert pool.size == cases * (cases - 1) * document["protocol"]["repetitions"]
    assert abs(pool.mean()) < 1e-12  # both orders of every pair: symmetric about 0


def test_report_has_every_target_with_a_met_flag(bench, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert bench.main(["--sessions", "60", "--family-sequences", "20000",
                       "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [entry["metric"] for entry in report["metrics"]] == list(bench.METRICS)
    for entry in report["metrics"]:
        for row in entry["designs"]:
            targets = row["targets"]
            assert targets["aa_false_calls"]["met"] == (targets["aa_false_calls"]["measured"] <= 0.05)
            assert targets["power_1_2x"]["met"] == (targets["power_1_2x"]["measured"] >= 0.8)
            assert sum(row["aa"]["stopped"].values()) == 60 * bench.AA_SESSIONS_FACTOR
            assert 3 <= row["aa"]["mean_repetitions"] <= row["max_repetitions"]
        assert {row["design"] for row in entry["designs"]} == {"calibrated", "bonferroni_before"}
        bound = entry["known_sd_bound"]
        assert bound["looks"][0] == 2 and bound["fixed_z_test_n_at_equal_power"] >= 1
    families = {row["family"]: row for row in report["metrics"][0]["design_families"]}
    assert "design_families" not in report["metrics"][1]  # searched on CPU-time noise only
    # Validity is measured: the calibrated rules pass the check, the ceiling fails it.
    assert {name for name, row in families.items() if not row["valid"]} == {
        "ceiling_single_look_minimum"}
    assert families["ceiling_single_look_minimum"]["any_look_crossing_fresh_paths"] > 0.1
    for row in families.values():
        assert len(row["fresh_sessions"]) == len(bench.FRESH_SEED_OFFSETS)
        assert row["meets_all_on_every_session_set"] == (
            row["meets_all"] and all(c["ratio_mix"] is not None and c["ratio_mix"] >= 2
                                     and c["power"] >= 0.8 and c["aa_false_calls"] <= 0.05
                                     for c in row["fresh_sessions"]))
    assert capsys.readouterr().out.startswith("sequential_sim_bench: ")


def test_fixed_power_is_the_hand_computed_t_test(bench):
    draws = np.array([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [0.5, -0.5, 0.0]])
    # Row 0: t = 0.2 / (0.1 / sqrt 3) = 3.46 < t(0.975, 2) = 4.30: not called; shifted by
    # log 1.2: t = 0.382 / 0.0577 = 6.6: called. Row 1 has no variance (t taken as 0), row 2
    # a zero mean.
    assert bench.fixed_power(draws, 0.0, 3) == 0.0
    assert bench.fixed_power(draws[:1], math.log(1.2), 3) == 1.0


def test_the_families_vectorized_rule_decides_as_decide_sequence(bench):
    """The families' evaluator, given the default design's boundaries, reaches the same
    calls, directions and repetitions as the production rule session by session."""
    sequential_families = bench.sequential_families

    from pytest_afd.stats.sequential import SequentialDesign, t_quantile

    design = SequentialDesign()
    efficacy = {n: t_quantile(1 - design.look_alpha / 2, n - 1) for n in design.looks}
    futility = {n: t_quantile(1 - design.futility_look_level, n - 1) for n in design.looks}
    pool = bench.noise_pool(json.loads(bench.DATA.read_text()), "cpu_time_s")
    draws = bench.sessions(pool, 300, design.max_repetitions, seed=5)
    for shift in (0.0, math.log(1.2), -math.log(1.5)):
        fast = sequential_families.run_rule(design.looks, efficacy, futility, draws, shift)
        slow = bench.run_design(design, draws, shift)
        for key in ("calls", "right_direction", "mean_repetitions"):
            assert fast[key] == pytest.approx(slow[key], abs=1e-12)
        assert fast["equivalent"] == pytest.approx(slow["stopped"].get("equivalent", 0) / 300)


def test_the_families_flat_shape_is_the_default_calibration(bench):
    """Pocock's shape in the families module gives the production rule's per-look quantile
    on the same paths (two calibrations of one boundary, by different code)."""
    sequential_families = bench.sequential_families

    from pytest_afd.stats.sequential_bounds import calibrated_look_level
    from pytest_afd.stats.student_t import t_quantile

    looks = tuple(range(3, 17))
    flat = sequential_families.power_family(looks, 0.045, 2, 0.5, sequences=20_000)
    level = calibrated_look_level(looks, 0.045, 2, sequences=20_000)
    for n in looks:
        assert flat[n] == pytest.approx(t_quantile(1 - level / 2, n - 1), rel=1e-3)

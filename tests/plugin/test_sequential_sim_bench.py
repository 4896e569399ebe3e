"""sequential_sim_bench runs end to end on the committed noise, every target with a met flag."""

import json
import math

import numpy as np

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
    assert bench.main(["--sessions", "60", "--output", str(out)]) == 0
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
    assert capsys.readouterr().out.startswith("sequential_sim_bench: ")


def test_fixed_power_is_the_hand_computed_t_test(bench):
    draws = np.array([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [0.5, -0.5, 0.0]])
    # Row 0: t = 0.2 / (0.1 / sqrt 3) = 3.46 < t(0.975, 2) = 4.30: not called; shifted by
    # log 1.2: t = 0.382 / 0.0577 = 6.6: called. Row 1 has no variance (t taken as 0), row 2
    # a zero mean.
    assert bench.fixed_power(draws, 0.0, 3) == 0.0
    assert bench.fixed_power(draws[:1], math.log(1.2), 3) == 1.0

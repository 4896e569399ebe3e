"""suite_time_bench judges its targets as issue 43 states them (no suite is run here)."""

from tests.support.bench_module import bench_fixture

bench = bench_fixture("suite_time_bench")


def _met(targets):
    return {t["name"]: t["met"] for t in targets}


def test_a_quiet_fast_run_meets_both_and_a_loaded_one_meets_only_cpu(bench):
    quiet = bench.judge(bench.GATE, wall_s=25, cpu_s=20, load_before=0.4, load_after=0.9,
                        exit_status=0)
    assert _met(quiet) == {"gate_wall_s": True, "gate_cpu_s": True}
    loaded = bench.judge(bench.GATE, wall_s=25, cpu_s=20, load_before=1.2, load_after=0.4,
                         exit_status=0)
    assert _met(loaded) == {"gate_wall_s": False, "gate_cpu_s": True}
    assert loaded[0]["load_ok"] is False and loaded[0]["load_1m"] == 1.2
    # The run's own workers raise the load it ends at: judged on the load it started at.
    own = bench.judge(bench.DEFAULT_RUN, wall_s=170, cpu_s=300, load_before=0.6,
                      load_after=2.1, exit_status=0)
    assert _met(own) == {"default_run_wall_s": True, "default_run_cpu_s": True}


def test_settle_waits_for_the_load_to_decay_and_gives_up_at_its_limit(bench, monkeypatch):
    loads = iter([2.0, 1.5, 1.1, 0.9, 0.8])
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(bench.time, "sleep", lambda _s: None)
    bench.settle(max_load=1.0, max_wait_s=60.0, poll_s=0.0)
    assert next(loads) == 0.8  # stopped at the first load below 1
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (5.0, 0.0, 0.0))
    assert bench.settle(max_load=1.0, max_wait_s=0.05, poll_s=0.0) >= 0.0  # gives up


def test_over_a_limit_or_a_failed_run_is_not_met(bench):
    slow = bench.judge(bench.DEFAULT_RUN, wall_s=181, cpu_s=331, load_before=0.1,
                       load_after=0.1, exit_status=0)
    assert _met(slow) == {"default_run_wall_s": False, "default_run_cpu_s": False}
    failed = bench.judge(bench.GATE, wall_s=1, cpu_s=1, load_before=0, load_after=0,
                         exit_status=1)
    assert not any(t["met"] for t in failed)


def test_counts_and_summary_name_every_target(bench):
    line = "144 passed, 4 skipped, 72 deselected in 82.73s (0:01:22)"
    assert bench.counts(line) == {"passed": 144, "skipped": 4, "deselected": 72}
    assert bench.counts("1 failed, 2 errors in 3s") == {"failed": 1, "error": 2}
    run = {"load_1m_before": 0.5, "load_1m_after": 0.7, "counts": {"passed": 1}, "cpu_s": 20,
           "targets": bench.judge(bench.GATE, wall_s=40, cpu_s=20, load_before=0.5,
                                  load_after=0.7, exit_status=0)}
    text = bench.summary({"gate": run})
    assert text.startswith("suite_time: 1/2 targets met")
    assert "gate_wall_s=40/30!" in text and "gate_cpu_s=20/28," not in text
    assert "gate_cpu_s=20/28 " in text


def test_the_parallel_gate_is_judged_on_wall_time_and_reports_its_cpu(bench):
    quick = bench.judge(bench.GATE_PARALLEL, wall_s=24, cpu_s=41, load_before=0.3,
                        load_after=0.8, exit_status=0)
    assert _met(quick) == {"gate_n2_wall_s": True}
    run = {"load_1m_before": 0.3, "load_1m_after": 0.8, "counts": {"passed": 144},
           "cpu_s": 41, "targets": quick}
    assert "gate_n2_wall_s=24/30 (CPU 41 s, load 0.30 at the start, 0.80 at the end" in \
        bench.summary({"gate_n2": run})
    assert bench.GATE_PARALLEL.argv == ("-m", "gate", "-n", "2", "--dist", "worksteal")
    assert bench.DEFAULT_RUN.argv == ("-n", "2", "--dist", "worksteal")  # the README's command


def test_a_failed_run_names_its_failed_tests(bench):
    stdout = ("....F\n=== short test summary info ===\n"
              "FAILED tests/a/test_x.py::test_one[p] - AssertionError: 1 == 2\n"
              "ERROR tests/b/test_y.py::test_two - RuntimeError\n"
              "SKIPPED [1] tests/c.py:3: no\n1 failed, 1 error in 3s\n")
    assert bench.failed_tests(stdout) == ["tests/a/test_x.py::test_one[p]",
                                          "tests/b/test_y.py::test_two"]
    assert bench.failed_tests("5 passed in 1s\n") == []

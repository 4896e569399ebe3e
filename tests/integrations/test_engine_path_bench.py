"""engine_path_bench runs end to end and reports every target with a met flag (no timing asserted)."""

import json
import sys

import numpy as np
import pytest

from afd_split import plan_split
from afd_split.hook.planning.threshold import DEFAULT_SPLIT_MIN_TOKENS
from tests.support.bench_module import BENCH_DIR, bench_fixture

bench = bench_fixture("engine_path_bench")


def test_report_has_every_target_with_fractions_and_load(bench, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert bench.main(["--samples", "2", "--calls", "1", "--passes", "1", "--sizes", "1",
                       "--repeats", "0", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    layouts = report["metadata_layouts"]
    assert len(layouts) == 3 and layouts[1:] == ["vllm-ascend-v0.19.1rc1-standin",
                                                 "vllm-ascend-v0.26.0rc-standin"]
    # One target per layout and batch size: the recipe's 32 requests filling 140,000 tokens
    # and one request (issue 43: every size), each against the NPU step of its tokens.
    assert [(t["layout"], t["batch"], t["num_requests"]) for t in report["targets"]] == [
        (layout, batch, n) for layout in layouts for batch, n in (("recipe", 32), ("sizes", 1))]
    for target in report["targets"]:
        if target["batch"] == "recipe":
            assert target["num_tokens"] == 140_000
            assert target["npu_step_us"] == pytest.approx(140_000 / (6688 * 32) * 1e6)
        assert target["max_fraction"] == 0.01 and isinstance(target["met"], bool)
        assert target["met"] == (target["measured_fraction"] <= 0.01)
        # The target is the deployed hook (threshold on): one request's step is left
        # unsplit, the recipe's is split; the forced split (threshold 0) is reported beside it,
        # its host cost including the builder-state guard.
        assert target["mode"] == f"deployed (AFD_SPLIT_MIN_TOKENS={DEFAULT_SPLIT_MIN_TOKENS})"
        assert target["deployed_split"] == (target["num_tokens"] >= DEFAULT_SPLIT_MIN_TOKENS)
        assert target["deployed_split"] == (target["batch"] == "recipe")
        assert target["host_cost_thread_cpu_us"] > 0
        assert (0 < target["builder_state_guard_thread_cpu_us"]
                < target["forced_split_host_cost_thread_cpu_us"])
        assert target["measured_fraction"] == pytest.approx(
            target["host_cost_thread_cpu_us"] / target["npu_step_us"])
        assert target["forced_split_fraction"] == pytest.approx(
            target["forced_split_host_cost_thread_cpu_us"] / target["npu_step_us"])
        assert target["forced_split_within_budget"] == (target["forced_split_fraction"] <= 0.01)
        assert target["budget_us"] == pytest.approx(target["npu_step_us"] / 100)
        assert target["ratio_deployed_to_plugin_thread_cpu"] > 0
        assert target["npu_step_us"] == pytest.approx(target["num_tokens"] / 214_016 * 1e6)
        assert target["ratio_engine_to_plugin_thread_cpu"] > 0
        assert target["builder_state_guard_whole_buffers_thread_cpu_us"] > 0
    # The guard copies only the step's bound: one request's step copies far fewer bytes.
    one, recipe = (next(r for r in report["sizes"] if r["num_requests"] == n) for n in (1, 32))
    assert one["guarded_bytes_per_step"] < recipe["guarded_bytes_per_step"]
    assert recipe["guarded_bytes_per_step"] <= report["builder_state_guard"]["guarded_bytes"]
    guard = report["builder_state_guard"]
    assert guard["pcp"] == 8 and guard["guarded_buffers"] == 3  # two SFA-CP bufs + padded slots
    assert guard["stage_fields_owned_per_step"] == 2
    assert report["split_min_tokens"] == DEFAULT_SPLIT_MIN_TOKENS
    assert report["suggested_split_min_tokens_p90"] >= 1
    assert len(report["load_average_before"]) == 3 and isinstance(report["load_ok"], bool)
    assert len(report["load_attempts"]) == 1 and report["torch_threads"] == 1
    assert report["process_cpu_s"]["user"] > 0
    context = report["context_host_cost_vs_modelled_step"]["per_layout_and_size"]
    assert [row["batch"] for row in context] == ["recipe", "sizes"] * 3
    assert all(0 < row["host_fraction"] < 1 for row in context)
    # The plugin does not split one request: the context row says so.
    assert all(("note" in row) == (row["num_requests"] == 1) for row in context)
    # The summary is the last line: importing a real vLLM logs an INFO line to stdout first.
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("engine_path_bench: ")
    for row in report["sizes"]:
        # The floor of the breakdown replays exactly the adapter's device ops.
        assert row["floor_matches_adapter_ops"], row["adapter_aten_ops"]
        assert set(row["breakdown_thread_cpu_us"]) == {
            "engine_plan_only", "adapter_split", "request_check", "torch_ops_floor"}


def test_the_threshold_setting_moves_the_deployed_split_and_a_bad_one_is_named(bench, tmp_path,
                                                                                 capsys):
    out = tmp_path / "report.json"
    assert bench.main(["--samples", "1", "--calls", "1", "--passes", "1", "--sizes", "1",
                       "--repeats", "0", "--layouts", "vllm-ascend-v0.19.1rc1-standin",
                       "--split-min-tokens", "0", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["split_min_tokens"] == 0
    assert [t["deployed_split"] for t in report["targets"]] == [True, True]
    assert "AFD_SPLIT_MIN_TOKENS=0" in capsys.readouterr().out.strip().splitlines()[-1]
    with pytest.raises(SystemExit):
        bench.main(["--split-min-tokens", "-1"])
    assert "--split-min-tokens=-1 must be >= 0" in capsys.readouterr().err


def test_a_cost_model_file_sets_the_modelled_step(bench, tmp_path):
    """A calibrated model (here: steps 1000x shorter) moves the fraction; a bad file is named."""
    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    fields = {"attention_per_token_s": 1e-5, "attention_per_key_s": 2e-8,
              "expert_per_token_s": 3e-5, "attention_fixed_s": 2e-4, "expert_fixed_s": 2e-4}
    slow.write_text(json.dumps(fields))
    fast.write_text(json.dumps({name: value / 1000 for name, value in fields.items()}))
    assert bench.load_cost_model(slow).source == str(slow)
    lengths = np.array([1000, 3000])
    step = {path: bench.modelled_plan_cost(bench.load_cost_model(path), lengths, None, 2000)
            ["makespan_s"] for path in (slow, fast)}
    assert step[slow] == pytest.approx(1000 * step[fast])
    bad = tmp_path / "bad.json"
    bad.write_text('{"attention_per_token_s": -1}')
    with pytest.raises(SystemExit, match=r"--cost-model=.*bad\.json"):
        bench.load_cost_model(bad)


def test_the_recipe_batch_fills_the_token_budget(bench):
    lengths = bench.prompt_lengths(32, offset=0, fill=True)
    assert len(lengths) == 32 and lengths.sum() == 140_000 and lengths.min() >= 1
    assert bench.prompt_lengths(8, offset=0).sum() < 140_000  # other sizes are not filled


def test_a_loaded_run_is_repeated_then_flagged(monkeypatch):
    """Above the load limit the run repeats, keeps its quietest attempt and says load_ok=False."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import bench_load
    finally:
        sys.path.remove(str(BENCH_DIR))
    loads = iter([(5.0, 1, 1), (4.0, 1, 1), (3.0, 1, 1), (2.5, 1, 1), (1.5, 1, 1), (1.0, 1, 1)])
    monkeypatch.setattr(bench_load.os, "getloadavg", lambda: next(loads))
    runs = iter(range(3))
    slept = []
    report = bench_load.run_until_quiet(lambda: {"run": next(runs)}, repeats=1, sleep=slept.append)
    assert report["run"] == 1 and report["load_ok"] is False and len(slept) == 1
    assert report["load_attempts"] == [{"load_1m_before": 5.0, "load_1m_after": 4.0},
                                       {"load_1m_before": 3.0, "load_1m_after": 2.5}]
    quiet = bench_load.run_until_quiet(lambda: {"run": next(runs)}, repeats=3, sleep=slept.append)
    assert quiet["load_ok"] is True and len(quiet["load_attempts"]) == 1
    assert "NOT a clean run" in bench_load.load_note(report)


@pytest.mark.parametrize("seed", range(5))
def test_plugin_style_search_picks_the_request_boundary_policys_cut(bench, seed):
    lengths = np.random.default_rng(seed).integers(1, 5000, 40)
    head, tail = bench.plugin_style_request_boundary(lengths)
    plan = plan_split(lengths, policy="request_boundary")
    assert head[1].stop == tail[1].start == plan.split_token
    assert head[0].stop == plan.ubatches[1].request_slice.start


def test_the_suggested_threshold_leaves_every_size_over_budget_unsplit(bench):
    """Past the largest size whose forced split exceeds 1% of its step, and past that
    cost's break-even step; 0 when every forced split fits (plain arithmetic, no timing)."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        from engine_path_targets import suggested_split_min_tokens
    finally:
        sys.path.remove(str(BENCH_DIR))
    from afd_split.plan.npu_step import RECIPE_NPU_STEP

    def row(tokens, cost_us):
        return {"num_tokens": tokens, "forced_host_cost_thread_cpu_us": {"p90": cost_us}}

    rows = [row(374, 400.0), row(9_492, 531.0), row(16_391, 540.0), row(140_000, 1000.0)]
    # 9,492 tokens at 531 us: over its 443.5 us budget; fits from 531e-6 / 1% x 214,016
    # = 11,364.25 tokens, rounded up.
    assert suggested_split_min_tokens(rows, RECIPE_NPU_STEP) == 11_365
    assert suggested_split_min_tokens([row(9_492, 100.0)], RECIPE_NPU_STEP) == 0
    # 50 us over a 1,000-token step's 46.7 us budget: fits from 1,070.08 tokens.
    assert suggested_split_min_tokens([row(1_000, 50.0)], RECIPE_NPU_STEP) == 1_071

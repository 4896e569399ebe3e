"""The listing's device-time estimate and case order (pytest_afd.scheduling.study_cost), by hand."""

import json

import pytest

from afd_split.plan.npu_step import RECIPE_NPU_STEP, NpuStepModel
from pytest_afd.scheduling import study_cost


def test_the_recipe_step_is_the_cloudmatrix_figure_on_32_npus():
    # 140,000 tokens / (6,688 tokens/s/NPU x (24 Attention + 8 FFN) NPUs) = 0.6541 s
    assert RECIPE_NPU_STEP.npus == 32
    assert RECIPE_NPU_STEP.step_s(140_000) == pytest.approx(140_000 / 214_016)
    assert round(RECIPE_NPU_STEP.step_s(140_000), 3) == 0.654
    with pytest.raises(ValueError, match="npus must be >= 1, got 0"):
        NpuStepModel(npus=0)


def test_estimate_matches_a_hand_computation():
    # 3 deploys x 600 s + 12 measured cases x (1 warmup + 3 repetitions) runs x 0.6541 s
    got = study_cost.estimate(runs_per_repetition=12, cases=1, deploys=3, deploys_separately=5,
                              deploy_s=600.0, deploy_source="test", warmups=1,
                              repetitions=(3, 3))
    step = 140_000 / (6688 * 32)
    hand = 3 * 600 + 12 * 4 * step
    assert got["device_s"] == {"low": pytest.approx(hand), "high": pytest.approx(hand)}
    assert got["npu_hours"]["low"] == pytest.approx(hand * 32 / 3600)
    assert got["runs"] == {"low": 48, "high": 48}
    assert "3 deploys x 600 s + 48 runs x 0.654 s" in got["summary"]
    assert any("upper bound" in a for a in got["assumptions"])
    sequential = study_cost.estimate(runs_per_repetition=12, cases=1, deploys=3,
                                     deploys_separately=5, deploy_s=600.0, deploy_source="t",
                                     warmups=1, repetitions=(3, 16))
    assert sequential["device_s"]["high"] == pytest.approx(3 * 600 + 12 * 17 * step)
    assert "48-204 runs" in sequential["summary"]


KEYS = {"a1": ["none", "tb", "rb"], "a2": ["none", "tb", "rb"], "b1": ["tb-prefix"],
        "c1": ["none", "tb", "rb"], "d1": ["tb", "tb-chunk"], "gate": []}


def test_configuration_order_groups_shared_configurations_and_deploys_each_once():
    selected = ["gate", "a1", "b1", "d1", "c1", "a2"]
    order = study_cost.configuration_order(selected, KEYS)
    assert order == ["gate", "a1", "c1", "a2", "d1", "b1"]
    assert study_cost.deploys_needed(order, KEYS) == 5  # none, tb, rb, tb-chunk, tb-prefix
    # The same cases as one session per stage (a, b, c, d) deploy their sets each.
    stages = {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1"], "d": ["d1"], "gate": ["gate"]}
    assert study_cost.deploys_by_session(stages, KEYS) == 3 + 1 + 3 + 2


def test_deploys_needed_replays_the_stop_rule():
    # c1 stays up across q (r still declares it), so it deploys once; a lone case's
    # configuration once too.
    assert study_cost.deploys_needed(["p", "q", "r"], {"p": ["c1"], "q": ["c2"], "r": ["c1"]}) == 2
    assert study_cost.deploys_needed(["p", "q"], {"p": ["c1"], "q": ["c1"]}) == 1


def test_deploy_time_flag_beats_recordings_and_recordings_beat_the_default(tmp_path):
    seconds, source = study_cost.deploy_time(None, tmp_path)
    assert seconds == study_cost.DEFAULT_DEPLOY_TIME_S and "stated default" in source
    recorded = tmp_path / "deployments" / "dp3pcp8-ep8-reduced" / study_cost.DEPLOY_TIMES_FILE
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps({"k1": [300.0, 500.0], "k2": [400.0]}))
    seconds, source = study_cost.deploy_time(None, tmp_path)
    assert seconds == 400.0 and "median of 3" in source
    assert study_cost.deploy_time(120.0, tmp_path) == (120.0, "--afd-deploy-time-s")
    recorded.write_text(json.dumps({"k1": [0]}))
    with pytest.raises(ValueError, match=r"'k1' must list deploy seconds > 0, got \[0\]"):
        study_cost.deploy_time(None, tmp_path)


def test_the_listing_reads_the_file_the_deploy_pool_writes():
    from pytest_afd.backends.vllm_ascend.deployments import DEPLOY_TIMES_FILE

    assert study_cost.DEPLOY_TIMES_FILE == DEPLOY_TIMES_FILE

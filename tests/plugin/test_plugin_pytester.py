"""The plugin end to end through pytester: options, markers, skips, golden, results, xdist."""

import json

import pytest

from pytest_afd.session import EXIT_BACKEND_UNAVAILABLE
from tests.support.forked_pytest import runpytest_forked

pytest_plugins = ["pytester"]

FAKE_CONFTEST = """
import os
import pytest
from pytest_afd.backends.base import BackendUnavailable, RequestOutput, RunOutputs
from pytest_afd import results


class FakeBackend:
    name = "fake"
    capabilities = frozenset()

    def run(self, prompts, settings):
        return RunOutputs(
            requests=[RequestOutput(p.request_id, p.num_prompt_tokens, 0, 1, ttft_s=0.01) for p in prompts],
            steps=[{"policy": settings.split_policy, "split_token": None, "imbalance": None,
                    "ubatches": [{"num_real_tokens": sum(p.num_prompt_tokens for p in prompts),
                                  "num_padded_tokens": 0}]}],
            expert_load=[[4, 4, 4, 4, 4, 4, 4, 4]], wall_time_s=0.5)

    def reset_prefix_cache(self):
        pass

    def describe(self):
        return {"model": {"num_layers": 2}, "device_type": "fake-npu"}

    def close(self):
        with open(os.environ["FAKE_CLOSED_FILE"], "a") as handle:
            handle.write("closed\\n")


def pytest_afd_create_backend(config, name, topology, model_name, seed, results_dir):
    if os.environ.get("FAKE_UNAVAILABLE"):
        raise BackendUnavailable("no fake NPU here")
    return FakeBackend()


def pytest_afd_manifest(config, manifest):
    manifest["hardware"]["rack"] = "r1"


def pytest_afd_result_written(config, path, result):
    with open("written.txt", "a") as handle:
        handle.write(result["case_id"] + "\\n")


@pytest.fixture
def record_case(afd_backend, afd_options, afd_results, npu_topology):
    from pytest_afd.backends.base import PromptRequest

    def record(**kwargs):
        settings = afd_options.run_settings()
        prompts = [PromptRequest("a", tuple(range(40))), PromptRequest("b", tuple(range(24)))]
        outputs = [afd_backend.run(prompts, settings) for _ in range(afd_options.repeats)]
        return afd_results.record(
            settings=settings,
            workload=results.workload_json(dataset_name="fixed", prompt_lengths=[40, 24], seed=None),
            metrics=results.metrics_from_runs(outputs),
            evidence=results.evidence_from_outputs(outputs[0], routing=settings.routing,
                                                   num_ep_ranks=npu_topology.num_ep_ranks),
            notes=os.environ.get("PYTEST_XDIST_WORKER", "main"),
            **kwargs,
        )

    return record
"""

OPTIONS_PROBE = """
import json

def test_probe(afd_options, npu_topology, rank_layout):
    data = {
        "topology": npu_topology.canonical, "alias": npu_topology.alias, "backend": afd_options.backend,
        "model": afd_options.model, "routing": afd_options.routing, "repeats": afd_options.repeats,
        "warmups": afd_options.warmups, "seed": afd_options.seed, "run_order": afd_options.run_order,
        "profile": afd_options.profile, "results_dir": str(afd_options.results_dir),
        "golden_dir": str(afd_options.golden_dir), "require_hardware": afd_options.require_hardware,
        "layout": len(rank_layout), "settings_routing": afd_options.run_settings().routing,
        "pcp": afd_options.run_settings().pcp_size, "instrument": afd_options.run_settings().instrument,
        "afd_processes": afd_options.run_settings().afd_processes,
        "override": afd_options.run_settings(routing="natural", chunk_size=64).chunk_size,
        "protocol": afd_options.repeat({"a": lambda: 1.0, "b": lambda: 2.0}).protocol_json(),
    }
    with open("probe.json", "w") as handle:
        json.dump(data, handle)
"""


@pytest.fixture
def fake(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(tmp_path / "closed.txt"))
    for name in ("AFD_NPU_TOPOLOGY", "AFD_BACKEND", "AFD_RESULTS_DIR", "AFD_REPEATS", "AFD_ROUTING",
                 "AFD_REQUIRE_HARDWARE", "AFD_NUM_NODES", "FAKE_UNAVAILABLE", "AFD_PROFILE",
                 "AFD_CPU_PROCESSES"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(FAKE_CONFTEST)
    return pytester


# Inline runs restore sys.modules afterwards, so hypothesis' plugin re-imports
# (and assertion-rewrites) hypothesis every run, and the unraisable-exception
# cleanup runs gc.collect() five times with torch loaded: seconds per run.
FAST = ("-p", "no:unraisableexception", "-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def run(pytester, *args):
    return pytester.runpytest(*FAST, *args)


def probe(pytester, *args):
    pytester.makepyfile(test_probe=OPTIONS_PROBE)
    result = run(pytester, *args)
    result.assert_outcomes(passed=1)
    return json.loads((pytester.path / "probe.json").read_text())


def test_plugin_option_defaults(fake):
    data = probe(fake)
    assert data["topology"] == "dp3pcp8-ep8" and data["layout"] == 32
    assert (data["backend"], data["model"], data["routing"]) == ("cpu", "reduced", "natural")
    assert (data["repeats"], data["warmups"], data["seed"], data["run_order"]) == (3, 1, 0, "interleaved")
    assert data["results_dir"] == str(fake.path / "afd-results")
    assert data["golden_dir"] == str(fake.path / "golden")
    assert data["pcp"] == 8 and data["profile"] is False and data["override"] == 64
    assert data["afd_processes"] is False
    assert data["protocol"] == {"seed": 0, "warmups": 1, "repetitions": 3, "run_order": "interleaved",
                                "executed_order": ["a#0", "b#0", "a#1", "b#1", "a#2", "b#2"]}


def test_plugin_cli_env_ini_precedence(fake, monkeypatch):
    fake.makeini("[pytest]\nafd_npu_topology = dp4pcp8\nafd_repeats = 4\nafd_profile = true\n"
                 "afd_results_dir = out\n")
    data = probe(fake)
    assert (data["topology"], data["repeats"], data["profile"]) == ("dp4pcp8", 4, True)
    assert data["results_dir"] == str(fake.path / "out")
    monkeypatch.setenv("AFD_NPU_TOPOLOGY", "pp2cp8tp8")
    monkeypatch.setenv("AFD_ROUTING", "forced")
    data = probe(fake)
    assert (data["topology"], data["routing"], data["settings_routing"]) == (
        "pp2cp8tp8", "forced_balanced", "forced_balanced")
    data = probe(fake, "--npu-topology", "DP32EP32", "--afd-repeats", "5", "--afd-seed", "9",
                 "--afd-run-order", "random", "--afd-model", "full", "--afd-require-hardware")
    assert (data["topology"], data["repeats"], data["seed"]) == ("dp32ep32", 5, 9)
    assert (data["run_order"], data["model"], data["require_hardware"]) == ("random", "full", True)
    assert probe(fake, "--afd-cpu-processes")["afd_processes"] is True
    assert data["protocol"]["repetitions"] == 5 and data["protocol"]["run_order"] == "random"
    assert sorted(data["protocol"]["executed_order"]) == sorted(f"{c}#{r}" for c in "ab" for r in range(5))


def test_plugin_alias_file_option(fake):
    fake.path.joinpath("topos.yaml").write_text("small: dp2pcp2-ep2\n")
    data = probe(fake, "--afd-topology-aliases", "topos.yaml", "--npu-topology", "small")
    assert (data["topology"], data["alias"], data["layout"]) == ("dp2pcp2-ep2", "small", 6)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--npu-topology", "dp3xx2-ep8"], {}, "unknown token 'xx2'"),
        (["--npu-topology", "dp3pcp8-ep8-tp2"], {}, "'tp2' is extra"),
        (["--afd-repeats", "2"], {}, "--afd-repeats=2: expected at least 3"),
        (["--afd-warmups", "-1"], {}, "--afd-warmups=-1"),
        ([], {"AFD_BACKEND": "tpu"}, "$AFD_BACKEND='tpu': expected one of cpu, vllm-ascend"),
        ([], {"AFD_REPEATS": "many"}, "$AFD_REPEATS='many': expected an integer"),
        ([], {"AFD_PROFILE": "maybe"}, "$AFD_PROFILE='maybe': expected a boolean"),
    ],
)
def test_plugin_bad_option_values_are_usage_errors(fake, monkeypatch, args, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    fake.makepyfile(test_x="def test_x():\n    pass\n")
    result = run(fake, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_plugin_argparse_rejects_unknown_choice(fake):
    result = run(fake, "--afd-backend", "tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "invalid choice: 'tpu'" in result.stderr.str()


MARKED = """
import pytest

@pytest.mark.gate
def test_gate(): pass

@pytest.mark.stage_d
def test_stage_d(): pass

@pytest.mark.slow
def test_slow(): pass

@pytest.mark.npu(devices=16, soc="Ascend910B")
def test_npu(): pass

@pytest.mark.multi_node(nodes=4)
def test_nodes(): pass
"""


def test_plugin_markers_registered_under_strict_markers(fake):
    fake.makepyfile(test_marked=MARKED)
    result = run(fake, "--strict-markers", "-m", "gate or stage_d", "-rs")
    result.assert_outcomes(passed=2, deselected=3)
    result = run(fake, "--markers")
    for name in ("gate", "stage_a", "stage_f", "slow", "npu(devices=N, soc=None):", "multi_node(nodes=N):"):
        result.stdout.fnmatch_lines([f"@pytest.mark.{name}*"])
    fake.makepyfile(test_unknown="import pytest\n@pytest.mark.stage_z\ndef test_z(): pass\n")
    result = run(fake, "--strict-markers", "test_unknown.py")
    assert "'stage_z' not found in `markers`" in result.stdout.str()


def test_plugin_hardware_markers_skip_then_fail_when_required(fake, monkeypatch):
    fake.makepyfile(test_marked=MARKED)
    result = run(fake, "--strict-markers", "-rs", "-k", "npu or nodes")
    result.assert_outcomes(skipped=2, deselected=3)
    result.stdout.fnmatch_lines([
        "*needs 16 NPU devices (npu marker), 0 available: torch_npu is not installed*",
        "*needs 4 nodes (multi_node marker), AFD_NUM_NODES=1*",
    ])
    result = run(fake, "--afd-require-hardware", "-k", "npu or nodes")
    result.assert_outcomes(errors=2, deselected=3)  # failed in setup
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*--afd-require-hardware: needs 16 NPU devices*"])
    monkeypatch.setenv("AFD_NUM_NODES", "4")
    run(fake, "-k", "nodes").assert_outcomes(passed=1, deselected=4)
    monkeypatch.setenv("AFD_NUM_NODES", "four")
    result = run(fake, "-k", "nodes")
    result.assert_outcomes(errors=1, deselected=4)
    result.stdout.fnmatch_lines(["*$AFD_NUM_NODES='four': expected a positive integer*"])


def test_plugin_bad_marker_arguments_fail_naming_them(fake):
    fake.makepyfile(test_bad="""
import pytest

@pytest.mark.npu(devices="many")
def test_npu(): pass

@pytest.mark.multi_node(0)
def test_nodes(): pass
""")
    result = run(fake)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*@pytest.mark.npu(devices='many'): expected a positive int*",
                                 "*@pytest.mark.multi_node(nodes=0): expected a positive int*"],
                                consecutive=False)


BACKEND_USER = """
def test_uses_backend(afd_backend):
    assert afd_backend.describe()["device_type"] == "fake-npu"

def test_manifest(afd_manifest):
    assert afd_manifest["hardware"]["rack"] == "r1"
    assert afd_manifest["backend"]["description"]["device_type"] == "fake-npu"
"""


def test_plugin_backend_unavailable_skips_or_fails(fake, monkeypatch, tmp_path):
    fake.makepyfile(test_backend=BACKEND_USER)
    run(fake).assert_outcomes(passed=2)
    assert (tmp_path / "closed.txt").read_text() == "closed\n"  # closed once at session end
    monkeypatch.setenv("FAKE_UNAVAILABLE", "1")
    result = run(fake, "-rs", "-k", "uses_backend")
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*backend 'cpu' unavailable: no fake NPU here*"])
    fake.makepyfile(test_more="""
import pytest

@pytest.mark.parametrize("n", range(5))
def test_also_uses_backend(afd_backend, n):
    pass
""")
    result = run(fake, "--afd-require-hardware", "-k", "uses_backend")
    # The session stops at the first case that needs the backend: one message, not 6 failures.
    assert result.ret == EXIT_BACKEND_UNAVAILABLE
    message = "--afd-require-hardware: backend 'cpu' unavailable: no fake NPU here"
    assert result.stdout.str().count(message) == 1, result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) == 0


def test_plugin_real_registry_rejects_unknown_backend():
    from pytest_afd.backends import create_backend

    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        create_backend("tpu", topology=None, model_name="reduced", seed=0, results_dir=".")


GOLDEN_USER = """
import numpy as np

def test_tokens(golden):
    golden.check("gate/tokens", np.array([3, 1, 4]), profile="exact")
"""


def test_plugin_golden_fixture_missing_update_pass_corrupt(fake, monkeypatch):
    monkeypatch.setenv("FAKE_UNAVAILABLE", "1")  # the golden sidecar records the manifest without a backend
    fake.makepyfile(test_golden=GOLDEN_USER)
    result = run(fake)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenMissingError: golden 'gate/tokens' not found*--afd-update-golden*"])
    result = run(fake, "--afd-update-golden")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 golden(s) updated in*golden*"])
    sidecar = json.loads((fake.path / "golden" / "gate" / "tokens.json").read_text())
    assert sidecar["manifest_digest"].startswith("sha256:")
    run(fake).assert_outcomes(passed=1)
    (fake.path / "golden" / "gate" / "tokens.npz").write_bytes(b"garbage")
    result = run(fake)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenCorruptError: golden 'gate/tokens'*does not match the sidecar*"])


RESULTS_USER = """
import pytest

@pytest.mark.stage_a
@pytest.mark.parametrize("n", [0, 1, 2])
def test_case(record_case, n):
    record_case()

@pytest.mark.stage_b
def test_fails_after_writing(record_case):
    record_case()
    assert False, "verdict after the evidence"

@pytest.mark.gate
def test_invalid(afd_results, afd_options):
    doc = afd_results.build(settings=afd_options.run_settings(), workload={}, metrics={}, evidence={})
    afd_results.write(doc)
"""


def test_plugin_results_written_validated_and_summarized(fake):
    fake.makepyfile(test_results=RESULTS_USER)
    result = run(fake, "--afd-routing", "forced")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*test_results.py::test_fails_after_writing*stage_b*failed*",
                                 "4 result JSON file(s) in *"], consecutive=True)
    result.stdout.fnmatch_lines([
        "*result 'test_results.py::test_invalid' does not match result.schema.json:*",
        "*pytest-afd results*",
        "case*kind*outcome*headline (median)*CV*labels*",
        "test_results.py::test_case?0?*stage_a*passed*prefill_tokens_per_s 128 tokens/s*0*synthetic*",
        "4 result JSON file(s) in *afd-results (summary: *summary.json)",
        "verdicts (python -m pytest_afd report for the full report):",
        "  stage_a: 3 case(s): 3 passed; host: load not recorded",
        "  stage_b: 1 case(s): 1 failed; host: load not recorded",
    ])
    summary = json.loads((fake.path / "afd-results" / "summary.json").read_text())
    assert [e["case_id"] for e in summary["results"]] == [
        *(f"test_results.py::test_case[{n}]" for n in range(3)), "test_results.py::test_fails_after_writing"]
    assert [e["outcome"] for e in summary["results"]] == ["passed"] * 3 + ["failed"]
    doc = json.loads(open(summary["results"][0]["path"]).read())
    assert doc["labels"]["synthetic"] is True and doc["case_kind"] == "stage_a"
    assert doc["manifest"]["hardware"]["rack"] == "r1"
    assert doc["manifest"]["topology"]["cpu_emulation"]["num_ep_ranks"] == 8
    assert len(list((fake.path / "afd-results").glob("*.json"))) == 5  # 4 results + summary
    written = (fake.path / "written.txt").read_text().split()
    assert sorted(written) == sorted([*(f"test_results.py::test_case[{n}]" for n in range(3)),
                                      "test_results.py::test_fails_after_writing"])  # not the invalid one


XDIST_USER = """
import pytest

@pytest.mark.parametrize("n", range(6))
def test_case(record_case, n):
    record_case()
"""


def test_plugin_xdist_merges_worker_results(fork_server, fake):
    fake.makepyfile(test_results=XDIST_USER)
    result = runpytest_forked(fork_server, fake, *FAST, "-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*pytest-afd results*", "6 result JSON file(s) in *"])
    summary = json.loads((fake.path / "afd-results" / "summary.json").read_text())
    assert sorted(e["case_id"] for e in summary["results"]) == sorted(
        f"test_results.py::test_case[{n}]" for n in range(6))
    assert {e["outcome"] for e in summary["results"]} == {"passed"}  # controller saw every report
    workers = {json.loads(open(e["path"]).read())["notes"] for e in summary["results"]}
    assert workers == {"gw0", "gw1"}
    assert len({e["manifest_digest"] for e in summary["results"]}) == 1  # one stack across workers


def test_plugin_real_vllm_ascend_backend_skips_here(pytester, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed: this checks the no-hardware path")
    for name in ("AFD_ASCEND_SERVER_URL", "AFD_REQUIRE_HARDWARE", "AFD_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_backend="def test_b(afd_backend):\n    pass\n")
    result = run(pytester, "--afd-backend", "vllm-ascend", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*backend 'vllm-ascend' unavailable: *"])
    result = run(pytester, "--afd-backend", "vllm-ascend", "--afd-require-hardware")
    assert result.ret == EXIT_BACKEND_UNAVAILABLE
    result.stdout.fnmatch_lines(["*--afd-require-hardware: backend 'vllm-ascend' unavailable*"])

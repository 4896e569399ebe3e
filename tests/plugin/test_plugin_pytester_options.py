"""The plugin end to end through pytester: options (CLI, env, ini, alias file) and markers."""

import json

import pytest

from tests.support.plugin_pytester import run_fast

pytest_plugins = ["pytester"]

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


def probe(pytester, *args):
    pytester.makepyfile(test_probe=OPTIONS_PROBE)
    result = run_fast(pytester, *args)
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
    result = run_fast(fake, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_plugin_argparse_rejects_unknown_choice(fake):
    result = run_fast(fake, "--afd-backend", "tpu")
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
    result = run_fast(fake, "--strict-markers", "-m", "gate or stage_d", "-rs")
    result.assert_outcomes(passed=2, deselected=3)
    result = run_fast(fake, "--markers")
    for name in ("gate", "stage_a", "stage_f", "slow", "npu(devices=N, soc=None):", "multi_node(nodes=N):"):
        result.stdout.fnmatch_lines([f"@pytest.mark.{name}*"])
    fake.makepyfile(test_unknown="import pytest\n@pytest.mark.stage_z\ndef test_z(): pass\n")
    result = run_fast(fake, "--strict-markers", "test_unknown.py")
    assert "'stage_z' not found in `markers`" in result.stdout.str()


def test_plugin_hardware_markers_skip_then_fail_when_required(fake, monkeypatch):
    fake.makepyfile(test_marked=MARKED)
    result = run_fast(fake, "--strict-markers", "-rs", "-k", "npu or nodes")
    result.assert_outcomes(skipped=2, deselected=3)
    result.stdout.fnmatch_lines([
        "*needs 16 NPU devices (npu marker), 0 available: torch_npu is not installed*",
        "*needs 4 nodes (multi_node marker), AFD_NUM_NODES=1*",
    ])
    result = run_fast(fake, "--afd-require-hardware", "-k", "npu or nodes")
    result.assert_outcomes(errors=2, deselected=3)  # failed in setup
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*--afd-require-hardware: needs 16 NPU devices*"])
    monkeypatch.setenv("AFD_NUM_NODES", "4")
    run_fast(fake, "-k", "nodes").assert_outcomes(passed=1, deselected=4)
    monkeypatch.setenv("AFD_NUM_NODES", "four")
    result = run_fast(fake, "-k", "nodes")
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
    result = run_fast(fake)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*@pytest.mark.npu(devices='many'): expected a positive int*",
                                 "*@pytest.mark.multi_node(nodes=0): expected a positive int*"],
                                consecutive=False)

"""A topology the model cannot take is a usage error at start-up, before any test runs."""

import pytest

from pytest_afd.backends.model_fit import DEEPSEEK_V3_2, ModelShape, fit_errors, session_shapes
from pytest_afd.topology.spec import parse_topology

pytest_plugins = ["pytester"]

RUNS_A_TEST = """
def test_ran():
    open("ran.txt", "w").write("a test ran")
"""


@pytest.mark.parametrize(
    ("topology", "backend", "message"),
    [
        ("dp3pcp8-ep9", "cpu", "32 routed experts cannot be spread evenly over 9 EP ranks"),
        ("dp3pcp8-ep9", "vllm-ascend", "256 routed experts cannot be spread evenly over 9 EP ranks"),
        ("dp3tp3-ep8", "cpu", "128 attention heads cannot be sharded evenly over tp3"),
        ("dp12ep12", "cpu", "32 routed experts cannot be spread evenly over 12 EP ranks"),
    ],
)
def test_bad_topology_model_pair_is_a_usage_error_before_any_test(pytester, topology, backend,
                                                                  message):
    pytester.makepyfile(test_x=RUNS_A_TEST)
    result = pytester.runpytest("--npu-topology", topology, "--afd-backend", backend)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--npu-topology={topology!r} does not fit the model*{message}*"])
    assert not (pytester.path / "ran.txt").exists()


def test_the_recipe_topologies_fit():
    for spec in ("dp3pcp8-ep8", "dp4pcp8", "dp2tp4-ep8", "dp2pcp2tp2-ep4", "dp32ep32", "dp3pcp8-ep16"):
        assert fit_errors(parse_topology(spec), session_shapes("cpu", "reduced")) == [], spec


def test_fit_errors_name_the_part_and_each_model():
    errors = fit_errors(parse_topology("dp3pcp8-ep9"), session_shapes("cpu", "reduced"))
    assert errors == [
        "dp3pcp8-ep9 ('ep9'): the CPU model (reduced)'s 32 routed experts cannot be spread evenly "
        "over 9 EP ranks",
        "dp3pcp8-ep9 ('ep9'): DeepSeek V3.2's 256 routed experts cannot be spread evenly over "
        "9 EP ranks",
    ]
    # A CPU model with more experts than DeepSeek's divisors still has to fit DeepSeek V3.2.
    odd = ModelShape("odd", routed_experts=48, attention_heads=None)
    assert len(fit_errors(parse_topology("dp3pcp8-ep3"), (odd, DEEPSEEK_V3_2))) == 1

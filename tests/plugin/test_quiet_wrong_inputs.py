"""Quiet wrong inputs (issue 40, finding 6): each says what is wrong instead of running quietly."""

from __future__ import annotations

import pytest

from pytest_afd.backends.vllm_ascend.listing import ENV_MODEL_PATH, plan_document
from pytest_afd.core.backend import RunSettings
from pytest_afd.topology.spec import BUILTIN_ALIASES, afd_suggestion, parse_topology

pytest_plugins = ["pytester"]

CASE = "def test_nothing():\n    pass\n"


@pytest.mark.parametrize(("spec", "suggested"), [
    ("dp3pcp8ep8", "dp3pcp8-ep8"),  # the recipe with its dash lost
    ("DP3PCP8EP8", "dp3pcp8-ep8"),
    ("dp2pcp4ep4", "dp2pcp4-ep4"),  # unknown layout, but ep4 spans fewer than its 8 ranks
    ("dp32ep32", None),  # the co-located baseline: EP over every rank
    ("dp16ep16", None),
    ("dp4pcp8", None),
    ("pp2cp8tp8", None),
    ("dp3pcp8-ep8", None),  # already AFD
])
def test_a_topology_one_dash_from_afd_is_named(spec, suggested):
    assert afd_suggestion(parse_topology(spec)) == suggested


def test_no_builtin_alias_target_draws_a_suggestion():
    for target in BUILTIN_ALIASES.values():
        assert afd_suggestion(parse_topology(target)) is None, target


def test_the_session_warns_in_the_header_and_the_summary(pytester):
    pytester.makepyfile(CASE)
    result = pytester.runpytest("--npu-topology", "dp3pcp8ep8", "-p", "no:cacheprovider")
    assert result.ret == 0
    warnings = [line for line in result.stdout.lines
                if "did you mean dp3pcp8-ep8" in line]
    assert len(warnings) == 2, result.stdout.str()  # header and terminal summary
    assert all("'dp3pcp8ep8' is a co-located (non-AFD) layout" in line for line in warnings)
    quiet = pytester.runpytest("--npu-topology", "dp32ep32", "-p", "no:cacheprovider")
    assert "did you mean" not in quiet.stdout.str()


def test_the_header_names_devices_per_node_only_when_given(pytester, monkeypatch):
    monkeypatch.delenv("AFD_DEVICES_PER_NODE", raising=False)
    pytester.makepyfile(CASE)
    unknown = pytester.runpytest("--npu-topology", "dp3pcp8-ep8", "-p", "no:cacheprovider")
    header = next(line for line in unknown.stdout.lines if line.startswith("afd: backend="))
    assert "nodes of" not in header
    assert "32 devices; devices per node not given (--afd-devices-per-node)" in header
    given = pytester.runpytest("--npu-topology", "dp3pcp8-ep8", "--afd-devices-per-node", "16",
                               "-p", "no:cacheprovider")
    header = next(line for line in given.stdout.lines if line.startswith("afd: backend="))
    assert "2 nodes of 16" in header


def test_a_plan_without_a_model_path_carries_a_plan_error():
    topology = parse_topology("dp3pcp8-ep8")
    settings = RunSettings(split_policy="token_balanced")
    missing = plan_document(topology, "reduced", settings, devices_per_node=16, environ={})
    assert missing["plan_error"].startswith("no model path: --model 'reduced' is the harness's")
    assert f"${ENV_MODEL_PATH}" in missing["plan_error"]
    given = plan_document(topology, "reduced", settings, devices_per_node=16,
                          environ={ENV_MODEL_PATH: "/models/{model}"})
    assert given["model_path"] == "/models/reduced" and given["plan_error"] is None

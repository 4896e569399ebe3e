"""Registration is safe in every vLLM process and independent of the plugins' load order.

Each case is a fresh Python process (forked by the ``fork_server`` fixture before any
afd_split, afd_plugin or vLLM module loads) over the stand-in tree of registration_standins.py,
registering afd_plugin and afd_split in one order and then importing what that kind of
process imports (the API server: nothing; an Attention worker: the runner module; an FFN
worker: only the validation module).
"""

import pytest

from afd_split.hook.facts.pinned import (
    DISPATCH,
    EXTRA_INFO,
    FORWARD,
    PLANNER,
    SLICER,
    VALIDATOR,
    variant_for_branch,
)
from tests.support.registration_standins import run_process, write_tree

ORDERS = ("afd>afd_split", "afd_split>afd")
BRANCHES = ("main", "release/v0.19.1rc1")


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """(branch, with torch_npu) -> stand-in tree."""
    root = tmp_path_factory.mktemp("registration")
    return {
        (branch, npu): write_tree(root / f"{branch.replace('/', '_')}_{npu}", branch,
                                  with_torch_npu=npu)
        for branch in BRANCHES for npu in (False, True)
    }


@pytest.mark.parametrize("order", ORDERS)
def test_the_api_server_imports_no_npu_module(fork_server, trees, order):
    """Process 0 without torch_npu: registering imports neither torch_npu nor a seam module."""
    report = run_process(fork_server, trees["main", False], order, loads="plugins")
    assert report["attempted"] == [] and report["loaded"] == [] and report["hooks"] == 1


def test_the_eager_registration_is_caught_importing_torch_npu(fork_server, trees):
    """Fault injection: the old registration (runner module imported in register) is seen
    trying torch_npu in the API server."""
    report = run_process(fork_server, trees["main", False], "afd>afd_split", loads="plugins",
                         registration="eager")
    assert "torch_npu" in report["attempted"]


@pytest.mark.parametrize("branch", BRANCHES)
def test_both_plugin_orders_give_the_same_patched_seams(fork_server, trees, branch):
    """An Attention worker: plugins registered, then the runner module loads. Either order
    patches the six seams (pinned headers; the pipeline when the first forward imports it)
    and leaves afd_plugin's set_forward_context bound in the runner module."""
    reports = [run_process(fork_server, trees[branch, True], order,
                           loads="plugins,import_runner,import_forward") for order in ORDERS]
    assert reports[0] == reports[1]
    report = reports[0]
    assert report["attempted"] == ["torch_npu"]  # by the worker's own runner import only
    for key in (VALIDATOR, PLANNER, SLICER, DISPATCH, EXTRA_INFO, FORWARD):
        assert report[key] == [key, variant_for_branch(key, branch).normalized_header]
    assert report["runner_set_forward_context_patched"] is True


def test_the_eager_registration_in_afd_split_first_order_is_caught(fork_server, trees):
    """Fault injection: importing the runner at registration before afd's register_afd
    leaves the runner module's set_forward_context unpatched; the report shows it."""
    report = run_process(fork_server, trees["main", True], "afd_split>afd", loads="plugins,import_runner",
                         registration="eager")
    assert report["runner_set_forward_context_patched"] is False


@pytest.mark.parametrize("order", ORDERS)
def test_a_seam_module_loaded_before_registration_is_patched_at_once(fork_server, trees, order):
    report = run_process(fork_server, trees["main", True], order, loads="import_runner,import_forward,plugins")
    keys = (VALIDATOR, PLANNER, SLICER, DISPATCH, EXTRA_INFO, FORWARD)
    assert [report[key][0] for key in keys] == list(keys)


@pytest.mark.parametrize("order", ORDERS)
def test_a_process_loading_only_the_validation_module_gets_the_validator_patched(fork_server, trees, order):
    """An FFN worker validates async-MoE settings without the Attention runner module."""
    report = run_process(fork_server, trees["main", False], order, loads="plugins,import_validation")
    assert report["loaded"] == ["afd_plugin.compat.npu.feature_validation"]
    assert report[VALIDATOR][0] == VALIDATOR and report["attempted"] == []


def test_registering_twice_installs_one_hook(fork_server, trees):
    report = run_process(fork_server, trees["main", True], "afd>afd_split>afd_split",
                         loads="plugins,import_runner")
    assert report[PLANNER][0] == PLANNER and report["hooks"] == 1

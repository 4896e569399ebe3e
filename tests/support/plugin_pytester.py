"""The fake backend project that the plugin's pytester tests run inner sessions in.

``FAKE_CONFTEST`` is the inner session's conftest: a backend that records what it was
asked (and its close), the manifest and result-written hooks, and a ``record_case``
fixture writing one result. ``FAST`` and :func:`run_fast` keep inline runs cheap.
"""

from __future__ import annotations

import pytest

from tests.support.inner_pytest import UNRELATED_PLUGINS

FAKE_CONFTEST = """
import os
import pytest
from pytest_afd.core.backend import BackendUnavailable, RequestOutput, RunOutputs
from pytest_afd.results import documents as results


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
    from pytest_afd.core.backend import PromptRequest

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

AFD_ENV = ("AFD_NPU_TOPOLOGY", "AFD_BACKEND", "AFD_RESULTS_DIR", "AFD_REPEATS", "AFD_ROUTING",
           "AFD_REQUIRE_HARDWARE", "AFD_NUM_NODES", "AFD_PROFILE", "AFD_CPU_PROCESSES", "AFD_SEED",
           "AFD_WARMUPS", "AFD_TOPOLOGY_ALIASES", "AFD_DEVICES_PER_NODE", "AFD_GOLDEN_DIR",
           "FAKE_UNAVAILABLE")
"""Every setting the inner session reads from the environment, cleared before it starts."""

# Inline runs restore sys.modules afterwards, so hypothesis' plugin re-imports
# (and assertion-rewrites) hypothesis every run, and the unraisable-exception
# cleanup runs gc.collect() five times with torch loaded: seconds per run.
FAST = ("-p", "no:unraisableexception", "-p", "no:cacheprovider", *UNRELATED_PLUGINS)


def run_fast(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inline inner session with the ``FAST`` options."""
    return pytester.runpytest(*FAST, *args)

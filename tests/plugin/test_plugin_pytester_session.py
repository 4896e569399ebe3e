"""The plugin end to end through pytester: backend skips, golden, results, xdist."""

import json

import pytest

from pytest_afd.session import EXIT_BACKEND_UNAVAILABLE
from tests.support.forked_pytest import runpytest_forked
from tests.support.plugin_pytester import FAST, run_fast

pytest_plugins = ["pytester"]

BACKEND_USER = """
def test_uses_backend(afd_backend):
    assert afd_backend.describe()["device_type"] == "fake-npu"

def test_manifest(afd_manifest):
    assert afd_manifest["hardware"]["rack"] == "r1"
    assert afd_manifest["backend"]["description"]["device_type"] == "fake-npu"
"""


def test_plugin_backend_unavailable_skips_or_fails(fake, monkeypatch, tmp_path):
    fake.makepyfile(test_backend=BACKEND_USER)
    run_fast(fake).assert_outcomes(passed=2)
    assert (tmp_path / "closed.txt").read_text() == "closed\n"  # closed once at session end
    monkeypatch.setenv("FAKE_UNAVAILABLE", "1")
    result = run_fast(fake, "-rs", "-k", "uses_backend")
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*backend 'cpu' unavailable: no fake NPU here*"])
    fake.makepyfile(test_more="""
import pytest

@pytest.mark.parametrize("n", range(5))
def test_also_uses_backend(afd_backend, n):
    pass
""")
    result = run_fast(fake, "--afd-require-hardware", "-k", "uses_backend")
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
    result = run_fast(fake)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenMissingError: golden 'gate/tokens' not found*--afd-update-golden*"])
    result = run_fast(fake, "--afd-update-golden")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 golden(s) updated in*golden*"])
    sidecar = json.loads((fake.path / "golden" / "gate" / "tokens.json").read_text())
    assert sidecar["manifest_digest"].startswith("sha256:")
    run_fast(fake).assert_outcomes(passed=1)
    (fake.path / "golden" / "gate" / "tokens.npz").write_bytes(b"garbage")
    result = run_fast(fake)
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
    result = run_fast(fake, "--afd-routing", "forced")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*test_results.py::test_fails_after_writing*stage_b*failed*",
                                 "4 result JSON file(s) in *"], consecutive=True)
    result.stdout.fnmatch_lines([
        "*result 'test_results.py::test_invalid' does not match result.schema.json:*",
        "*pytest-afd results*",
        "case*kind*outcome*headline (median)*CV*labels*",
        "test_results.py::test_case?0?*stage_a*passed*prefill_tokens_per_s 128 tokens/s*0*synthetic*",
        "4 result JSON file(s) in *afd-results (summary: *summary.json)",
        "verdicts (pytest-afd report for the full report):",
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
    result = run_fast(pytester, "--afd-backend", "vllm-ascend", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*backend 'vllm-ascend' unavailable: *"])
    result = run_fast(pytester, "--afd-backend", "vllm-ascend", "--afd-require-hardware")
    assert result.ret == EXIT_BACKEND_UNAVAILABLE
    result.stdout.fnmatch_lines(["*--afd-require-hardware: backend 'vllm-ascend' unavailable*"])

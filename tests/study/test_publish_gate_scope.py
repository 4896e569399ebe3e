"""Publishing keeps gate results on their own layouts and small models (checked on the stack
only, as in the session) and still excludes a gate on another stack commit."""

import json

from pytest_afd.results.manifest import collect_manifest
from pytest_afd.study import publish
from pytest_afd.topology.spec import parse_topology
from tests.support import study_data as sd


def _gate_manifest(vllm_ascend):
    """A gate's manifest: its own 2-layer model on another topology, as suites/gates runs."""
    description = {"model": {"num_layers": 2, "quantization": "none"},
                   "software": {"vllm_ascend_revision": vllm_ascend}}
    return collect_manifest(topology=parse_topology("dp2tp4-ep8"), backend_name="cpu",
                            backend_description=description,
                            model_name="reduced:num_hidden_layers=2", protocol=sd.make_manifest()[
                                "protocol"], emulated=True, environ={})


def test_publish_gate_results_are_checked_on_the_stack_only(tmp_path):
    manifest = sd.make_manifest()
    study = sd.freeze_study(tmp_path, manifest)
    results = tmp_path / "results"
    for doc in sd.planted_pairs(manifest=manifest, imbalances=(0.5,)):
        sd.write(results, doc)
    sd.write(results, sd.make_case("gates/own-layout", "token_balanced", imbalance=0.0,
                                   manifest=_gate_manifest(sd.STACK_COMMIT), kind="gate"))
    sd.write(results, sd.make_case("gates/other-commit", "token_balanced", imbalance=0.0,
                                   manifest=_gate_manifest("0.0.1+git.other"), kind="gate"))
    assert publish.main([str(results), "--study", str(study), "--output",
                         str(tmp_path / "bundle")]) == 0
    doc = json.loads((tmp_path / "bundle" / "regions.json").read_text())
    (excluded,) = doc["excluded"]
    assert excluded["case_id"] == "gates/other-commit/token_balanced"
    assert [c["field"] for c in excluded["contradictions"]] == ["stack.vllm_ascend"]

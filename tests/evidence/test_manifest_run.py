"""manifest["run"]: each case's true topology, model, backend mode, ...; the digest follows every field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.results.documents import build_result, metrics_json, settings_json, workload_json
from pytest_afd.results.manifest import (
    CASE_RUN_KEYS,
    RUN_KEYS,
    RUN_SECTION,
    collect_manifest,
    run_identity,
    stack_digest,
    with_run,
)
from pytest_afd.topology.spec import parse_topology

PROTOCOL = {"seed": 0, "warmups": 1, "repetitions": 3, "run_order": "interleaved"}


def cpu_description(num_layers: int = 10, threads: int = 2) -> dict:
    return {"backend": "cpu", "torch_threads": threads, "model": {"num_layers": num_layers}}


def manifest_for(spec: str = "dp3pcp8-ep8", model: str = "reduced", description=None) -> dict:
    return collect_manifest(
        topology=parse_topology(spec), backend_name="cpu",
        backend_description=cpu_description() if description is None else description,
        model_name=model, protocol=PROTOCOL, emulated=True, environ={},
    )  # fmt: skip


def digest(manifest: dict, settings: RunSettings) -> str:
    return with_run(manifest, settings_json(settings))["digest"]


BASE = manifest_for()
BASE_SETTINGS = RunSettings(block_size=16)
# One variation per run field: (field, manifest, settings).
VARIATIONS = {
    "topology": (manifest_for("dp2tp4-ep8"), BASE_SETTINGS),
    "model": (manifest_for(model="full"), BASE_SETTINGS),
    "num_layers": (manifest_for(description=cpu_description(num_layers=61)), BASE_SETTINGS),
    "model_overrides": (manifest_for(model="reduced:num_hidden_layers=2"), BASE_SETTINGS),
    "backend_mode": (BASE, replace(BASE_SETTINGS, afd_processes=True)),
    "threads": (manifest_for(description=cpu_description(threads=8)), BASE_SETTINGS),
    "routing": (BASE, replace(BASE_SETTINGS, routing="forced_balanced")),
    "quantization": (BASE, replace(BASE_SETTINGS, quantization="w8a8")),
    "block_size": (BASE, replace(BASE_SETTINGS, block_size=128)),
}


def test_run_section_records_every_key():
    run = run_identity(BASE, settings_json(BASE_SETTINGS))
    assert tuple(run) == RUN_KEYS
    assert run["topology"] == "dp3pcp8-ep8" and run["model"] == "reduced"
    assert run["num_layers"] == 10 and run["model_overrides"] == {}
    assert (run["backend_mode"], run["attention_ranks"], run["ffn_ranks"]) == ("in_process", 1, 0)
    assert (run["threads"], run["routing"], run["quantization"], run["block_size"]) == (
        2, "natural", "none", 16
    )


@pytest.mark.parametrize("field", sorted(VARIATIONS))
def test_digest_changes_with_each_run_field(field):
    manifest, settings = VARIATIONS[field]
    base_run = run_identity(BASE, settings_json(BASE_SETTINGS))
    run = run_identity(manifest, settings_json(settings))
    changed = {key for key in RUN_KEYS if run[key] != base_run[key]}
    assert field in changed
    assert digest(manifest, settings) != digest(BASE, BASE_SETTINGS)


def test_afd_processes_record_rank_counts():
    run = run_identity(BASE, settings_json(replace(BASE_SETTINGS, afd_processes=True)))
    ffn = parse_topology("dp3pcp8-ep8").cpu_emulation().ffn_processes
    assert (run["backend_mode"], run["attention_ranks"], run["ffn_ranks"]) == (
        "afd_processes", 1, max(1, ffn)
    )


@pytest.mark.parametrize(("mode", "expected"), [("attach", "http_attach"), ("launch", "http_launch")])
def test_http_backends_record_attach_or_launch(mode, expected):
    manifest = manifest_for(description={"backend": "vllm_ascend", "transport": "http", "mode": mode})
    run = run_identity(manifest, settings_json(BASE_SETTINGS))
    assert run["backend_mode"] == expected
    assert run["threads"]["absent_reason"]


def result_for(settings: RunSettings) -> dict:
    return build_result(
        case_id="c", case_kind="gate", backend="cpu", settings=settings, manifest=BASE,
        workload=workload_json(dataset_name="d", prompt_lengths=[3], seed=0), protocol=PROTOCOL,
        metrics=metrics_json(completed_requests=1, failed_requests=0), evidence={},
        created_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip


def test_results_embed_the_run_and_its_digest():
    """In-process and AFD-process runs of one stack no longer share a digest."""
    afd = result_for(replace(BASE_SETTINGS, afd_processes=True))
    in_process = result_for(BASE_SETTINGS)
    assert afd["manifest"][RUN_SECTION]["backend_mode"] == "afd_processes"
    assert in_process["manifest"][RUN_SECTION]["backend_mode"] == "in_process"
    assert afd["manifest_digest"] == afd["manifest"]["digest"]
    assert afd["manifest_digest"] != in_process["manifest_digest"]


def test_a_case_without_a_backend_says_so():
    manifest = collect_manifest(
        topology=parse_topology("dcp2tp2"), backend_name="cpu", backend_description=None,
        backend_absent_reason="this case runs no backend", model_name="reduced",
        protocol=PROTOCOL, emulated=True, environ={},
    )  # fmt: skip
    run = run_identity(manifest, settings_json(BASE_SETTINGS))
    assert run["backend_mode"] == "no_backend" and run["attention_ranks"]["absent_reason"]


def test_stack_digest_ignores_only_the_per_case_fields():
    stack = {field: stack_digest(with_run(*_pair(field))) for field in VARIATIONS}
    base = stack_digest(with_run(BASE, settings_json(BASE_SETTINGS)))
    for field in VARIATIONS:
        assert (stack[field] == base) == (field in CASE_RUN_KEYS), field


def _pair(field):
    manifest, settings = VARIATIONS[field]
    return manifest, settings_json(settings)

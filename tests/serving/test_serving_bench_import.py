"""vllm bench serve --save-result --save-detailed JSON imports into the result schema."""

import json
from pathlib import Path

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.serving.bench_import import (
    BenchImportError,
    arrival_description,
    import_bench_runs,
    main,
)
from pytest_afd.serving.prometheus import PrefixCacheDelta
from pytest_afd.topology.spec import parse_topology

# Written from the field list vllm/benchmarks/serve.py saves (revision in docs/ascend.md).
BENCH_FILE = Path(__file__).parent / "data" / "vllm_bench_serve_detailed.json"
PROTOCOL = {"seed": 0, "warmups": 0, "repetitions": 2, "run_order": "fixed", "instrumented": False,
            "routing": "natural"}


@pytest.fixture(scope="module")
def manifest():
    return collect_manifest(topology=parse_topology("dp3pcp8-ep8"), backend_name="vllm-ascend",
                            backend_description={"imported_from": "vllm bench serve"},
                            model_name="deepseek_v3_2", protocol=PROTOCOL, emulated=False,
                            devices_per_node=16)


def write_bench(tmp_path, name, **changes):
    doc = json.loads(BENCH_FILE.read_text())
    doc.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_two_repetitions_import_and_validate(tmp_path, manifest):
    second = write_bench(tmp_path, "rep2.json", duration=5.0, request_throughput=0.6,
                         ttfts=[1.0, 2.0, 3.0, 0.0])
    doc = import_bench_runs([BENCH_FILE, second], case_id="stage_a/trace/request_boundary",
                            settings=RunSettings(split_policy="request_boundary"), manifest=manifest,
                            dataset_name="cp8sp50k_custom", case_kind="stage_a")
    results.validate_result(doc)
    metrics = doc["metrics"]
    # Throughput = completed input tokens / duration, one repetition per file.
    assert metrics["prefill_tokens_per_s"]["repetitions"] == [30000 / 2.5, 30000 / 5.0]
    assert metrics["request_throughput"]["repetitions"] == [1.2, 0.6]
    # TTFT percentiles from the successful requests only (the failed one has ttft 0.0).
    assert metrics["ttft_s"]["p50"]["repetitions"] == pytest.approx([1.2, 2.0])
    assert metrics["ttft_s"]["p99"]["repetitions"][0] == pytest.approx(1.592)
    assert (metrics["completed_requests"], metrics["failed_requests"]) == (6, 2)
    assert metrics["peak_memory_bytes"]["value"] is None
    workload = doc["workload"]
    assert workload["prompt_lengths"]["values"] == [8000, 12000, 10000, 4000]
    assert workload["arrival_process"] == "poisson(rate=10.0 req/s)"
    assert workload["output_length"] == 1 and workload["dataset"]["name"] == "cp8sp50k_custom"
    assert doc["protocol"]["repetitions"] == 2 and doc["backend"] == "vllm-ascend"
    assert doc["evidence"]["steps"]["absent_reason"].startswith("per-step split evidence")
    path = results.write_result(results.result_path(tmp_path, doc["case_id"]), doc)
    assert results.read_result(path)["case_id"] == "stage_a/trace/request_boundary"


def test_realized_prefix_hits_and_forced_routing_label(manifest):
    doc = import_bench_runs([BENCH_FILE], case_id="b", manifest=manifest,
                            settings=RunSettings(prefix_caching=True, routing="forced_balanced"),
                            realized_prefix_cache=PrefixCacheDelta(30000, 7500),
                            requested_hit_ratio=0.25)
    assert doc["evidence"]["prefix_cache"] == {"requested_hit_ratio": 0.25, "realized_hit_ratio": 0.25,
                                               "hit_tokens": 7500, "computed_tokens": 22500}
    assert doc["labels"]["synthetic"] is True


def test_append_result_file_holds_several_repetitions(tmp_path, manifest):
    line = json.dumps(json.loads(BENCH_FILE.read_text()))
    appended = tmp_path / "appended.json"
    appended.write_text(line + "\n" + line + "\n")
    doc = import_bench_runs([appended], case_id="c", settings=RunSettings(), manifest=manifest)
    assert doc["protocol"]["repetitions"] == 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ttfts": None}, "--save-detailed"),
        ({"duration": 0}, "duration=0"),
        ({"errors": ["", ""]}, "differ in length"),
    ],
)
def test_bad_bench_files_fail_with_the_reason(tmp_path, manifest, changes, message):
    doc = json.loads(BENCH_FILE.read_text())
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BenchImportError, match=message):
        import_bench_runs([path], case_id="x", settings=RunSettings(), manifest=manifest)


def test_repetitions_must_share_the_workload(tmp_path, manifest):
    other = write_bench(tmp_path, "other.json", input_lens=[1, 2, 3, 4])
    with pytest.raises(BenchImportError, match="different prompt lengths"):
        import_bench_runs([BENCH_FILE, other], case_id="x", settings=RunSettings(), manifest=manifest)


def test_arrival_descriptions():
    assert arrival_description({"request_rate": "inf", "max_concurrency": 8}) == "all-at-once, max_concurrency=8"
    assert arrival_description({"request_rate": 4, "burstiness": 0.5}) == "gamma(rate=4 req/s, burstiness=0.5)"


def test_cli_writes_a_valid_result(tmp_path, capsys):
    assert main([str(BENCH_FILE), "--case-id", "stage_a/recipe", "--npu-topology", "dp3pcp8-ep8",
                 "--devices-per-node", "16", "--results-dir", str(tmp_path)]) == 0
    written = Path(capsys.readouterr().out.strip())
    assert results.read_result(written)["manifest"]["hardware"]["node_count"] == 2


def test_cli_reads_saved_metrics_scrapes(tmp_path, capsys):
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text('vllm:prefix_cache_queries_total{engine="0"} 1000\n'
                      'vllm:prefix_cache_hits_total{engine="0"} 0\n')
    after.write_text('vllm:prefix_cache_queries_total{engine="0"} 31000\n'
                     'vllm:prefix_cache_hits_total{engine="0"} 15000\n')
    assert main([str(BENCH_FILE), "--case-id", "stage_b/50", "--npu-topology", "dp3pcp8-ep8",
                 "--results-dir", str(tmp_path), "--prefix-caching", "--requested-hit-ratio", "0.5",
                 "--metrics-before", str(before), "--metrics-after", str(after)]) == 0
    doc = results.read_result(Path(capsys.readouterr().out.strip()))
    assert doc["evidence"]["prefix_cache"]["realized_hit_ratio"] == 0.5
    assert doc["evidence"]["prefix_cache"]["requested_hit_ratio"] == 0.5


def test_cli_reports_a_bad_file_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "summary_only.json"
    doc = json.loads(BENCH_FILE.read_text())
    del doc["ttfts"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as raised:
        main([str(bad), "--case-id", "x", "--npu-topology", "dp3pcp8-ep8", "--results-dir", str(tmp_path)])
    assert raised.value.code == 2
    assert "--save-detailed" in capsys.readouterr().err

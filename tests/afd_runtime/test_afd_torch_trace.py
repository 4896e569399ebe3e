"""One path on CPU: instrumented AFD steps write torch.profiler traces, and the profiling
analysis (the one NPU profiles go through) agrees with the runtime's own timeline.

Stated tolerance (docs/profiling.md): every timeline span has exactly one
profiler range of the same stage, layer and ubatch on the same rank, and the
range lies inside the span (its duration is at most the span's, + 1 us of
clock granularity: the span's timers wrap the range). Per rank, the median
over spans of (span - range) duration is at most 0.5 ms: the only difference
is the range bookkeeping between the two timers, and a median is not moved by
the odd preemption that lands there on a shared host (measured: most spans
agree within tens of microseconds; one preempted span can differ by ms).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from afd_split.ranges import parse_range
from pytest_afd.backends.cpu.afd import AfdRuntime
from pytest_afd.backends.cpu.afd.evidence import FFN_IDLE
from pytest_afd.backends.cpu.afd.tracing import trace_path
from tests.support.afd_runtime_helpers import SEED, THREADS_PER_RANK, make_batch, plan_for

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

from pytest_afd.profiling import torch_trace

CLOCK_GRANULARITY_S = 1e-6
MEDIAN_GAP_S = 5e-4
LENGTHS = [40, 24]


@pytest.fixture(scope="module")
def traced_step(afd_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    runtime = AfdRuntime(afd_config, SEED, num_attention=1, num_ffn=2,
                         threads_per_rank=THREADS_PER_RANK)
    try:
        ids, metadata = make_batch(afd_config, LENGTHS, seed=9)
        plan = plan_for(metadata, "token_balanced")
        runtime.run_forward(ids, metadata, plan, instrument=False)  # no trace: not instrumented
        runtime.trace_dir = str(root)
        plain = runtime.run_forward(ids, metadata, plan, instrument=False)
        result = runtime.run_forward(ids, metadata, plan, instrument=True)
    finally:
        runtime.close()
    return root, result, plain


def _trace_durations(path):
    items = torch_trace.read_items(torch_trace.read_events(path), "0")
    return [(i.tag.stage, i.tag.layer, i.tag.ubatch, i.duration_s) for i in items]


def test_only_instrumented_steps_write_traces(traced_step):
    root, result, _ = traced_step
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json"))
    step = result.evidence["step"] if "step" in result.evidence else None
    assert len(files) == 3, files  # one Attention and two FFN ranks, the instrumented step only
    assert all(f.endswith(".pt.trace.json") for f in files)
    if step is not None:
        assert trace_path(root, "attention", 0, step).is_file()


def test_every_span_has_its_range_inside_it(traced_step):
    root, result, _ = traced_step
    for global_rank, spans in result.spans.items():
        role, index = ("attention", 0) if global_rank == 0 else ("ffn", global_rank - 1)
        (path,) = (root / role / f"rank{index}").glob("*.pt.trace.json")
        ranges = defaultdict(list)
        for stage, layer, ubatch, seconds in _trace_durations(path):
            ranges[(stage, layer, ubatch)].append(seconds)
        timed = [s for s in spans if s.kind != FFN_IDLE]  # idle is recorded after the fact
        assert Counter((s.kind, s.layer, s.ubatch) for s in timed) == Counter(
            {key: len(values) for key, values in ranges.items()})
        by_key = defaultdict(list)
        for span in timed:
            by_key[(span.kind, span.layer, span.ubatch)].append(span.duration)
        for key, durations in by_key.items():
            for span_s, range_s in zip(sorted(durations), sorted(ranges[key]), strict=True):
                assert range_s <= span_s + CLOCK_GRANULARITY_S, key


def test_analysis_agrees_with_the_timeline(traced_step):
    root, result, _ = traced_step
    profile = torch_trace.analyse(root)
    evidence = result.evidence
    for global_rank, spans in result.spans.items():
        role, index = ("attention", 0) if global_rank == 0 else ("ffn", global_rank - 1)
        (path,) = (root / role / f"rank{index}").glob("*.pt.trace.json")
        ranges = {(stage, layer, ubatch): seconds
                  for stage, layer, ubatch, seconds in _trace_durations(path)}
        gaps = sorted(s.duration - ranges[(s.kind, s.layer, s.ubatch)]
                      for s in spans if s.kind != FFN_IDLE)
        assert gaps[len(gaps) // 2] <= MEDIAN_GAP_S, (role, index, gaps)
    for role in ("attention", "ffn"):
        kinds = {k for k in evidence["totals_s"][role] if k != FFN_IDLE}
        assert {row["range"] for row in profile["per_layer"] if row["role"] == role} == kinds
    step = profile["per_step"][0]
    assert 0.0 <= step["overlap_fraction"] <= 1.0
    assert step["critical_path_s"] > 0
    assert profile["straggler"]["per_layer"], "two FFN ranks: a straggler per MoE layer"
    assert {e["layer"] for e in profile["straggler"]["per_layer"]} == set(
        row["layer"] for row in evidence["per_layer"]["ffn"])
    assert not profile["unclassified"]
    assert 0.0 < profile["roles"]["ffn"]["busy_fraction"] <= 1.0


def test_ranges_parse_as_the_hook_writes_them(traced_step):
    root, _, _ = traced_step
    (path,) = (root / "attention" / "rank0").glob("*.pt.trace.json")
    names = {stage for stage, *_ in _trace_durations(path)}
    assert {"attention", "dispatch", "wait", "combine"} <= names
    assert parse_range("afd|attention|L3|U1").ubatch == 1


def test_profile_summary_reads_a_cpu_runs_traces(traced_step, tmp_path):
    import json

    from pytest_afd.__main__ import main

    root, _, _ = traced_step
    assert main(["profile-summary", str(root), "--output", str(tmp_path)]) == 0
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["source"] == "torch_trace"
    assert (tmp_path / "plots" / "profile_layers.png").is_file()


def test_profiled_backend_reads_cpu_servers_kept_traces(traced_step, tmp_path):
    """The rehearsal's path: CPU servers keep afd-traces-* roots, the harness analyses them."""
    import shutil

    from pytest_afd.core.backend import PromptRequest, RunOutputs, RunSettings
    from pytest_afd.profiling.backend import ProfiledBackend
    from pytest_afd.profiling.cpu_run import TRACE_ROOT_PREFIX

    root, _, _ = traced_step
    kept = tmp_path / "kept"

    class Server:
        name, capabilities = "cpu-server", frozenset()

        def run(self, prompts, settings):
            if settings.instrument:
                shutil.copytree(root, kept / f"{TRACE_ROOT_PREFIX}x1")
            return RunOutputs(requests=[], steps=[{"step": 0}], expert_load=[[1, 2, 3, 4]] * 3)

    backend = ProfiledBackend.wrap_from_env(Server(), {"AFD_PROFILE_TRACE_DIRS": f"torch={kept}"})
    outputs = backend.run([PromptRequest("r", (1, 2))], RunSettings(instrument=True))
    assert outputs.profile is not None, backend.last_problem
    assert outputs.profile["source"] == "torch_trace"
    assert outputs.profile["steps_attached"] is True
    assert outputs.steps[0]["profile"]["critical_path_s"] > 0
    assert outputs.profile["straggler"]["expert_load_per_rank"] == [[3, 7]] * 3


def test_connector_messages_are_collectives_with_conserved_volume(traced_step):
    """Every message one role sends the other receives: the Attention side's volume (its
    sends and receives) equals the FFN side's, op for op."""
    root, _, _ = traced_step
    profile = torch_trace.analyse(root)
    by_role = {c["role"]: c for c in profile["collectives"]}
    assert set(by_role) == {"attention", "ffn"}
    assert {c["group"] for c in by_role.values()} == {torch_trace.CONNECTOR_GROUP}
    attention, ffn = by_role["attention"], by_role["ffn"]
    assert attention["volume_mb_per_step"] > 0 and attention["ops_per_step"] > 0
    # ffn: per-rank means over two ranks; attention: one rank.
    assert attention["ops_per_step"] == pytest.approx(ffn["ops_per_step"] * len(ffn["ranks"]))
    assert attention["volume_mb_per_step"] == pytest.approx(
        ffn["volume_mb_per_step"] * len(ffn["ranks"]))

"""Report scale: a nightly history of result files -> ``python -m pytest_afd report`` time and memory.

Writes ``--files`` schema-valid result files (default 10,000) spread over
``--sessions`` sessions (default 50, so the latest holds 200), shaped like the
reduced model's stage results (10 MoE layers x 64 experts, 3 repetitions,
host conditions), then runs the report twice in a subprocess: cold (no scan
cache) and warm (cache present, as on the next night). Wall time and the
subprocess's peak RSS (ru_maxrss) are measured for each.

Targets (issue 22): 10,000 files -> report in <= 20 s and <= 300 MB, cold and
warm. JSON (``--json``) with one ``met`` flag per target; one summary line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.stats.host import HostSample, host_json
from pytest_afd.topology.spec import parse_topology
from pytest_afd.workloads import make_workload

TARGET_SECONDS = 20.0
TARGET_MIB = 300.0
DEFAULT_FILES = 10_000
DEFAULT_SESSIONS = 50
NUM_LAYERS = 10
NUM_EXPERTS = 64
EP_RANKS = 8
REPS = 3
POLICIES = ("none", "request_boundary", "token_balanced")
DATASETS = ("uniform", "bimodal", "long_short")
BYTES_PER_KIB = 1024
KIB_PER_MIB = 1024
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _template(dataset: str, policy: str) -> dict:
    """One valid result document (validated once), the shape of a reduced-model stage case."""
    workload = make_workload(dataset, target_total_tokens=16384, scale=1 / 32, block_size=16,
                             vocab_size=128)
    runs = []
    for rep in range(REPS):
        wall = 1.0 + 0.05 * rep
        requests = [RequestOutput(p.request_id, p.num_prompt_tokens, 0, 1, ttft_s=wall)
                    for p in workload.prompts()]
        run = RunOutputs(requests=requests, steps=[],
                         expert_load=[[10 + (e * 7 + layer) % 13 for e in range(NUM_EXPERTS)]
                                      for layer in range(NUM_LAYERS)],
                         wall_time_s=wall)
        run.host = HostSample(wall, wall * 0.9, wall * 0.9, (1.0, 1.0, 1.0), (1.0, 1.0, 1.0))
        runs.append(run)
    manifest = collect_manifest(
        topology=parse_topology("dp3pcp8-ep8"), backend_name="cpu",
        backend_description={"model": {"num_layers": NUM_LAYERS}}, model_name="reduced",
        protocol={"seed": 0, "warmups": 1, "repetitions": REPS, "run_order": "interleaved",
                  "instrumented": False, "routing": "natural"},
        emulated=True, environ={},
    )
    doc = results.build_result(
        case_id="template", case_kind="stage_a", backend="cpu",
        settings=RunSettings(split_policy=policy), manifest=manifest,
        workload=results.workload_json(dataset_name=workload.name,
                                       prompt_lengths=workload.prompt_lengths,
                                       seed=workload.spec.seed,
                                       dataset_digest=workload.content_hash),
        protocol={"seed": 0, "warmups": 1, "repetitions": REPS, "run_order": "interleaved"},
        metrics=results.metrics_from_runs(runs),
        evidence=results.evidence_from_outputs(runs[0], routing="natural", num_ep_ranks=EP_RANKS),
        host=host_json([run.host for run in runs], cpus=2),
    )
    doc["session_id"] = "template"
    doc["outcome"] = {"status": "passed", "reason": None}
    results.validate_result(doc)
    return doc


def write_history(directory: Path, files: int, sessions: int) -> int:
    """``files`` results over ``sessions`` nightly sessions; returns the bytes written."""
    templates = [_template(d, p) for d in DATASETS for p in POLICIES]
    per_session = -(-files // sessions)
    written = 0
    for index in range(files):
        night, case = divmod(index, per_session)
        doc = dict(templates[case % len(templates)])
        doc["case_id"] = (f"suites/stage_a/test_stage_a_policies.py::test_matrix[n{case}]/"
                          f"{doc['workload']['dataset']['name']}/{doc['settings']['split_policy']}")
        doc["session_id"] = f"night-{night:04d}"
        doc["created_at"] = (START + dt.timedelta(days=night, seconds=case)).isoformat()
        payload = json.dumps(doc, indent=2, sort_keys=True).encode()
        (directory / f"night{night:04d}-case{case:05d}.json").write_bytes(payload)
        written += len(payload)
    return written


# The report runs in a child that prints its own peak RSS (KiB) as the last stderr line.
CHILD = (
    "import resource, sys\n"
    "from pytest_afd.__main__ import main\n"
    "code = main(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def run_report(directory: Path, output: Path) -> dict:
    """One ``python -m pytest_afd report`` in a child: wall seconds and its own peak RSS."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "report", str(directory), "--output", str(output)],
        capture_output=True, text=True, check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"report failed ({done.returncode}): {done.stderr[-2000:]}")
    peak_kib = int(done.stderr.strip().splitlines()[-1])
    return {"seconds": seconds, "peak_rss_mib": peak_kib / KIB_PER_MIB}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=DEFAULT_FILES)
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS)
    parser.add_argument("--dir", type=Path, help="write the history here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.files < 1 or not 1 <= args.sessions <= args.files:
        parser.error(f"--files={args.files} --sessions={args.sessions}: need 1 <= sessions <= files")
    with tempfile.TemporaryDirectory(prefix="report_bench-") as scratch:
        directory = args.dir or Path(scratch) / "results"
        directory.mkdir(parents=True, exist_ok=True)
        load_before = os.getloadavg()
        size = write_history(directory, args.files, args.sessions)
        cold = run_report(directory, Path(scratch) / "report-cold")
        warm = run_report(directory, Path(scratch) / "report-warm")
        load_after = os.getloadavg()
        latest_rows = len([p for p in directory.glob(f"night{args.sessions - 1:04d}-*.json")])
    targets = [
        {"name": f"{name}: {args.files} files -> report", "seconds": run["seconds"],
         "peak_rss_mib": run["peak_rss_mib"], "target_seconds": TARGET_SECONDS,
         "target_mib": TARGET_MIB,
         "met": run["seconds"] <= TARGET_SECONDS and run["peak_rss_mib"] <= TARGET_MIB}
        for name, run in (("cold (no cache)", cold), ("warm (cache)", warm))
    ]
    report = {
        "benchmark": "report_bench",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "files": args.files,
        "sessions": args.sessions,
        "latest_session_results": latest_rows,
        "history_mib": size / BYTES_PER_KIB / KIB_PER_MIB,
        "peak_rss_note": "ru_maxrss of the report process itself (RUSAGE_SELF in the child)",
        "targets": targets,
    }
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    if args.json:
        print(text)
    parts = [f"{t['name']}: {t['seconds']:.1f} s, {t['peak_rss_mib']:.0f} MiB "
             f"(<= {TARGET_SECONDS:.0f} s, <= {TARGET_MIB:.0f} MiB: "
             f"{'met' if t['met'] else 'NOT met'})" for t in targets]
    print(f"report_bench [load {load_before[0]:.1f}, {size / 2**20:.0f} MiB of results]: "
          + "; ".join(parts), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

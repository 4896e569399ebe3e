"""Write the small ``*_ascend_pt`` fixture trees the profiling tests analyse (seeded).

``python tests/support/make_fixtures.py`` rewrites ``tests/profiling/data``;
``test_fixtures_are_generated`` fails when the committed trees differ from what
this script writes, so they cannot drift.

Layout and names (torch_npu Text export, as ``torch_npu.profiler.
tensorboard_trace_handler`` writes it; docs/profiling.md lists the sources):

    <role>/<host>_<pid>_<timestamp>_ascend_pt/
        profiler_info_<rank>.json   # rank id: msprof-analyze 26.2.0 DataPreprocessor.get_rank_id
        profiler_metadata.json      # parallel_group_info: BaseCommunicationGroup.read_parallel_group_info
        ASCEND_PROFILER_OUTPUT/
            kernel_details.csv      # columns read by msprof-analyze's KernelDetailsBean
            step_trace_time.csv     # StepTraceTimeBean / MsprofStepTraceTimeAdapter column names
            communication.json      # {step: {collective|p2p: {op@group: time / bandwidth info}}}
            trace_view.json         # Chrome trace: host ranges (afd_split.ranges), launch flows
            op_statistic.csv

The model: three layers (layer 0 dense, 1-2 MoE, two ubatches), two steps, two
Attention ranks (one TP group) and two FFN ranks (one EP group); FFN rank 1 is
slower on layer 2 (a straggler); one kernel of an unknown type in layer 1.
Kernels run on the device after their host launch with a lag, so only the
launch flows (not device times) place them in the right range.
"""

from __future__ import annotations

import csv
import io
import json
import random
import sys
from pathlib import Path

from msprof_analyze.cluster_analyse.common_func.time_range_calculator import (
    CommunicationTimeRange,
    RangeCaculator,
    TimeRange,
)
from msprof_analyze.cluster_analyse.common_func.utils import double_hash

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from afd_split.ranges import range_name

DATA_DIR = Path(__file__).resolve().parents[1] / "profiling" / "data"
SEED = 31
STEPS = (1, 2)
DENSE_LAYERS = (0,)
MOE_LAYERS = (1, 2)
UBATCHES = (0, 1)
BASE_US = 1_700_000_000_000_000.0
STEP_GAP_US = 5_000.0
LAUNCH_LAG_US = 40.0
UNKNOWN_TYPE = "MysteryFusedOp"
IDLE_BEFORE_US = {"recv": 60.0, "wait": 20.0}
TP_GROUP = "10.0.0.1%enp0_60000_0_1700000000000000"
EP_GROUP = "10.0.0.2%enp0_60001_0_1700000000000000"
KERNEL_HEADER = ("Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "OP State",
                 "Accelerator Core", "Start Time(us)", "Duration(us)", "Wait Time(us)",
                 "Block Dim", "Mix Block Dim", "Input Shapes", "Input Data Types",
                 "Input Formats", "Output Shapes", "Output Data Types", "Output Formats")
STEP_HEADER = ("Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
               "Communication", "Free", "Stage", "Bubble",
               "Communication(Not Overlapped and Exclude Receive)", "Preparing")

# stage -> [(kernel type, nominal duration us)]
ATTENTION_STAGES = {
    "attention": [("MlaPreprocess", 30), ("LightningIndexer", 25), ("SparseFlashAttention", 60),
                  ("MatMulV2", 20), ("hcom_allReduce_", 15)],
    "dense_mlp": [("MatMulV2", 40), ("SwiGlu", 8), ("MatMulV2", 30)],
    "route": [("QuantBatchMatmulV3", 6), ("MoeGatingTopK", 4)],
    "dispatch": [("AsyncDispatchSend", 12)],
    "wait": [("AsyncCombineRecv", 18)],
    "combine": [("Add", 3)],
    "embed": [("GatherV2", 5)],
    "final": [("RmsNorm", 4), ("MatMulV2", 25)],
}
FFN_STAGES = {
    "recv": [("AsyncDispatchRecv", 10)],
    "routed_moe": [("MoeInitRoutingV2", 6), ("GroupedMatmul", 45), ("DequantSwigluQuant", 5),
                   ("GroupedMatmul", 40), ("MoeFinalizeRouting", 6), ("hcom_allGather_", 8)],
    "shared_moe": [("MatMulV2", 15), ("MatMulV2", 12)],
    "send": [("AsyncCombineSend", 9)],
}


def _program(role: str) -> list[tuple[str, int, int]]:
    """(stage, layer, ubatch) ranges in launch order for one step."""
    if role == "ffn":
        return [(stage, layer, ubatch) for layer in MOE_LAYERS for ubatch in UBATCHES
                for stage in ("recv", "routed_moe", "shared_moe", "send")]
    program = [("embed", -1, -1)]
    for layer in DENSE_LAYERS:
        program += [("attention", layer, -1), ("dense_mlp", layer, -1)]
    for layer in MOE_LAYERS:
        for ubatch in UBATCHES:
            program += [("attention", layer, ubatch), ("route", layer, ubatch),
                        ("dispatch", layer, ubatch)]
        for ubatch in UBATCHES:
            program += [("wait", layer, ubatch), ("combine", layer, ubatch)]
    return [*program, ("final", -1, -1)]


def _rank_trace(role: str, rank: int, rng: random.Random) -> dict:
    stages = FFN_STAGES if role == "ffn" else ATTENTION_STAGES
    kernels, events, flow_id = [], [], 1
    for step in STEPS:
        host = BASE_US + (step - 1) * STEP_GAP_US + (200.0 if role == "ffn" else 0.0)
        device = host
        for stage, layer, ubatch in _program(role):
            if stage in IDLE_BEFORE_US:  # blocked on the peer: the device runs dry
                host = max(host, device) + IDLE_BEFORE_US[stage] * rng.uniform(0.5, 1.5)
            range_start = host
            for index, (op_type, nominal) in enumerate(stages[stage]):
                if role == "attention" and stage == "attention" and layer == 1 and index == 0:
                    op_type, nominal = UNKNOWN_TYPE, 7
                scale = 1.6 if (role == "ffn" and rank == 1 and layer == 2) else 1.0
                duration = round(nominal * scale * rng.uniform(0.9, 1.1), 3)
                host += 2.0
                start = round(max(device, host + LAUNCH_LAG_US), 3)
                device = start + duration
                name = f"{op_type}_{layer}_{ubatch}_{index}"
                kernels.append({"step": step, "name": name, "type": op_type, "start": start,
                                "duration": duration})
                events += [{"ph": "s", "cat": "async_npu", "name": "async_npu", "id": flow_id,
                            "pid": rank, "tid": 1, "ts": f"{host:.3f}"},
                           {"ph": "f", "bp": "e", "cat": "async_npu", "name": "async_npu",
                            "id": flow_id, "pid": 100 + rank, "tid": 2, "ts": f"{start:.3f}"},
                           {"ph": "X", "name": name, "pid": 100 + rank, "tid": 2,
                            "ts": f"{start:.3f}", "dur": duration, "args": {"Task Type": "AI_CORE"}}]
                flow_id += 1
            host += 1.0
            events.append({"ph": "X", "cat": "user_annotation", "pid": rank, "tid": 1,
                           "name": range_name(stage, layer, ubatch), "ts": f"{range_start:.3f}",
                           "dur": round(host - range_start, 3)})
    return {"kernels": kernels, "events": events}


def _step_trace(kernels: list[dict]) -> list[dict]:
    """Per-step Computing / Communication / Free as msprof-analyze's RangeCaculator defines them."""
    rows = []
    for step in STEPS:
        own = [k for k in kernels if k["step"] == step]
        comm = [RangeCaculator.generate_time_range(k["start"], k["start"] + k["duration"],
                                                   CommunicationTimeRange)
                for k in own if k["type"].startswith("hcom")]
        compute = [RangeCaculator.generate_time_range(k["start"], k["start"] + k["duration"],
                                                      TimeRange)
                   for k in own if not k["type"].startswith("hcom")]
        compute = RangeCaculator.merge_continuous_intervals(compute)
        comm = RangeCaculator.merge_continuous_intervals(comm)
        pure, free = RangeCaculator.compute_pipeline_overlap(comm, compute)

        def total(ranges):
            return sum(r.end_ts - r.start_ts for r in ranges)
        computing, communication = total(compute), total(comm)
        not_overlapped, idle = total(pure), total(free)
        rows.append({"Step": step, "Computing": computing,
                     "Communication(Not Overlapped)": not_overlapped,
                     "Overlapped": communication - not_overlapped, "Communication": communication,
                     "Free": idle, "Stage": computing + not_overlapped + idle, "Bubble": 0.0,
                     "Communication(Not Overlapped and Exclude Receive)": not_overlapped,
                     "Preparing": 0.0})
    return rows


def _communication(kernels: list[dict], group: str) -> dict:
    suffix = double_hash(group)
    doc: dict = {}
    for number, kernel in enumerate(k for k in kernels if k["type"].startswith("hcom")):
        elapse_ms = kernel["duration"] / 1000.0
        size_mb = 2.0 if "allReduce" in kernel["type"] else 0.5
        transit_ms = round(elapse_ms * 0.8, 6)
        info = {
            "Communication Time Info": {
                "Start Timestamp(us)": kernel["start"], "Elapse Time(ms)": elapse_ms,
                "Transit Time(ms)": transit_ms, "Wait Time(ms)": round(elapse_ms * 0.2, 6),
                "Synchronization Time(ms)": 0.0, "Idle Time(ms)": 0.0,
                "Wait Time Ratio": 0.2, "Synchronization Time Ratio": 0.0},
            "Communication Bandwidth Info": {
                "HCCS": {"Transit Time(ms)": transit_ms, "Transit Size(MB)": size_mb,
                         "Bandwidth(GB/s)": round(size_mb / transit_ms, 4),
                         "Large Packet Ratio": 0.0,
                         "Size Distribution": {str(size_mb): [1, transit_ms]}}},
        }
        step = doc.setdefault(f"step{kernel['step']}", {"collective": {}, "p2p": {}})
        step["collective"][f"{kernel['type']}_{number}_1@{suffix}"] = info
    return doc


def _csv(header: tuple, rows: list[tuple]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def rank_files(role: str, rank: int) -> dict[str, str]:
    """Relative path -> text of one rank's ``*_ascend_pt`` tree."""
    rng = random.Random(f"{SEED}-{role}-{rank}")
    trace = _rank_trace(role, rank, rng)
    kernels = trace["kernels"]
    group, group_name = (TP_GROUP, "tp") if role == "attention" else (EP_GROUP, "ep")
    root = f"node{rank}_{4000 + rank}_20261203020000000_ascend_pt"
    out = f"{root}/ASCEND_PROFILER_OUTPUT"
    kernel_rows = [(k["step"], 4294967295, i, 2, k["name"], k["type"], "static",
                    "AI_CORE", f"{k['start']:.3f}\t", k["duration"], 0.0, 24, 0, "1,7168",
                    "BF16", "ND", "1,7168", "BF16", "ND") for i, k in enumerate(kernels)]
    step_rows = [tuple(round(row[column], 3) if column != "Step" else row[column]
                       for column in STEP_HEADER) for row in _step_trace(kernels)]
    stats: dict[str, list[float]] = {}
    for kernel in kernels:
        stats.setdefault(kernel["type"], []).append(kernel["duration"])
    op_rows = [("AI_CORE", op_type, len(d), round(sum(d), 3), round(min(d), 3),
                round(sum(d) / len(d), 3), round(max(d), 3), 0.0) for op_type, d in sorted(stats.items())]
    metadata = {"parallel_group_info": {group: {"group_name": group_name, "group_rank": rank,
                                                "global_ranks": [0, 1]}}}
    return {
        f"{root}/profiler_info_{rank}.json": json.dumps({"rank_id": rank}),
        f"{root}/profiler_metadata.json": json.dumps(metadata, indent=1),
        f"{out}/kernel_details.csv": _csv(KERNEL_HEADER, kernel_rows),
        f"{out}/step_trace_time.csv": _csv(STEP_HEADER, step_rows),
        f"{out}/communication.json": json.dumps(_communication(kernels, group), indent=1),
        f"{out}/trace_view.json": json.dumps(trace["events"]),
        f"{out}/op_statistic.csv": _csv(("OP Type", "Core Type", "Count", "Total Time(us)",
                                         "Min Time(us)", "Avg Time(us)", "Max Time(us)",
                                         "Ratio(%)"), [(r[1], r[0], *r[2:]) for r in op_rows]),
    }


def fixture_files() -> dict[str, str]:
    """Relative path under DATA_DIR -> text, both roles, two ranks each."""
    return {f"{role}/{path}": text for role in ("attention", "ffn") for rank in (0, 1)
            for path, text in rank_files(role, rank).items()}


def write(directory: Path = DATA_DIR) -> None:
    for path, text in fixture_files().items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


if __name__ == "__main__":
    write()

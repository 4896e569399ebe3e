"""A known-answer torch_npu ``*_ascend_pt`` export: every duration, overlap, gap and rank
difference chosen in advance, so each summary figure has a value computed by hand.

Written independently of ``make_fixtures.py``: the layout follows the real export
committed under tests/profiling/real_exports (torch_npu 2.7.1 / CANN 8.5.0:
``Device_id`` first, microsecond timestamps as text with three decimals and
torch_npu's trailing tab) and what msprof-analyze 26.2.0 reads (rank from
``profiler_info_<rank>.json``, groups from ``profiler_metadata.json``'s
``parallel_group_info`` hashed with its ``double_hash``, ``communication.json``
with all five transport rows, SDMA being HCCS + PCIE + SIO).

One Attention rank (0) and two FFN ranks (0, 1), two identical steps, two layers.
Times below are offsets in ns from the step's start; step 2 starts 10 000.333 us
after step 1, at a base with sub-microsecond digits, so a float timebase would
give the two steps different figures.

Attention rank 0 (host ranges ``afd|attention|L<i>|U-`` [-10, 240) / [390, 640) and
``afd|wait|L<i>|U-`` [240, 390) / [640, 790); each kernel launched 1 us before it starts):
  SparseFlashAttention [0, 200) and [400, 600) us; tp hcom_allReduce_ [180, 220) and
  [580, 620) (20 us of each under the attention kernel); AsyncCombineRecv in the
  wait ranges [250, 400) and [650, 800). Step 1000 us.
FFN rank r (no AFD range, as on hardware): GroupedMatmul at 200 and 600 us lasting
  GMM_US[r] (50 / 70), then an ep hcom_allGather_ of 30 us. Steps 1000 / 1100 us.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from msprof_analyze.cluster_analyse.common_func.utils import double_hash

NS_PER_US = 1_000
BASE_NS = 1_700_000_000_123_456_789  # 1700000000123456.789 us
STEP_START_NS = {1: 0, 2: 10_000_333}
GMM_US = {0: 50, 1: 70}
FFN_STEP_US = {0: 1000, 1: 1100}
ATTENTION_STEP_US = 1000
TP_GROUP_ID, EP_GROUP_ID = "10.0.0.1%enp0_60000_0_1700000000000000", "10.0.0.2%enp0_60001_0_17"
GROUP_IDS = {"tp": TP_GROUP_ID, "ep": EP_GROUP_ID}
TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")

# What each op moves (MB) and how long its transfers took (ms), per transport row.
TP_OP_MOVES = {"HCCS": (2.0, 0.02), "SDMA": (2.0, 0.02)}
EP_OP_MOVES = {"HCCS": (0.5, 0.006), "PCIE": (0.25, 0.004), "SDMA": (0.75, 0.01),
               "RDMA": (0.25, 0.01)}
TP_ELAPSE_MS, EP_ELAPSE_MS = 0.04, 0.03

KERNEL_HEADER = ("Device_id", "Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type",
                 "OP State", "Accelerator Core", "Start Time(us)", "Duration(us)",
                 "Wait Time(us)", "Block Dim", "Mix Block Dim", "HF32 Eligible", "Input Shapes",
                 "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
                 "Output Formats", "Context ID")
STEP_HEADER = ("Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
               "Communication", "Free", "Stage", "Bubble",
               "Communication(Not Overlapped and Exclude Receive)", "Preparing")


@dataclass(frozen=True)
class Kernel:
    layer: int
    op_type: str
    start_us: int
    duration_us: int
    group: str | None = None  # collectives: tp / ep


@dataclass(frozen=True)
class Range:
    stage: str
    layer: int
    start_us: int
    end_us: int

    @property
    def name(self) -> str:
        return f"afd|{self.stage}|L{self.layer}|U-"


def us_text(ns: int) -> str:
    """torch_npu's timestamp text: microseconds with three decimals."""
    return f"{ns // NS_PER_US}.{ns % NS_PER_US:03d}"


ATTENTION_KERNELS = [k for layer, base in ((0, 0), (1, 400)) for k in (
    Kernel(layer, "SparseFlashAttention", base, 200),
    Kernel(layer, "hcom_allReduce_", base + 180, 40, "tp"),
    Kernel(layer, "AsyncCombineRecv", base + 250, 150))]
# Host ranges open LEAD_US before their first kernel's launch (each launch is 1 us before
# its kernel starts), so every kernel is launched inside its own layer's range.
LEAD_US = 10
ATTENTION_RANGES = [r for layer, base in ((0, 0), (1, 400)) for r in (
    Range("attention", layer, base - LEAD_US, base + 240),
    Range("wait", layer, base + 240, base + 400 - LEAD_US))]
# (computing, comm not overlapped, overlapped, communication, free, stage, bubble) in us
ATTENTION_STEP_TRACE = (700, 40, 40, 80, 260, 1000, 0)


def ffn_kernels(rank: int) -> list[Kernel]:
    gmm = GMM_US[rank]
    return [k for layer, base in ((0, 200), (1, 600)) for k in (
        Kernel(layer, "GroupedMatmul", base, gmm),
        Kernel(layer, "hcom_allGather_", base + gmm, 30, "ep"))]


def ffn_step_trace(rank: int) -> tuple[int, ...]:
    computing, communication = 2 * GMM_US[rank], 60
    free = FFN_STEP_US[rank] - computing - communication
    return (computing, communication, 0, communication, free, FFN_STEP_US[rank], 0)


def _csv(header: tuple[str, ...], rows: list[list[object]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def kernel_details(rank: int, kernels: list[Kernel]) -> str:
    rows = []
    for step, offset in STEP_START_NS.items():
        for task, kernel in enumerate(kernels):
            start = BASE_NS + offset + kernel.start_us * NS_PER_US
            rows.append([rank, step, 4294967295, 1000 * step + task, 2,
                         f"{kernel.op_type}_{kernel.layer}_{task}", kernel.op_type, "dynamic",
                         "AI_CORE" if kernel.group is None else "COMMUNICATION",
                         us_text(start) + "\t", f"{kernel.duration_us:.3f}", "0", 24, 0, "NO",
                         '"8,7168"', "BF16", "ND", '"8,7168"', "BF16", "ND", "N/A"])
    return _csv(KERNEL_HEADER, rows)


def step_trace(rank: int, values: tuple[int, ...]) -> str:
    rows = [[rank, step, *values, values[1], 0] for step in STEP_START_NS]
    return _csv(STEP_HEADER, rows)


def _op_info(start_ns: int, elapse_ms: float, moves: dict[str, tuple[float, float]]) -> dict:
    transit_ms = sum(t for name, (_, t) in moves.items() if name in ("SDMA", "RDMA"))
    bandwidth = {}
    for name in TRANSPORTS:
        size, time = moves.get(name, (0, 0))
        bandwidth[name] = {"Transit Size(MB)": size, "Transit Time(ms)": time,
                           "Bandwidth(GB/s)": round(size / time, 4) if time else 0,
                           "Large Packet Ratio": 0.0, "Size Distribution": {}}
    return {"Communication Time Info": {
        "Start Timestamp(us)": float(us_text(start_ns)), "Elapse Time(ms)": elapse_ms,
        "Transit Time(ms)": transit_ms, "Wait Time(ms)": 0.0, "Synchronization Time(ms)": 0.0,
        "Idle Time(ms)": round(elapse_ms - transit_ms, 6), "Wait Time Ratio": 0.0,
        "Synchronization Time Ratio": 0.0}, "Communication Bandwidth Info": bandwidth}


def communication(kernels: list[Kernel]) -> str:
    doc = {}
    for step, offset in STEP_START_NS.items():
        ops = {}
        for index, kernel in enumerate(k for k in kernels if k.group):
            moves, elapse = ((TP_OP_MOVES, TP_ELAPSE_MS) if kernel.group == "tp"
                             else (EP_OP_MOVES, EP_ELAPSE_MS))
            name = (f"{kernel.op_type}_{index}_{step}_1@"
                    f"{double_hash(GROUP_IDS[kernel.group])}")
            start = BASE_NS + offset + kernel.start_us * NS_PER_US
            ops[name] = _op_info(start, elapse, moves)
        doc[f"step{step}"] = {"collective": ops, "p2p": {}}
    return json.dumps(doc, indent=1)


def trace_view(rank: int, kernels: list[Kernel], ranges: list[Range]) -> str:
    """Host ranges (user_annotation), device kernels and their launch flows (async_npu)."""
    host_pid, device_pid = 1000 + rank, 2000 + rank
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": host_pid, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": device_pid,
         "args": {"name": "Ascend Hardware"}}]
    flow = 0
    for offset in STEP_START_NS.values():
        at = BASE_NS + offset
        for r in ranges:
            events.append({"ph": "X", "cat": "user_annotation", "name": r.name, "pid": host_pid,
                           "tid": 1, "ts": us_text(at + r.start_us * NS_PER_US),
                           "dur": r.end_us - r.start_us, "args": {}})
        for kernel in kernels:
            start = at + kernel.start_us * NS_PER_US
            flow += 1
            events += [
                {"ph": "X", "name": f"{kernel.op_type}_{kernel.layer}", "pid": device_pid,
                 "tid": 2, "ts": us_text(start), "dur": kernel.duration_us,
                 "args": {"Task Type": "AI_CORE"}},
                # Launched on the host one us before it starts, inside the same range.
                {"ph": "s", "cat": "async_npu", "name": "async_npu", "id": str(flow),
                 "pid": host_pid, "tid": 1, "ts": us_text(start - NS_PER_US)},
                {"ph": "f", "bp": "e", "cat": "async_npu", "name": "async_npu",
                 "id": str(flow), "pid": device_pid, "tid": 2, "ts": us_text(start)}]
    return json.dumps(events)


def _write_rank(root: Path, rank: int, kernels: list[Kernel], ranges: list[Range],
                trace: tuple[int, ...], groups: dict[str, list[int]]) -> Path:
    rank_dir = root / f"node{rank}_{40000 + rank}_20261207140000000_ascend_pt"
    output = rank_dir / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    info = {"config": {"common_config": {"activities": ["ProfilerActivity.CPU",
                                                        "ProfilerActivity.NPU"]}},
            "torch_npu_version": "2.7.1", "cann_version": "8.5.0", "rank_id": str(rank)}
    (rank_dir / f"profiler_info_{rank}.json").write_text(json.dumps(info, indent=4))
    metadata = {"ENV_VARIABLES": {}, "parallel_group_info": {
        GROUP_IDS[name]: {"group_name": name, "group_rank": ranks.index(rank),
                          "global_ranks": ranks} for name, ranks in groups.items()}}
    (rank_dir / "profiler_metadata.json").write_text(json.dumps(metadata))
    (output / "kernel_details.csv").write_text(kernel_details(rank, kernels))
    (output / "step_trace_time.csv").write_text(step_trace(rank, trace))
    (output / "communication.json").write_text(communication(kernels))
    (output / "trace_view.json").write_text(trace_view(rank, kernels, ranges))
    return rank_dir


def write(root: Path) -> dict[str, Path]:
    """The two role directories under ``root`` (``attention/``, ``ffn/``)."""
    roles = {"attention": Path(root) / "attention", "ffn": Path(root) / "ffn"}
    _write_rank(roles["attention"], 0, ATTENTION_KERNELS, ATTENTION_RANGES,
                ATTENTION_STEP_TRACE, {"tp": [0]})
    for rank in (0, 1):
        _write_rank(roles["ffn"], rank, ffn_kernels(rank), [], ffn_step_trace(rank),
                    {"ep": [0, 1]})
    return roles

"""msprof-analyze: the step trace and per-collective communication of each role's ranks.

msprof-analyze (pip ``msprof-analyze``, the Ascend toolkit's cluster analyser,
read at 26.2.0; optional extra ``pytest-afd[profile]``) does the work: its
``cluster -m all`` mode collates every rank's ``step_trace_time.csv``
(Computing, Communication(Not Overlapped), Overlapped, Communication, Free,
Stage, Bubble, in microseconds) into ``cluster_step_trace_time.csv`` and every
rank's ``communication.json`` into ``cluster_communication.json`` with a
"Total Op Info" per group, step and rank (elapse / transit time, transit size,
bandwidth per transport). ``communication_group.json`` names each group
(``pg_name`` from the ranks' ``profiler_metadata.json``). Here we only run it
and read its output files with its own readers.

Transports: CANN's HCCL analysis writes five rows per op in "Communication
Bandwidth Info" (msprof-analyze ``Constant``: RDMA, HCCS, PCIE, SDMA, SIO). SDMA
is the *aggregate* of HCCS, PCIE and SIO (the msprof parser sums those link
types into it); RDMA is separate. A transfer is therefore counted once as
SDMA + RDMA (SDMA rebuilt from HCCS + PCIE + SIO only when a file lacks the row),
and each transport's bandwidth is its size / its transit time, as
msprof-analyze's ``CommunicationAnalysis.compute_bandwidth_ratio`` does.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_afd.profiling.timebase import ms_to_ns, us_to_ns

PACKAGE = "msprof-analyze"
INSTALL_HINT = "pip install 'pytest-afd[profile]' (or: pip install msprof-analyze==26.2.0)"
OUTPUT_DIR = "cluster_analysis_output"
STEP_TRACE_CSV = "cluster_step_trace_time.csv"
COMMUNICATION_JSON = "cluster_communication.json"
GROUP_JSON = "communication_group.json"
TOTAL_OP_PREFIX = "Total Op Info@"
RANK_ROW = "rank"
SDMA, RDMA = "SDMA", "RDMA"
SDMA_LINKS = ("HCCS", "PCIE", "SIO")  # the link types SDMA aggregates
TRANSIT_SIZE = "Transit Size(MB)"
TRANSIT_TIME = "Transit Time(ms)"
ELAPSE_TIME = "Elapse Time(ms)"
# msprof-analyze takes a few seconds on small traces; real clusters take minutes.
ANALYSIS_TIMEOUT_S = 1800
_CLI = ("import sys; from msprof_analyze.cli.entrance import msprof_analyze_cli; "
        "sys.exit(msprof_analyze_cli())")
STEP_TRACE_FIELDS = {
    "Computing": "computing_ns",
    "Communication(Not Overlapped)": "communication_not_overlapped_ns",
    "Overlapped": "overlapped_ns",
    "Communication": "communication_ns",
    "Free": "free_ns",
    "Stage": "stage_ns",
    "Bubble": "bubble_ns",
}


class ProfilingUnavailable(RuntimeError):
    """msprof-analyze is not installed (the ``profile`` extra) or could not analyse a directory."""


def version() -> str:
    """The installed msprof-analyze version; a clear error when it is missing."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError as error:
        raise ProfilingUnavailable(
            f"{PACKAGE} is not installed, so ascend_pt profiles cannot be analysed: "
            f"{INSTALL_HINT}") from error


def file_manager():
    """msprof-analyze's file reader (path checks, size limits lifted: our own traces)."""
    version()
    from msprof_analyze.prof_common.additional_args_manager import AdditionalArgsManager
    from msprof_analyze.prof_common.file_manager import FileManager

    AdditionalArgsManager().init({"force": True})
    return FileManager


def run_cluster_analysis(collection: Path, output: Path) -> Path:
    """``msprof-analyze cluster -m all`` on one role's ranks; returns its output directory."""
    version()
    collection, output = Path(collection), Path(output)
    if not collection.is_dir():
        raise ProfilingUnavailable(f"profile directory {str(collection)!r} does not exist")
    output.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", _CLI, "cluster", "-d", str(collection), "-m", "all",
               "-o", str(output), "--force"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=ANALYSIS_TIMEOUT_S,
                          env=env, check=False)
    result = output / OUTPUT_DIR
    if done.returncode != 0 or not (result / STEP_TRACE_CSV).is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise ProfilingUnavailable(
            f"{PACKAGE} found no step trace under {str(collection)!r} (exit {done.returncode}; "
            f"expected *_ascend_pt/ASCEND_PROFILER_OUTPUT/step_trace_time.csv and "
            f"profiler_info_<rank>.json): {' | '.join(tail)}")
    return result


def step_trace(result: Path) -> list[dict[str, Any]]:
    """Per rank and step: the step-trace columns in integer ns (None: no value in the file)."""
    path = Path(result) / STEP_TRACE_CSV
    rows = file_manager().read_csv_file(str(path))
    records = []
    for number, row in enumerate(rows, start=2):
        if row.get("Type") != RANK_ROW:
            continue
        record: dict[str, Any] = {"rank": int(row["Index"]), "step": str(row["Step"] or "")}
        for column, key in STEP_TRACE_FIELDS.items():
            text = row.get(column)
            record[key] = (us_to_ns(text, f"{str(path)!r} line {number}: {column}")
                           if text not in (None, "") else None)
        records.append(record)
    return sorted(records, key=lambda r: (r["rank"], r["step"]))


def group_names(result: Path) -> dict[str, str]:
    """Hashed group name -> the process group's name (``pg_name``), where the metadata has it."""
    path = Path(result) / GROUP_JSON
    if not path.is_file():
        return {}
    doc = file_manager().read_json_file(str(path))
    return {str(entry["group_name"]): str(entry.get("pg_name") or entry["group_name"])
            for entry in doc.get("comm_group_parallel_info", [])}


def transports(bandwidth: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """SDMA and RDMA of one "Communication Bandwidth Info": size (MB) and transit time (ns).

    HCCS, PCIE and SIO are the parts SDMA already sums, so they are not added again.
    """
    def entry(rows: list[dict[str, Any]], where: str) -> dict[str, Any]:
        return {"volume_mb": float(sum(float(r.get(TRANSIT_SIZE) or 0) for r in rows)),
                "transit_time_ns": sum(ms_to_ns(r.get(TRANSIT_TIME) or 0, where) for r in rows)}

    sdma = ([bandwidth[SDMA]] if SDMA in bandwidth else
            [bandwidth[link] for link in SDMA_LINKS if link in bandwidth])
    out = {SDMA: entry(sdma, f"{SDMA} {TRANSIT_TIME}")}
    if RDMA in bandwidth:
        out[RDMA] = entry([bandwidth[RDMA]], f"{RDMA} {TRANSIT_TIME}")
    return {name: figures for name, figures in out.items()
            if figures["volume_mb"] or figures["transit_time_ns"]}


def collectives(result: Path) -> list[dict[str, Any]]:
    """Per group, step and rank: collective time, volume and bandwidth (msprof-analyze's totals)."""
    path = Path(result) / COMMUNICATION_JSON
    if not path.is_file():
        return []
    doc = file_manager().read_json_file(str(path))
    names = group_names(result)
    records = []
    for ranks, steps in doc.items():
        for step, ops in steps.items():
            for op_name, per_rank in ops.items():
                if not op_name.startswith(TOTAL_OP_PREFIX):
                    continue
                group = op_name[len(TOTAL_OP_PREFIX):]
                count = sum(1 for name in ops if not name.startswith(TOTAL_OP_PREFIX)
                            and name.endswith(f"@{group}"))
                for rank, info in per_rank.items():
                    elapse = info.get("Communication Time Info", {}).get(ELAPSE_TIME)
                    by_transport = transports(info.get("Communication Bandwidth Info", {}))
                    records.append({
                        "group": names.get(group, group), "group_hash": group,
                        "ranks": ranks, "step": step.removeprefix("step"), "rank": int(rank),
                        "num_ops": count,
                        "time_ns": (ms_to_ns(elapse, f"{str(path)!r}: {op_name} rank {rank} "
                                                     f"{ELAPSE_TIME}")
                                    if elapse is not None else None),
                        "transit_time_ns": sum(t["transit_time_ns"]
                                               for t in by_transport.values()),
                        "volume_mb": sum(t["volume_mb"] for t in by_transport.values()),
                        "transports": by_transport,
                    })
    return records

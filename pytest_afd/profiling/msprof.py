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
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGE = "msprof-analyze"
INSTALL_HINT = "pip install 'pytest-afd[profile]' (or: pip install msprof-analyze==26.2.0)"
OUTPUT_DIR = "cluster_analysis_output"
STEP_TRACE_CSV = "cluster_step_trace_time.csv"
COMMUNICATION_JSON = "cluster_communication.json"
GROUP_JSON = "communication_group.json"
TOTAL_OP_PREFIX = "Total Op Info@"
RANK_ROW = "rank"
US_PER_S = 1e6
MS_PER_S = 1e3
# msprof-analyze takes a few seconds on small traces; real clusters take minutes.
ANALYSIS_TIMEOUT_S = 1800
_CLI = ("import sys; from msprof_analyze.cli.entrance import msprof_analyze_cli; "
        "sys.exit(msprof_analyze_cli())")
STEP_TRACE_FIELDS = {
    "Computing": "computing_s",
    "Communication(Not Overlapped)": "communication_not_overlapped_s",
    "Overlapped": "overlapped_s",
    "Communication": "communication_s",
    "Free": "free_s",
    "Stage": "stage_s",
    "Bubble": "bubble_s",
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
    """Per rank and step: the step-trace columns in seconds."""
    rows = file_manager().read_csv_file(str(Path(result) / STEP_TRACE_CSV))
    records = []
    for row in rows:
        if row.get("Type") != RANK_ROW:
            continue
        record: dict[str, Any] = {"rank": int(row["Index"]), "step": str(row["Step"])}
        for column, key in STEP_TRACE_FIELDS.items():
            record[key] = float(row.get(column) or 0.0) / US_PER_S
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
                    time_info = info.get("Communication Time Info", {})
                    bandwidth = info.get("Communication Bandwidth Info", {})
                    size_mb = sum(t.get("Transit Size(MB)", 0.0) for t in bandwidth.values())
                    transit_ms = sum(t.get("Transit Time(ms)", 0.0) for t in bandwidth.values())
                    records.append({
                        "group": names.get(group, group), "group_hash": group,
                        "ranks": ranks, "step": step.removeprefix("step"), "rank": int(rank),
                        "num_ops": count,
                        "time_s": float(time_info.get("Elapse Time(ms)", 0.0)) / MS_PER_S,
                        "transit_time_s": float(transit_ms) / MS_PER_S,
                        "volume_mb": float(size_mb),
                        "bandwidth_gb_s": float(size_mb) / transit_ms if transit_ms else None,
                    })
    return records

"""torch_npu ``*_ascend_pt`` trees (the AFD plugin's profiler) -> :class:`RoleData`.

One directory per role (the plugin writes each role to its own
``AFD_NPU_<ROLE>_PROFILER_DIR``); msprof-analyze runs once per role so its
communication groups are the role's own.
"""

from __future__ import annotations

import importlib.metadata
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_afd.profiling import evidence, kernels, msprof

SOURCE = "ascend_pt"


def analyzer() -> dict[str, str]:
    return {"name": msprof.PACKAGE, "version": msprof.version()}


def load_role(role: str, collection: Path, workdir: Path) -> evidence.RoleData:
    """Run msprof-analyze on ``collection`` and place every rank's kernels in their ranges."""
    result = msprof.run_cluster_analysis(collection, workdir / role)
    steps_by_rank: dict[int, dict[str, evidence.StepTrace]] = {}
    for row in msprof.step_trace(result):
        values = {k: v for k, v in row.items() if k not in ("rank", "step")}
        steps_by_rank.setdefault(row["rank"], {})[row["step"]] = values
    ranks = []
    for rank_dir in kernels.rank_dirs(collection):
        rank = kernels.rank_id(rank_dir)
        items = [evidence.WorkItem(k.step, k.name, k.op_type, k.start_ns, k.duration_ns, k.tag)
                 for k in kernels.read_kernels(rank_dir)]
        ranks.append(evidence.RankData(rank, items, steps_by_rank.get(rank, {})))
    if not ranks:
        raise msprof.ProfilingUnavailable(f"no *_ascend_pt rank directory under {str(collection)!r}")
    return evidence.RoleData(role, ranks, msprof.collectives(result))


def analyse(role_dirs: Mapping[str, Path], *,
            expert_load_per_rank: Sequence[Sequence[int]] | None = None,
            schedule: Mapping[str, Any] | None = None,
            overhead: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``evidence.profile`` record of the ascend_pt trees of each role."""
    with tempfile.TemporaryDirectory(prefix="afd-msprof-") as scratch:
        roles = {role: load_role(role, Path(path), Path(scratch))
                 for role, path in role_dirs.items()}
    return evidence.build(roles, source=SOURCE, analyzer=analyzer(),
                          expert_load_per_rank=expert_load_per_rank, schedule=schedule,
                          overhead=overhead)


def torch_npu_version() -> str | None:
    try:
        return importlib.metadata.version("torch-npu")
    except importlib.metadata.PackageNotFoundError:
        return None

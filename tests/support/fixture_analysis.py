"""msprof-analyze's output for the committed ascend_pt fixtures, produced once and reused.

``msprof-analyze cluster`` runs as a subprocess that spawns a pool re-importing pandas
(~3.4 s wall, ~5 s CPU per role on the 2-core host), and most profiling tests analyse the
same committed fixture trees (tests/profiling/data) only to check what is built from the
result. :func:`record` runs the real ``ascend.analyse`` once, keeping each role's real
msprof-analyze output; :meth:`FixtureAnalysis.reusing` then answers a
``run_cluster_analysis`` of a directory whose files equal one of those roles' byte for
byte with a copy of that real output (any other directory is analysed for real), so the
API, the ``profile-summary`` CLI and the profiled backend still run end to end on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import pickle
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.profiling import ascend, msprof


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative POSIX path -> bytes): what msprof-analyze reads."""
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(Path(root).rglob("*")) if path.is_file()}


@dataclass
class FixtureAnalysis:
    """The real analysis of the fixture roles, and their msprof-analyze outputs to reuse."""

    profile: dict[str, Any]
    """``ascend.analyse(role_dirs)`` as it really ran (msprof-analyze included)."""
    outputs: list[tuple[dict[str, bytes], Path]]
    """(the analysed directory's files, a kept copy of msprof-analyze's output) per role."""
    reused: list[Path] = field(default_factory=list)
    """The directories whose analysis was answered from ``outputs`` (in call order)."""

    def kept_output(self, collection: Path) -> Path | None:
        if not Path(collection).is_dir():
            return None
        files = tree_files(Path(collection))
        return next((kept for analysed, kept in self.outputs if analysed == files), None)

    @contextlib.contextmanager
    def reusing(self) -> Iterator[FixtureAnalysis]:
        """``msprof.run_cluster_analysis`` answers the fixture roles from their real output."""
        real = msprof.run_cluster_analysis

        def run_cluster_analysis(collection: Path, output: Path) -> Path:
            kept = self.kept_output(collection)
            if kept is None:
                return real(collection, output)
            self.reused.append(Path(collection))
            result = Path(output) / msprof.OUTPUT_DIR
            shutil.copytree(kept, result, dirs_exist_ok=True)
            return result

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(msprof, "run_cluster_analysis", run_cluster_analysis)
            yield self


def record(role_dirs: Mapping[str, Path], keep: Path) -> FixtureAnalysis:
    """Run ``ascend.analyse(role_dirs)`` for real, keeping each role's msprof-analyze output."""
    real = msprof.run_cluster_analysis
    outputs: list[tuple[dict[str, bytes], Path]] = []

    def recording(collection: Path, output: Path) -> Path:
        result = real(collection, output)
        kept = Path(keep) / str(len(outputs))
        shutil.copytree(result, kept)
        outputs.append((tree_files(Path(collection)), kept))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(msprof, "run_cluster_analysis", recording)
        profile = ascend.analyse(role_dirs)
    if len(outputs) != len(role_dirs):
        raise AssertionError(f"ascend.analyse ran msprof-analyze {len(outputs)} times for "
                             f"{len(role_dirs)} roles")
    return FixtureAnalysis(profile, outputs)


def record_once(role_dirs: Mapping[str, Path], root: Path) -> FixtureAnalysis:
    """:func:`record` once for every process that passes the same ``root``.

    Why: the xdist workers of one run each needed the same analysis, so each ran
    msprof-analyze on the same committed trees (~7 s CPU per worker). The first to take
    the lock records the real analysis under ``root`` and pickles it there; the others
    load that pickle, the same real output with its kept copies. A failed run writes
    nothing, so the next process runs it again.
    """
    root.mkdir(parents=True, exist_ok=True)
    saved = root / "analysis.pickle"
    with open(root / "analysis.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if saved.is_file():
            return pickle.loads(saved.read_bytes())
        analysis = record(role_dirs, root / "outputs")
        saved.write_bytes(pickle.dumps(analysis))
        return analysis

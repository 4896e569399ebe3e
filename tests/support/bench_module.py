"""A benchmark script under ``benchmarks/`` loaded as a module, for its tests.

The scripts import their siblings (``from bench_load import emit_report``) the way they
run (``python3 benchmarks/x.py``), so ``benchmarks/`` is on ``sys.path`` while the module
loads and for as long as its tests call it; each gets a name of its own so two tests of
one script never share module state with the benchmark run itself.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def loaded_bench(script: str) -> Iterator[ModuleType]:
    """Yield ``benchmarks/<script>.py`` loaded as ``<script>_under_test``."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"{script}_under_test",
                                                      BENCH_DIR / f"{script}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # a dataclass of the script looks its module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(f"{script}_under_test", None)
        sys.path.remove(str(BENCH_DIR))


def bench_fixture(script: str):
    """A module-scoped ``bench`` fixture for ``benchmarks/<script>.py``."""

    @pytest.fixture(scope="module")
    def bench() -> Iterator[ModuleType]:
        yield from loaded_bench(script)

    return bench

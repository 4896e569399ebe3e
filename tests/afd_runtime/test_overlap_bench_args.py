"""afd_overlap_bench's documented modes: the 24-round default and ``--quick``."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the bench imports its sibling modules
    spec = importlib.util.spec_from_file_location("overlap_bench_under_test",
                                                  BENCHMARKS / "afd_overlap_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_default_is_24_rounds_of_3_steps(bench):
    args = bench.parse_args([])
    assert (args.quick, args.repetitions, args.steps_per_case) == (False, 24, 3)


def test_quick_overrides_the_protocol_and_keeps_the_rfc_minimum(bench):
    args = bench.parse_args(["--quick", "--repetitions", "40"])
    assert args.quick
    assert (args.repetitions, args.steps_per_case, args.instrumented_repetitions,
            args.calibration_repetitions, args.warmups) == (3, 1, 1, 1, 1)
    assert args.repetitions >= bench.MIN_REPETITIONS

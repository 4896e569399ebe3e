"""Root conftest: project-wide test settings (the plugin itself loads via its entry point)."""

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.fork_server import ForkServer
from tests.support.suite_selection import needs_a_suite_marker

TESTS_DIR = Path(__file__).parent / "tests"

# OpenMP threads that wait for work spin by default (GNU libgomp: up to ~0.3 s a wait).
# On the shared 2-core host a second intra-op thread (the 2-thread batch-invariance
# cases, CLI and server subprocesses, which keep torch's default of 2 threads) then
# burns a core while its peer is descheduled: one such module took 17 s of CPU with
# spinning and 6 s without. Passive waiting changes no result, only who holds the
# core. Set before any test process or child loads torch (they inherit it); a value
# the user exported wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BYTECODE_CACHE_DIR = Path(tempfile.gettempdir()) / f"pytest-afd-pycache-{os.getuid()}"
"""Where the suite's processes share compiled bytecode when the user keeps it out of the
checkout (PYTHONDONTWRITEBYTECODE): one cache outside every source tree."""


def _share_bytecode_outside_the_checkout() -> None:
    """Under PYTHONDONTWRITEBYTECODE every process the suite starts (xdist workers, the
    CPU servers, CLI and pytester runs: hundreds) compiled pytest_afd's modules and
    re-rewrote the test modules' asserts again, ~0.5 s of CPU each. The user's intent,
    no bytecode beside the sources, is kept by writing it under ``BYTECODE_CACHE_DIR``
    instead (PYTHONPYCACHEPREFIX, Python's own mechanism; pytest's assert rewriting
    honours it too). A PYTHONPYCACHEPREFIX the user exported wins; without
    PYTHONDONTWRITEBYTECODE nothing changes."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(BYTECODE_CACHE_DIR)
    sys.pycache_prefix = str(BYTECODE_CACHE_DIR)
    sys.dont_write_bytecode = False


_share_bytecode_outside_the_checkout()


def _runs_tests(config: pytest.Config) -> bool:
    """False only in xdist's controller, which runs no test: it need not wait for torch
    before starting the workers."""
    return hasattr(config, "workerinput") or not config.getoption("numprocesses", None)


def _prepare_test_process() -> None:
    import torch

    # Two cores here and in CI: keep each test process to a single intra-op thread
    # so pytest-xdist workers and the AFD runtime's processes do not oversubscribe.
    torch.set_num_threads(1)
    # pytester's in-process runs restore sys.modules afterwards, and hypothesis's pytest
    # plugin imports hypothesis in every session's terminal summary: unless this process
    # already holds it, each such run re-imports all of hypothesis (and re-rewrites its
    # asserts, ~1 s, where PYTHONDONTWRITEBYTECODE keeps pytest from caching the rewrite).
    # Optional: the real-vLLM environments (requirements-vllm.txt) do not install it.
    with contextlib.suppress(ImportError):
        import hypothesis  # noqa: F401


@pytest.fixture(scope="session")
def fork_server():
    """Fresh Python processes without a new interpreter importing torch each: children forked
    from one server that imported only torch and numpy (tests/support/fork_server.py). One
    per session (each xdist worker its own), started on first use, ended at teardown."""
    server = ForkServer()
    yield server
    server.close()


def _skips_tests_dir(config: pytest.Config) -> bool:
    """Collected from testpaths with a ``-m`` only suite cases can match (suite_selection)."""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and needs_a_suite_marker(config.option.markexpr))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if _runs_tests(config):
        _prepare_test_process()
    # Initial paths are never offered to pytest_ignore_collect: drop the testpath itself.
    if _skips_tests_dir(config):
        config.args[:] = [arg for arg in config.args
                          if (config.invocation_params.dir / arg).resolve() != TESTS_DIR]


def pytest_report_header(config: pytest.Config) -> str | None:
    if _skips_tests_dir(config):
        return (f"tests/ not collected: -m {config.option.markexpr!r} selects suite cases "
                f"only, and no test there carries a suite marker")
    return None

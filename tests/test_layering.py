"""Layering rules from the design: afd_split stays framework-neutral."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.import_contracts import REPO_ROOT, assert_violation_reported, run_import_linter

FORBIDDEN_AT_IMPORT = ("pytest", "vllm", "vllm_ascend", "torch_npu", "pytest_afd")


def test_afd_split_imports_no_pytest_or_vllm():
    code = (
        "import sys, afd_split\n"
        f"bad = [m for m in {FORBIDDEN_AT_IMPORT!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"afd_split imported {out.stdout.strip()} at import time"


def test_the_plugin_loads_no_report_or_plotting_when_pytest_starts():
    """The real-vLLM environments install no matplotlib, and every pytest start pays for what
    the plugin imports: the report (and its plotting) loads only when a report is made."""
    code = (
        "import sys, pytest_afd.plugin\n"
        "print(','.join(m for m in ('matplotlib', 'pytest_afd.report') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pytest_afd.plugin imported {out.stdout.strip()}"


def test_markers_registered(pytestconfig):
    registered = "\n".join(pytestconfig.getini("markers"))
    for name in ("gate", "stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f"):
        assert f"{name}:" in registered


def test_no_test_directory_shadows_an_optional_package():
    """Test dirs land on sys.path (rootdir import mode): one named like an optional
    package would make find_spec() report it installed, and hardware probes lie."""
    root = Path(__file__).resolve().parent.parent
    optional = {"vllm", "vllm_ascend", "torch_npu", "transformers"}
    shadows = [
        str(path.relative_to(root))
        for top in ("tests", "suites")
        for path in (root / top).rglob("*")
        if path.is_dir() and path.name in optional
    ]
    assert shadows == []


# ---- import-linter contracts (pyproject [tool.importlinter]) ------------------------------------

LAYERS_CONTRACT = "afd_split layers: plan < checks | pcp < engine < hook"
BASE_CONTRACT = "afd_split never imports pytest_afd, suites or tests"
ROOMS_CONTRACT = "pytest_afd rooms (layers in pyproject.toml, docs/contracts.md)"


def test_import_linter_contracts_are_kept():
    """The layers CI enforces: this test IS that enforcement, so a missing linter fails it."""
    returncode, report = run_import_linter(REPO_ROOT)
    assert "No module named 'importlinter'" not in report, "install the test extra: pip install -e .[test]"
    assert returncode == 0, report
    assert f"{LAYERS_CONTRACT} KEPT" in report, report
    assert f"{BASE_CONTRACT} KEPT" in report, report
    assert f"{ROOMS_CONTRACT} KEPT" in report, report


def test_every_room_of_pytest_afd_is_in_the_rooms_contract():
    """A module or package left out of the layers would escape the contract: a new one
    must be given its room (pyproject.toml, docs/contracts.md)."""
    import tomllib

    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    (rooms,) = [contract for contract in config["tool"]["importlinter"]["contracts"]
                if contract["id"] == "harness-rooms"]
    named = {name.strip() for layer in rooms["layers"] for name in layer.replace(":", "|").split("|")}
    package = REPO_ROOT / "pytest_afd"
    present = {path.stem for path in package.glob("*.py") if path.name != "__init__.py"}
    present |= {path.name for path in package.iterdir() if (path / "__init__.py").exists()}
    assert present - named == set(), "rooms missing from the harness-rooms contract"
    assert named - present == set(), "the contract names rooms that do not exist"


VIOLATIONS = {
    # The plan layer reaching up into the engine glue.
    "plan_imports_engine": (
        "afd_split/plan/planner.py",
        "import afd_split.engine.rows  # noqa: F401\n",
        LAYERS_CONTRACT,
        "afd_split.plan.planner -> afd_split.engine.rows",
    ),
    # The framework-neutral base reaching into the harness.
    "checks_import_harness": (
        "afd_split/checks/support.py",
        "import pytest_afd.faults.registry  # noqa: F401\n",
        BASE_CONTRACT,
        "afd_split.checks.support -> pytest_afd.faults.registry",
    ),
    # The result document (a lower room) reaching up into the report.
    "results_import_report": (
        "pytest_afd/results/documents.py",
        "import pytest_afd.report.tables  # noqa: F401\n",
        ROOMS_CONTRACT,
        "pytest_afd.results.documents -> pytest_afd.report.tables",
    ),
    # Two sibling rooms that must stay independent.
    "golden_imports_profiling": (
        "pytest_afd/golden/store.py",
        "import pytest_afd.profiling.overlap  # noqa: F401\n",
        ROOMS_CONTRACT,
        "pytest_afd.golden.store -> pytest_afd.profiling.overlap",
    ),
}


@pytest.mark.parametrize("violation", sorted(VIOLATIONS))
def test_an_import_that_breaks_a_contract_fails_the_linter(tmp_path, violation):
    """One wrong-way import in a copy of the tree: the same config reports that contract broken."""
    assert_violation_reported(tmp_path, *VIOLATIONS[violation])


def _test_module_imports(path: Path) -> list[str]:
    """``file:line module`` of every import of a test module (``test_*``) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{path}:{node.lineno} {name}" for name in names
                  if name.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_test_helpers_come_from_support_modules_not_from_other_tests(tmp_path):
    """Helpers are imported one way: tests/support, a suite's helper module, or a conftest
    fixture; never one test module from another (a test function it names runs twice)."""
    found = [use for root in ("tests", "suites") for path in sorted((REPO_ROOT / root).rglob("*.py"))
             for use in _test_module_imports(path)]
    assert not found, f"test modules imported by other modules: {found}"
    seeded = tmp_path / "test_seeded.py"
    seeded.write_text("from test_other import helper\nimport tests.plugin.test_x\n")
    assert [use.split(" ")[1] for use in _test_module_imports(seeded)] == [
        "test_other", "tests.plugin.test_x"]

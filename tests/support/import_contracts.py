"""Running import-linter on this tree, or on a copy of it with one wrong-way import added."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_import_linter(root):
    """``lint-imports`` on the tree at ``root`` with the pyproject there; (exit code, report)."""
    code = "import sys\nfrom importlinter.cli import lint_imports\nsys.exit(lint_imports(no_cache=True))\n"
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    return out.returncode, out.stdout + out.stderr


def copy_packages(tmp_path):
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("afd_split", "pytest_afd"):
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=skip)
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")


def assert_violation_reported(tmp_path, path, line, contract, chain):
    """Append ``line`` to ``path`` in a copy of the tree: the linter fails with ``contract``
    BROKEN and names the import ``chain``."""
    copy_packages(tmp_path)
    target = tmp_path / path
    target.write_text(target.read_text() + line)
    returncode, report = run_import_linter(tmp_path)
    assert returncode != 0, report
    assert f"{contract} BROKEN" in report, report
    assert chain in report, report

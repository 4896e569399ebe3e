"""The suite's processes share bytecode outside the checkout when the user keeps it out.

conftest.py turns PYTHONDONTWRITEBYTECODE into PYTHONPYCACHEPREFIX for the processes the
suite starts: the user's intent (no ``__pycache__`` beside the sources) is kept, and each
module is compiled once instead of in every server, worker and CLI run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_child_writes_its_bytecode_under_the_prefix_never_beside_the_source(tmp_path):
    prefix = os.environ.get("PYTHONPYCACHEPREFIX")
    if prefix is None or "PYTHONDONTWRITEBYTECODE" in os.environ:
        pytest.skip("nothing was redirected: the session started without "
                    "PYTHONDONTWRITEBYTECODE, or with it and the user's own PYTHONPYCACHEPREFIX "
                    "(conftest.py leaves both as they were)")
    (tmp_path / "bytecode_probe_module.py").write_text("VALUE = 1\n")
    subprocess.run([sys.executable, "-c", "import bytecode_probe_module"], cwd=tmp_path,
                   check=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert not (tmp_path / "__pycache__").exists()
    cached = list(Path(prefix).rglob("bytecode_probe_module*.pyc"))
    assert any(str(tmp_path).lstrip("/") in str(path) for path in cached), cached

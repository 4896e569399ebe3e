"""The gates reach backends only through the backend protocol and fixtures."""

from __future__ import annotations

import ast
from pathlib import Path

GATES = Path(__file__).resolve().parents[2] / "suites" / "gates"
# Backend implementations a gate must not import (the protocol lives in
# pytest_afd.core.backend, the factory in pytest_afd.backends; pure helpers such
# as pytest_afd.serving.logprobs are not backends).
INTERNAL_PREFIXES = ("pytest_afd.backends.cpu", "pytest_afd.backends.vllm_ascend",
                     "pytest_afd.serving.http_backend", "pytest_afd.serving.server",
                     "pytest_afd.serving.lifecycle", "pytest_afd.serving.handler",
                     "pytest_afd.serving.connections", "pytest_afd.serving.engine")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_gate_modules_import_no_backend_internals():
    offenders = {
        path.name: sorted(m for m in imported_modules(path) if m.startswith(INTERNAL_PREFIXES))
        for path in sorted(GATES.glob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}
    assert len(offenders) >= 8  # the check looked at the gate modules

"""Layering rules from the design: afd_split stays framework-neutral."""

import subprocess
import sys

FORBIDDEN_AT_IMPORT = ("pytest", "vllm", "vllm_ascend", "torch_npu", "pytest_afd")


def test_afd_split_imports_no_pytest_or_vllm():
    code = (
        "import sys, afd_split\n"
        f"bad = [m for m in {FORBIDDEN_AT_IMPORT!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"afd_split imported {out.stdout.strip()} at import time"


def test_markers_registered(pytestconfig):
    registered = "\n".join(pytestconfig.getini("markers"))
    for name in ("gate", "stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f"):
        assert f"{name}:" in registered

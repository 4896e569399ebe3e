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


def test_no_test_directory_shadows_an_optional_package():
    """Test dirs land on sys.path (rootdir import mode): one named like an optional
    package would make find_spec() report it installed, and hardware probes lie."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    optional = {"vllm", "vllm_ascend", "torch_npu", "transformers"}
    shadows = [
        str(path.relative_to(root))
        for top in ("tests", "suites")
        for path in (root / top).rglob("*")
        if path.is_dir() and path.name in optional
    ]
    assert shadows == []

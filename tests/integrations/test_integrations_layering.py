"""afd_split.hook imports no engine, no pytest and no harness at import time (its import-linter
contracts: tests/test_hook_layering.py, beside the other contracts, outside the optional
real-vLLM run, which has no import-linter)."""

import subprocess
import sys

FORBIDDEN = ("pytest", "pytest_afd", "vllm", "vllm_ascend", "afd_plugin", "torch_npu")


def test_the_hook_imports_no_engine_or_harness():
    code = (
        "import sys\n"
        "import afd_split.hook.planning.engine_step, afd_split.hook.planning.worker_evidence\n"
        "import afd_split.hook.install, afd_split.hook.glue.session\n"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported {out.stdout.strip()} at import time"

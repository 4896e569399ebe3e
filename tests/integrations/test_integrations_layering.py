"""afd_split.integrations imports no engine, no pytest and no harness at import time."""

import subprocess
import sys

FORBIDDEN = ("pytest", "pytest_afd", "vllm", "vllm_ascend", "afd_plugin", "torch_npu")


def test_integrations_import_no_engine_or_harness():
    code = (
        "import sys\n"
        "import afd_split.integrations.engine_step, afd_split.integrations.worker_evidence\n"
        "import afd_split.integrations.afd_plugin, afd_split.integrations.afd_plugin.patches\n"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported {out.stdout.strip()} at import time"

"""Per-case peak memory of an in-process CPU run.

The process's high-water mark (VmHWM) covers everything resident in the
pytest process: every model and KV cache the session built, so it was the
same for a 10- and a 61-layer case. A case's own peak is what it holds
(its model's weights and its KV cache) plus the transient growth of the
run above the resident set it started from (VmHWM reset at the start of the
run, minus VmRSS then).
"""

from __future__ import annotations

from pathlib import Path

import torch

PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")
# Writing this to clear_refs resets the process's peak RSS (VmHWM), Linux >= 4.0.
RESET_PEAK_RSS = "5"
BYTES_PER_KIB = 1024
PEAK_METHOD = (
    "case's model weights + KV cache + (VmHWM since the run's reset - VmRSS at its start)"
)
AFD_PROCESSES_REASON = (
    "afd_processes: the model runs on the Attention/FFN rank processes, not measured here"
)
NO_PROC_REASON = "/proc/self/clear_refs or /proc/self/status unavailable: no per-run peak"


def _status_kib(field: str) -> int | None:
    try:
        status = PROC_STATUS.read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None


def current_rss_bytes() -> int | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * BYTES_PER_KIB


def tensors_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def case_peak_bytes(hwm_bytes: int | None, rss_at_start: int | None, resident_bytes: int
                    ) -> int | None:
    """The case's own peak (see the module docstring); None when /proc gave no reading."""
    if hwm_bytes is None or rss_at_start is None:
        return None
    return resident_bytes + max(0, hwm_bytes - rss_at_start)


def reset_peak_rss() -> bool:
    """Start a per-run peak-memory window; False where the kernel offers none."""
    try:
        PROC_CLEAR_REFS.write_text(RESET_PEAK_RSS)
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since the last reset (VmHWM)."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * BYTES_PER_KIB

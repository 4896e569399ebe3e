"""CPU AFD runtime: Attention and FFN ranks as separate processes (gloo on loopback).

See docs/afd-runtime.md. Import ``AfdRuntime`` from here; the submodules are the
process group (``procs``: the parent, ``rank_process``: a rank, ``protocol``: both),
one step's checked commands and results (``forward_step``), the a2e/e2a connector,
the rank roles and evidence.
"""

from pytest_afd.backends.cpu.afd.adapter import AfdExecutor, RankKVCache
from pytest_afd.backends.cpu.afd.forward_step import AfdForwardResult
from pytest_afd.backends.cpu.afd.protocol import AfdRankFailure, AfdRuntimeError
from pytest_afd.backends.cpu.afd.runtime import AfdRuntime

__all__ = [
    "AfdExecutor",
    "AfdForwardResult",
    "AfdRankFailure",
    "AfdRuntime",
    "AfdRuntimeError",
    "RankKVCache",
]

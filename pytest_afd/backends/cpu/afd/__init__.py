"""CPU AFD runtime: Attention and FFN ranks as separate processes (gloo on loopback).

See docs/afd-runtime.md. Import ``AfdRuntime`` from here; the submodules are the
process group (``procs``: the parent, ``rank_process``: a rank, ``protocol``: both),
the a2e/e2a connector, the rank roles and evidence.
"""

from pytest_afd.backends.cpu.afd.adapter import AfdExecutor, RankKVCache
from pytest_afd.backends.cpu.afd.protocol import AfdRankFailure, AfdRuntimeError
from pytest_afd.backends.cpu.afd.runtime import AfdForwardResult, AfdRuntime

__all__ = [
    "AfdExecutor",
    "AfdForwardResult",
    "AfdRankFailure",
    "AfdRuntime",
    "AfdRuntimeError",
    "RankKVCache",
]

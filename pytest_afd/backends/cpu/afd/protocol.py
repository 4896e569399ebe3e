"""What the AFD runtime's parent and its rank processes agree on: message kinds, roles,
the rank spec, and the errors that name a rank.

Both sides import it (:mod:`.procs`, the parent's watchdog, and :mod:`.rank_process`,
the child's entry point), so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ADDRESS_IN_USE = "address already in use"

MSG_READY = "ready"
MSG_PORT = "port"
"""Rank 0's first message: the port its rendezvous store really bound."""
EPHEMERAL_PORT = 0
"""Ask the kernel for a free port at bind time (no probe-then-bind race)."""
MSG_OK = "ok"
MSG_ERROR = "error"
MSG_SHUTDOWN = "shutdown"

ROLE_ATTENTION = "attention"
ROLE_FFN = "ffn"


class AfdRuntimeError(RuntimeError):
    """The AFD runtime failed; the message names the rank(s) responsible."""


class AfdRankFailure(AfdRuntimeError):
    """A rank died, raised, or stopped answering within its bound."""

    def __init__(self, message: str, *, rank_names: Sequence[str]) -> None:
        super().__init__(message)
        self.rank_names = tuple(rank_names)


class PeerWaitError(RuntimeError):
    """Raised in a rank whose bounded wait on ``peers`` failed: they are blamed, not it.

    Why: a frozen FFN rank reports nothing; the Attention rank waiting on it is
    the one that times out, and blaming the reporter would name the healthy rank.
    """

    def __init__(self, message: str, *, peers: Sequence[str]) -> None:
        super().__init__(message)
        self.peers = tuple(peers)


@dataclass(frozen=True)
class RankSpec:
    """One process of the topology: its role, index within the role, and gloo rank."""

    role: str
    role_index: int
    global_rank: int

    @property
    def name(self) -> str:
        label = "Attention" if self.role == ROLE_ATTENTION else "FFN"
        return f"{label} rank {self.role_index}"

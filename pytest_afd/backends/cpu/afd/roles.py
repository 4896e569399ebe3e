"""The role factory each AFD child process runs: an Attention or an FFN rank.

The roles live in :mod:`.attention` and :mod:`.ffn`, what they share in :mod:`.rank`.
"""

from __future__ import annotations

import contextlib

from pytest_afd.backends.cpu.afd.attention import AttentionRole
from pytest_afd.backends.cpu.afd.ffn import FfnRole
from pytest_afd.backends.cpu.afd.protocol import ROLE_ATTENTION, RankSpec


def make_role(spec: RankSpec, **kwargs) -> AttentionRole | FfnRole:
    """Role factory run inside the child (picklable by reference).

    The seeded fault named by ``$PYTEST_AFD_FAULT`` (inherited from the parent)
    is applied for the rank's lifetime, so the gates' AFD-process cases run the
    faulty split path too (``pytest_afd.faults.registry``).
    """
    from pytest_afd.faults.registry import applied_from_env

    role_class = AttentionRole if spec.role == ROLE_ATTENTION else FfnRole
    role = role_class(spec, **kwargs)
    role.seeded_fault = contextlib.ExitStack()
    role.seeded_fault.enter_context(applied_from_env())
    return role

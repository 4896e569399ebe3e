"""Cut selectors: one small pure function per splitting policy.

A selector receives the per-request token counts, their inclusive prefix sums
(``cu_tokens[-1] == T``), the constraints and the optional computed-token counts,
and returns the cut ``s`` (0 < s < T): ubatch 0 gets tokens [0, s), ubatch 1 gets
[s, T). It raises ``SplitRejectedError`` naming the reason when no cut is
eligible. Everything else (request slices, padding, PCP rows) is derived from
the cut by ``afd_split.plan.planner``, so a new policy only adds a selector here and one
entry in ``CUT_SELECTORS`` (and its ``SplitPolicy`` member).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np

from afd_split.plan.constraints import SplitConstraints, SplitPolicy
from afd_split.plan.cost import select_cost_balanced_cut
from afd_split.plan.policies.request_boundary import select_request_boundary_cut
from afd_split.plan.policies.token_balanced import select_token_balanced_cut

CutSelector = Callable[[np.ndarray, np.ndarray, SplitConstraints, "np.ndarray | None"], int]

CUT_SELECTORS: Mapping[SplitPolicy, CutSelector] = MappingProxyType(
    {
        SplitPolicy.REQUEST_BOUNDARY: select_request_boundary_cut,
        SplitPolicy.TOKEN_BALANCED: select_token_balanced_cut,
        SplitPolicy.COST_BALANCED: select_cost_balanced_cut,
    }
)
"""Splitting policies; a policy absent here (``none``) runs the batch unsplit."""

__all__ = [
    "CUT_SELECTORS",
    "CutSelector",
    "select_request_boundary_cut",
    "select_token_balanced_cut",
]

"""Split plans: where the cut falls, which requests each ubatch holds, and its padding rows.

A plan is pure data derived from the per-request scheduled token counts; it
never touches metadata arrays, so every rank can compute (and cross-check) it
cheaply before any per-ubatch work starts. Small batches are planned in plain
Python (``afd_split.plan.scalar``), larger ones with numpy
(``afd_split.plan.vector``); both build identical plans.
"""

from __future__ import annotations

from types import MappingProxyType

from afd_split.plan.constraints import SplitConstraints, SplitPolicy
from afd_split.plan.scalar import (
    SCALAR_POLICIES,
    plan_scalar,
    scalar_counts,
)
from afd_split.plan.types import INT64, SplitPlan, UBatch, _built
from afd_split.plan.vector import as_token_counts, plan_vectorised

DEFAULT_CONSTRAINTS = SplitConstraints()

POLICY_BY_VALUE = MappingProxyType({policy.value: policy for policy in SplitPolicy})
"""Policy lookup by string without the cost of an Enum call on the per-step path."""

(_COST_BALANCED,) = set(SplitPolicy) - SCALAR_POLICIES  # the one policy without a scalar cut

__all__ = [
    "DEFAULT_CONSTRAINTS",
    "INT64",
    "POLICY_BY_VALUE",
    "SplitPlan",
    "UBatch",
    "_built",
    "as_token_counts",
    "plan_split",
]


def plan_split(
    num_scheduled_tokens,
    *,
    policy: SplitPolicy | str,
    constraints: SplitConstraints = DEFAULT_CONSTRAINTS,
    allow_fallback: bool = False,
    num_computed_tokens=None,
) -> SplitPlan:
    """Plan how one prefill batch runs: unsplit (``none``) or as two ubatches.

    Raises ``SplitRejectedError`` when the policy cannot split this batch; with
    ``allow_fallback=True`` the batch runs unsplit instead and the plan records
    ``fallback_reason`` (or, when the unsplit batch does not fit padded_total
    either, ``SplitRejectedError`` gives both reasons). Invalid inputs raise
    ``ValueError`` naming the value; totals past int64 are refused.
    """
    if type(policy) is not SplitPolicy:  # Enum hashing runs Python code: look strings up
        # A proxy's subscript is a C slot; its .get is a method call, several times dearer.
        policy = POLICY_BY_VALUE[policy] if policy in POLICY_BY_VALUE else SplitPolicy(policy)
    if policy is not _COST_BALANCED:
        counts = scalar_counts(num_scheduled_tokens, 1)  # None past SCALAR_PATH_MAX_REQUESTS
        if counts is not None:
            computed = None
            if num_computed_tokens is not None:
                computed = scalar_counts(num_computed_tokens, 0)
            # computed counts only need validating here: no scalar policy reads them.
            if num_computed_tokens is None or (
                computed is not None and len(computed) == len(counts)
            ):
                return plan_scalar(policy, counts, constraints, allow_fallback)
    return plan_vectorised(
        policy, num_scheduled_tokens, constraints, allow_fallback, num_computed_tokens
    )

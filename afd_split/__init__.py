"""Token-balanced two-ubatch split path for AFD prefill (framework-neutral).

The public API answers three questions: where the split is decided (``plan_split`` ->
``SplitPlan``), where engine metadata is sliced (``split_common_metadata`` for vLLM,
``split_ascend_common_metadata`` for vLLM-Ascend) and where a split is validated
(``check_split``), plus the errors. Everything else is internal, reached by its layer
(``afd_split.plan``, ``checks``, ``pcp``, ``engine``; docs/split-path.md).

Imports numpy only at import time; torch is imported by the functions that exchange or
return tensors, and vLLM / vLLM-Ascend never (the engine objects come from the caller).
"""

from afd_split.engine.ascend import split_ascend_common_metadata
from afd_split.engine.slicing import check_split
from afd_split.engine.vllm import split_common_metadata
from afd_split.errors import (
    SplitInvariantError,
    SplitMismatchError,
    SplitRejectedError,
    UnsupportedSplitError,
)
from afd_split.plan.constraints import SplitConstraints, SplitPolicy
from afd_split.plan.planner import SplitPlan, plan_split

__all__ = [
    "SplitConstraints",
    "SplitInvariantError",
    "SplitMismatchError",
    "SplitPlan",
    "SplitPolicy",
    "SplitRejectedError",
    "UnsupportedSplitError",
    "check_split",
    "plan_split",
    "split_ascend_common_metadata",
    "split_common_metadata",
]

"""Token-balanced two-ubatch split path for AFD prefill (framework-neutral).

Imports numpy only at import time; torch is imported by the functions that
exchange or return tensors, and vLLM only by ``afd_split.engine``.
"""

from afd_split.checks.metadata import BatchMetadata, split_metadata, validate_split
from afd_split.checks.requests import RequestFields, split_request_fields, validate_split_requests
from afd_split.checks.support import (
    SplitSupportConfig,
    prepare_split_runtime,
    unsupported_reasons,
    validate_split_support,
)
from afd_split.engine.rows import gather_ubatch_rows, merge_outputs
from afd_split.engine.state import AllBindings, BufferContents, preserved_state
from afd_split.errors import (
    SplitInvariantError,
    SplitMismatchError,
    SplitRejectedError,
    UnsupportedSplitError,
)
from afd_split.plan.agree import agree_on_split
from afd_split.plan.constraints import SplitConstraints, SplitPolicy
from afd_split.plan.planner import SplitPlan, UBatch, plan_split

__all__ = [
    "AllBindings",
    "BatchMetadata",
    "BufferContents",
    "RequestFields",
    "SplitConstraints",
    "SplitInvariantError",
    "SplitMismatchError",
    "SplitPlan",
    "SplitPolicy",
    "SplitRejectedError",
    "SplitSupportConfig",
    "UBatch",
    "UnsupportedSplitError",
    "agree_on_split",
    "gather_ubatch_rows",
    "merge_outputs",
    "plan_split",
    "prepare_split_runtime",
    "preserved_state",
    "split_metadata",
    "split_request_fields",
    "unsupported_reasons",
    "validate_split",
    "validate_split_requests",
    "validate_split_support",
]

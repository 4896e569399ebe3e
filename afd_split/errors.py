"""Exception types of the split path.

Distinct types let callers tell "this batch cannot be split" (fall back to an
unsplit forward) from "this deployment must not split at all" (fail closed at
start-up) and from "the split metadata is wrong" (a bug).
"""


class SplitRejectedError(ValueError):
    """A split of this batch is impossible (empty / padding-only tail, align > T, ...)."""


class UnsupportedSplitError(RuntimeError):
    """Fail-closed: the deployment (builder, graph mode, speculation, topology) is unsupported."""


class SplitInvariantError(AssertionError):
    """A metadata object or a split violates an invariant of the split contract."""


class SplitMismatchError(RuntimeError):
    """Ranks of one group derived different split plans from what must be the same batch."""

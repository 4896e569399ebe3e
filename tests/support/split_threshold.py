"""The hook's split threshold set explicitly where a test needs tiny batches split.

The deployed hook leaves steps below ``AFD_SPLIT_MIN_TOKENS`` (default
``afd_split.hook.planning.threshold.DEFAULT_SPLIT_MIN_TOKENS``) unsplit; tests of the
split path plan batches of a few dozen tokens, so they set the threshold to 0, as
the gates do, and a green test still means the split path ran.
"""

from afd_split.hook.planning.threshold import NO_THRESHOLD, SPLIT_MIN_TOKENS_ENV

SPLIT_EVERY_STEP = {SPLIT_MIN_TOKENS_ENV: str(NO_THRESHOLD)}
"""Environment entries of a hook session that splits every step the plan can split."""

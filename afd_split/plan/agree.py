"""Rank agreement on a split plan.

Collective order (per step, on ``group``): exactly ONE ``all_gather`` of the
local plan's 32-byte fingerprint (as four int64 words), issued after
``plan_split`` and before ``split_metadata`` or any per-ubatch communication.
Every rank receives every fingerprint, so a disagreement raises
``SplitMismatchError`` on all ranks at the same point instead of leaving some
ranks waiting in a later, mismatched collective.
"""

from __future__ import annotations

import datetime

import numpy as np

from afd_split.errors import SplitMismatchError
from afd_split.plan.planner import SplitPlan

FINGERPRINT_WORDS = 4
"""A SHA-256 digest as int64 words (gloo and HCCL both all-gather int64)."""


def fingerprint_words(plan: SplitPlan) -> np.ndarray:
    """The plan's fingerprint as ``FINGERPRINT_WORDS`` int64 values."""
    return np.frombuffer(bytes.fromhex(plan.fingerprint()), dtype="<i8").copy()


def agree_on_split(
    plan: SplitPlan, group=None, *, device="cpu", timeout_s: float | None = None
) -> None:
    """Check that every rank of ``group`` holds the same plan; raise on mismatch.

    ``device`` is where the exchanged tensor lives (CPU for gloo, the
    accelerator for HCCL/NCCL groups). ``timeout_s`` bounds the all-gather
    (the backend's RuntimeError when it expires) instead of the group's own
    timeout, so a frozen peer fails the step as soon as any other peer wait would.
    """
    import torch  # lazy: torch.distributed only when agreement is requested
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("agree_on_split needs an initialised torch.distributed process group")
    local = torch.from_numpy(fingerprint_words(plan)).to(device)
    world_size = dist.get_world_size(group)
    gathered = [torch.empty_like(local) for _ in range(world_size)]
    work = dist.all_gather(gathered, local, group=group, async_op=timeout_s is not None)
    if timeout_s is not None:
        work.wait(datetime.timedelta(seconds=timeout_s))
    digests = [bytes(np.asarray(t.cpu().numpy(), dtype="<i8").tobytes()).hex() for t in gathered]
    if len(set(digests)) == 1:
        return
    ranks_by_digest: dict[str, list[int]] = {}
    for rank, digest in enumerate(digests):
        ranks_by_digest.setdefault(digest, []).append(rank)
    groups = "; ".join(f"{digest[:12]}: ranks {ranks}" for digest, ranks in ranks_by_digest.items())
    raise SplitMismatchError(
        f"ranks disagree on the split plan ({len(ranks_by_digest)} distinct fingerprints: "
        f"{groups}); this rank's plan: policy={plan.policy.value}, "
        f"split_token={plan.split_token}, tokens={plan.num_tokens}"
    )

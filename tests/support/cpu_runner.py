"""The CPU-backend tests' prompt runner and prompts, in a module of its own: test files
import it by a name no other conftest has (``from conftest import`` resolves to whichever
conftest was imported first in a combined run)."""

from __future__ import annotations

import numpy as np

from afd_split import SplitConstraints, plan_split
from afd_split.checks.metadata import BatchMetadata
from pytest_afd.backends.cpu import BlockPool, Executor, PagedKVCache

SMALL_BLOCK = 16
PCP_LENGTHS = [150, 37, 260]
"""The PCP tests' batch: token_balanced cuts inside a request, off the PCP unit for pcp=2."""


def make_prompts(lengths, seed=0, vocab=2048):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


class Runner:
    """Runs prompts through the executor with explicit chunks, prefixes and split plans."""

    def __init__(self, model, block_size=SMALL_BLOCK):
        self.model = model
        self.cache = PagedKVCache(model.config, block_size)
        self.pool = BlockPool(self.cache)
        self.executor = Executor(model, self.cache)
        self.block_size = block_size

    def allocate(self, prompts, cached=None):
        cached = cached or [0] * len(prompts)
        return [self.pool.allocate(p, c) for p, c in zip(prompts, cached, strict=True)]

    def forward(self, prompts, blocks, pieces, policy=None, constraints=None, **kwargs):
        """pieces: [(request, start, length)] scheduled in this forward."""
        rows = [blocks[r].block_ids for r, _, _ in pieces]
        table = np.full((len(rows), max(map(len, rows))), -1)
        for i, row in enumerate(rows):
            table[i, : len(row)] = row
        sched = [n for _, _, n in pieces]
        computed = [s for _, s, _ in pieces]
        md = BatchMetadata.from_requests(sched, computed, table, self.block_size)
        ids = np.concatenate([prompts[r][s : s + n] for r, s, n in pieces])
        plan = None
        if policy is not None:
            plan = plan_split(sched, policy=policy, constraints=constraints or SplitConstraints(),
                              num_computed_tokens=computed)
        return self.executor.execute(ids, md, plan, **kwargs), plan

    def whole(self, prompts, policy=None, constraints=None, **kwargs):
        blocks = self.allocate(prompts)
        pieces = [(i, 0, len(p)) for i, p in enumerate(prompts)]
        return self.forward(prompts, blocks, pieces, policy, constraints, **kwargs)

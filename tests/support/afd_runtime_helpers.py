"""Helpers shared by the AFD runtime tests (batch builders, reference runs, child scan)."""

import os
from pathlib import Path

import numpy as np
import torch

from afd_split import plan_split
from afd_split.checks.metadata import BatchMetadata
from pytest_afd.backends.cpu import Executor, PagedKVCache

SEED = 7
BLOCK_SIZE = 16
THREADS_PER_RANK = 1


def child_pids() -> set[int]:
    """Live (non-zombie) children of this test process, read from /proc.

    multiprocessing's resource tracker (one per parent, started by the first
    spawn, shared by every later one) is not a rank and is left out.
    """
    me = os.getpid()
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            cmdline = (stat.parent / "cmdline").read_bytes()
            if b"resource_tracker" not in cmdline:
                found.add(int(stat.parent.name))
    return found


def make_batch(config, lengths, computed=None, seed=0):
    """Token ids and metadata of one batch; each request owns consecutive blocks."""
    lengths = np.asarray(lengths)
    computed = np.zeros_like(lengths) if computed is None else np.asarray(computed)
    total = lengths + computed
    blocks = -(-total // BLOCK_SIZE)
    width = int(blocks.max())
    table = np.full((len(lengths), width), -1, dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(blocks)[:-1]))
    for request, (start, count) in enumerate(zip(first, blocks, strict=True)):
        table[request, :count] = np.arange(start, start + count)
    metadata = BatchMetadata.from_requests(lengths, computed, table, BLOCK_SIZE)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, int(lengths.sum()))
    return ids, metadata


def reference_forward(model, batches, plans):
    """Run consecutive forwards in-process on one KV cache with the runtime's thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(THREADS_PER_RANK)
    try:
        cache = PagedKVCache(model.config, BLOCK_SIZE)
        executor = Executor(model, cache)
        outputs = []
        for (ids, metadata), plan in zip(batches, plans, strict=True):
            cache.ensure_blocks(int(metadata.block_table.max()) + 1)
            outputs.append(executor.execute(ids, metadata, plan))
        return outputs
    finally:
        torch.set_num_threads(previous)


def plan_for(metadata, policy, **kwargs):
    return plan_split(
        np.diff(metadata.query_start_loc), policy=policy,
        num_computed_tokens=metadata.num_computed_tokens, **kwargs,
    )

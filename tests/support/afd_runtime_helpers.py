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


SHARED_HELPERS = (b"resource_tracker", b"forkserver")
"""Command-line marks of multiprocessing's per-process helpers (not ranks)."""


def child_pids() -> set[int]:
    """Live (non-zombie) processes this test process started, read from /proc.

    The ranks are children of multiprocessing's fork server, itself a child of this
    process: they are found through it. The fork server and the resource tracker
    (one each per parent, started by the first rank and shared by every later one)
    are not ranks and are left out.
    """
    me = os.getpid()
    live: dict[int, list[int]] = {}
    shared: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        live.setdefault(ppid, []).append(pid)
        # A rank forked from the fork server shows the server's command line too.
        if ppid == me and any(mark in cmdline for mark in SHARED_HELPERS):
            shared.add(pid)
    found: set[int] = set()
    parents = [me]
    while parents:
        for pid in live.get(parents.pop(), ()):
            parents.append(pid)
            if pid not in shared:
                found.add(pid)
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

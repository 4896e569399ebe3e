"""PCP ranks as threads of one process, with a real all-to-all between them (tests only).

Each rank passes only its own rows and split sizes; ``all_to_all`` returns, in
rank order, every rank's block for the caller, as
``torch.distributed.all_to_all_single(out, rows, output_split_sizes=recv,
input_split_sizes=send)`` does. A rank that sends the wrong rows, or expects the
wrong counts, gets wrong rows back or fails.
"""

from __future__ import annotations

import threading

import torch

JOIN_TIMEOUT_S = 60


class ThreadGroup:
    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots = [None] * size

    def all_to_all_for(self, rank: int):
        def all_to_all(rows, send_counts, recv_counts):
            if len(send_counts) != self.size or int(sum(send_counts)) != len(rows):
                raise ValueError(f"rank {rank}: send counts {send_counts} for {len(rows)} rows")
            self.slots[rank] = (rows, list(send_counts))
            self.barrier.wait()
            blocks = []
            for sent, counts in self.slots:
                start = sum(counts[:rank])
                blocks.append(sent[start:start + counts[rank]])
            self.barrier.wait()
            received = torch.cat(blocks)
            if [len(block) for block in blocks] != list(recv_counts):
                raise ValueError(f"rank {rank}: expected {list(recv_counts)} rows, got "
                                 f"{[len(block) for block in blocks]}")
            return received

        return all_to_all

    def run(self, rank_main) -> list:
        """``rank_main(rank)`` on every rank at once; their results, or the first error."""
        results, errors = [None] * self.size, []

        def target(rank):
            try:
                results[rank] = rank_main(rank)
            except BaseException as error:  # surfaced to the test below
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=JOIN_TIMEOUT_S)
        if errors:
            raise errors[0]
        return results

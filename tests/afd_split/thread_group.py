"""PCP ranks as threads of one process, with a real all-gather between them (tests only).

Each rank passes only its own rows; ``all_gather`` returns every rank's rows
concatenated in rank order along dim 0, as ``GroupCoordinator.all_gather(rows, 0)``
does, so a rank that sends the wrong rows gets wrong rows back.
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

    def all_gather_for(self, rank: int):
        def all_gather(rows):
            self.slots[rank] = rows
            self.barrier.wait()
            gathered = torch.cat(self.slots)
            self.barrier.wait()
            return gathered

        return all_gather

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

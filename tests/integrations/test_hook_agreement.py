"""The hook's debug-mode fingerprint check over a real gloo group (2 ranks, one spawn)."""

import datetime
import multiprocessing
import queue

import numpy as np
import pytest

from tests.support.split_threshold import SPLIT_EVERY_STEP

WORLD_SIZE = 2
TIMEOUT_S = 120
TOKENS = [300, 17, 90]
COMPUTED = [64, 0, 8]


def _outcome(call):
    from afd_split import SplitMismatchError

    try:
        call()
    except SplitMismatchError as error:
        return f"mismatch: {error}"
    return "agreed"


def _worker(rank, store_path, results):
    import torch.distributed as dist

    from afd_split.hook.planning.engine_step import AGREE_DEBUG_ENV, StepRanks
    from afd_split.hook.planning.stages import HookSession, plan_stages

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=60))

    def session(debug: str) -> HookSession:
        return HookSession.from_environment(
            {AGREE_DEBUG_ENV: debug, **SPLIT_EVERY_STEP}, ranks=StepRanks(global_rank=rank, tp_rank=rank),
            groups=[dist.group.WORLD], splitter=None)

    def plan(hook: HookSession, tokens):
        return plan_stages(hook, np.asarray(tokens), num_computed_tokens=np.asarray(COMPUTED),
                           block_size=16,
                           slice_type=lambda request_slice, token_slice: (request_slice,
                                                                          token_slice))

    # Rank 1 saw a stale prefix-cache hit: one request scheduled one token fewer.
    drifted = [300, 16, 90] if rank == 1 else TOKENS
    checked, unchecked = session("1"), session("0")
    outcomes = {
        "same": _outcome(lambda: plan(checked, TOKENS)),
        "drifted": _outcome(lambda: plan(checked, drifted)),
        "drifted_without_debug": _outcome(lambda: plan(unchecked, drifted)),
    }
    dist.barrier()
    dist.destroy_process_group()
    results.put((rank, outcomes))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "afd_split"])
    results = context.Queue()
    store = tmp_path_factory.mktemp("gloo") / "store"
    workers = [context.Process(target=_worker, args=(rank, str(store), results))
               for rank in range(WORLD_SIZE)]
    for worker in workers:
        worker.start()
    collected = {}
    try:
        for _ in range(WORLD_SIZE):
            rank, result = results.get(timeout=TIMEOUT_S)
            collected[rank] = result
    except queue.Empty:
        pytest.fail(f"ranks {sorted(set(range(WORLD_SIZE)) - set(collected))} hung or crashed")
    finally:
        for worker in workers:
            worker.join(timeout=TIMEOUT_S)
            if worker.is_alive():
                worker.kill()
    return collected


def test_ranks_with_the_same_batch_agree(outcomes):
    assert all(outcomes[rank]["same"] == "agreed" for rank in range(WORLD_SIZE))


def test_a_drifted_rank_is_caught_on_every_rank_in_debug_mode(outcomes):
    for rank in range(WORLD_SIZE):
        assert outcomes[rank]["drifted"].startswith("mismatch: ranks disagree on the split plan")


def test_without_debug_mode_no_collective_runs(outcomes):
    # No all-gather: each rank keeps its own plan (what the debug mode exists to catch).
    assert all(outcomes[rank]["drifted_without_debug"] == "agreed" for rank in range(WORLD_SIZE))

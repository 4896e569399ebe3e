"""engine_path_bench's builder-state guard: what the hook's ``preserved_state`` costs per step.

The hook builds the stages inside ``preserved_state`` over the runner state, every
metadata builder's bindings and the contents of every buffer a stage build writes
through (``builder_state``) up to the step's ``stage_write_bound`` (issue 43: before,
the whole buffers), and gives each stage's metadata its own copy of any field viewing
one of them (``own_stage_views``). Upstream sizes the buffers from the deployment, not
from the batch, so they are built here at the recipe's sizes (afd-plugin ``recipe/npu/CAMAsyncAFDConnector/
deepseek_v3_2/README.md`` at release/v0.19.1rc1 2f4f462, ``pytest_afd.backends.
vllm_ascend.recipe``): the Attention role's ``--max-num-batched-tokens 140000`` and
``--max-num-seqs 32`` at PCP 8 (``dp3pcp8-ep8``), DeepSeek V3.2's SFA-CP builders
(two per attention group, ``_ensure_two_metadata_builders``) and the PCP manager's
padded-slot buffer, through the same stand-ins the CPU PCP emulation uses
(``pytest_afd.backends.cpu.pcp_builders.RankPcpState``). On CPU every snapshot
and restore is a host memory copy; on the NPU they are device copies the host
only launches, so this is an upper bound of the host's share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from afd_split.engine.standin_builders import StandInCpMetadata
from afd_split.engine.state import preserved_state
from afd_split.hook.glue.builder_state import (
    builder_state_targets,
    metadata_builders,
    own_stage_views,
    stage_write_bound,
    stage_written_buffers,
)
from pytest_afd.backends.cpu.pcp_builders import SFA_CP, RankPcpState
from pytest_afd.backends.vllm_ascend.recipe import ATTENTION_FLAGS

RECIPE_MAX_NUM_BATCHED_TOKENS = int(ATTENTION_FLAGS["--max-num-batched-tokens"])
RECIPE_MAX_NUM_SEQS = int(ATTENTION_FLAGS["--max-num-seqs"])
RECIPE_PCP = 8
"""``dp3pcp8-ep8``: the recipe's Attention PCP size."""
RUNNER_STATE_NAMES = ("long_seq_metadata", "input_batch")
"""The runner attributes the hook's guard keeps (``patches.RUNNER_STATE_KEPT_ACROSS_STAGE_BUILD``)."""


@dataclass
class _Runner:
    """The runner attributes the guard reads: the attention groups and the PCP manager."""

    attn_groups: list
    pcp_manager: object
    long_seq_metadata: object = None
    input_batch: object = None


def recipe_runner() -> _Runner:
    state = RankPcpState.make(SFA_CP, RECIPE_PCP, RECIPE_MAX_NUM_BATCHED_TOKENS,
                              RECIPE_MAX_NUM_SEQS)
    return _Runner(attn_groups=[[state.group]], pcp_manager=state.pcp_manager)


def step_bound(num_scheduled_tokens) -> int:
    """The hook's ``stage_write_bound`` for a step of these requests on the recipe's PCP
    (per-rank rows: the tokens over the PCP ranks, rounded up)."""
    total = int(sum(int(n) for n in num_scheduled_tokens))
    return stage_write_bound(num_scheduled_tokens, -(-total // RECIPE_PCP), None, RECIPE_PCP)


def guarded_bytes(buffers, bound: int | None) -> int:
    """Bytes the guard snapshots (and restores) per step with ``bound`` (None: whole)."""
    return sum(min(b.shape[0], bound if bound is not None else b.shape[0])
               * (b.numel() // max(1, b.shape[0])) * b.element_size() for b in buffers)


def guard_callable(runner: _Runner | None = None) -> tuple[Callable[[int | None], int], dict]:
    """(one step of the hook's guard, its sizes). ``step(bound)`` snapshots and restores
    what the hook does for a step whose ``stage_write_bound`` is ``bound`` (None: the whole
    buffers, as before issue 43), and owns two stage metadata objects viewing the
    builders' slot buffers (as SFA-CP stage builds return them); it returns how many
    stage fields it copied."""
    runner = runner or recipe_runner()
    builders = metadata_builders(runner)

    def step(bound: int | None = None) -> int:
        padded = min(bound or RECIPE_MAX_NUM_BATCHED_TOKENS, RECIPE_MAX_NUM_BATCHED_TOKENS)
        buffers = stage_written_buffers(builders, runner.pcp_manager)
        with preserved_state((runner, RUNNER_STATE_NAMES),
                             *builder_state_targets(builders, buffers, bound)):
            stages = [StandInCpMetadata(slot_mapping=builder.slot_mapping_buf[:padded],
                                        positions=None, prefill_context_parallel_metadata=None,
                                        num_actual_tokens=padded) for builder in builders]
            return own_stage_views(stages, buffers)

    buffers = stage_written_buffers(builders, runner.pcp_manager)
    sizes = {"pcp": RECIPE_PCP, "max_num_batched_tokens": RECIPE_MAX_NUM_BATCHED_TOKENS,
             "max_num_seqs": RECIPE_MAX_NUM_SEQS, "builders": len(builders),
             "guarded_buffers": len(buffers),
             "guarded_bytes": guarded_bytes(buffers, None),
             "buffer_rows": [(b.shape[0], (b.numel() // max(1, b.shape[0])) * b.element_size())
                             for b in buffers],
             "stage_fields_owned_per_step": step()}
    return step, sizes

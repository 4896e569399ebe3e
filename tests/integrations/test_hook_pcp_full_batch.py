"""The hook's PCP stage build leaves the full batch exactly as upstream built it.

The release stand-in runner builds the full batch with builder 0 of a two-builder
attention group (vllm-ascend v0.19.1rc1 da421af ``_build_attention_metadata``) on
the PCP manager's persistent padded-slot buffer, and the stages with
``get_metadata_builder(ubid or 0)`` (afd-plugin release/v0.19.1rc1 2f4f462), through
the stand-in SFA-CP / MLA-CP builders (``afd_split.engine.standin_builders``),
which keep persistent buffers and return views as the pinned builders do. The
issue's cases (a head piece not a multiple of 2 * pcp): on every rank at PCP 2 and
8, the full batch's slot mapping, positions and PCP metadata are bit-identical
before and after the stage builds, each stage keeps its own slots, and each seeded
fault moves the full batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from afd_split.hook.glue.builder_state import (
    metadata_builders,
    stage_written_buffers,
)
from afd_split.hook.install import install_deferred
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.stage import stage_tokens, zigzag_layout
from pytest_afd.backends.cpu.pcp_builders import changed_fields, full_batch_fields
from pytest_afd.faults.registry import get_fault
from tests.support.hook_pcp_runner import (
    RELEASE,
    configure_builders,
    global_slots,
    pcp_runner,
    session_factory,
)

FULL_BATCH_CASES = [
    # (scheduled, computed, pcps): the examples (lost slots per rank before the fix:
    # 8 at PCP 8; 8 at PCP 8; 3 at PCP 2 and 8; 1), each cut inside a request
    ([1000, 1000], [0, 256], (8,)),
    ([700, 300, 1500, 400, 96], [128, 2048, 512, 0, 1664], (8,)),
    ([1, 1, 1, 1800, 1, 1, 400], [50, 70, 90, 0, 30, 20, 0], (2, 8)),
    ([151, 106, 255], [93, 21, 91], (2, 8)),  # a one-token tail (head piece 254)
]
CASE_IDS = ["1000x2", "five", "decodes", "one_token_tail"]
KINDS = ("sfa_cp", "mla_cp")
BUILDER_FAULTS = {"sfa_cp": "stage_build_shares_builder_slot_buffer",
                  "mla_cp": "pcp_padded_slot_buffer_reused"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("scheduled", "computed", "pcps"), FULL_BATCH_CASES, ids=CASE_IDS)
def test_stage_builds_leave_the_full_batch_bit_identical(standin_plugin, kind, scheduled,
                                                         computed, pcps):
    for pcp in pcps:
        for rank in range(pcp):
            captured = {}
            runner, full, before, stages = _built(standin_plugin, kind, scheduled, computed, pcp,
                                                  rank, captured=captured)
            assert changed_fields(before, full) == [], (pcp, rank)
            # The guard restores only stage_write_bound's prefix: whole buffers equal before
            # and after show the stage builds wrote nothing past it (issue 43).
            now = stage_written_buffers(metadata_builders(runner), runner.pcp_manager)
            assert all(torch.equal(a, b) for a, b in zip(captured["buffers"], now, strict=True)), (
                pcp, rank)
            plan = runner._afd_async_moe_ubatch_metadata["ubatch_slices"].plan
            assert plan.boundary_request is not None
            slots = global_slots(runner)
            for stage, built in zip(stage_tokens(plan, computed), stages, strict=True):
                layout = zigzag_layout(stage.num_scheduled_tokens, pcp)
                own = slots[stage.token_start:stage.token_start + stage.num_tokens]
                got = built.slot_mapping.numpy()[:int(layout.padded_tokens.sum())]
                if kind == "sfa_cp":  # MLA-CP compacts the decodes' slots in place
                    assert np.array_equal(got[layout.unpad_mask], own), (pcp, rank, stage.index)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("scheduled", "computed", "pcps"), FULL_BATCH_CASES, ids=CASE_IDS)
def test_each_builder_fault_moves_the_full_batch(standin_plugin, kind, scheduled, computed,
                                                 pcps):
    for pcp in pcps:
        moved = []
        for rank in range(pcp):
            with get_fault(BUILDER_FAULTS[kind]).applied():
                _, full, before, _ = _built(standin_plugin, kind, scheduled, computed, pcp, rank)
            moved.append(changed_fields(before, full))
        assert all("slot_mapping" in fields for fields in moved), (pcp, moved)


def _built(standin_plugin, kind, scheduled, computed, pcp, rank, *, fail_stage_1=False,
           captured=None):
    """The planner patch's step on ``rank``; (runner, full metadata, its fields before the
    stage build, the stage metadata)."""
    seams = standin_plugin(RELEASE)
    install_deferred(new_session=session_factory(
        None, EngineAlignment(tp_size=1, sequence_parallel=False, pcp_size=pcp), rank))
    runner, batch = pcp_runner(seams, scheduled, computed, pcp, rank)
    configure_builders(runner, kind, scheduled, pcp)
    captured = {} if captured is None else captured
    captured["runner"] = runner
    if fail_stage_1:
        def fail(*args, **kwargs):
            raise RuntimeError("stage 1's builder failed")

        runner.attn_groups[0][0].metadata_builders[1].build = fail
    stage_build = runner._build_attention_metadata_with_ubatches

    def build_stages(*args, **kwargs):  # the full batch's fields just before the stage build
        captured["before"] = full_batch_fields(captured["full"])
        builders = metadata_builders(runner)
        captured["bindings"] = [dict(vars(builder)) for builder in builders]
        captured["buffers"] = [buffer.clone() for buffer in stage_written_buffers(
            builders, runner.pcp_manager)]
        return stage_build(*args, **kwargs)

    runner._build_attention_metadata_with_ubatches = build_stages
    rank_rows = np.array(batch.rank_rows, dtype=np.int32)
    kwargs = {"num_tokens": int(rank_rows.sum()), "num_tokens_padded": int(rank_rows.sum()),
              "num_reqs": len(scheduled), "num_scheduled_tokens_np": rank_rows,
              "ubatch_slices": None}
    builder = runner.attn_groups[0][0].metadata_builders[0]
    build = builder.build

    def first_build_is_the_full_batch(*args, **kwargs):
        metadata = build(*args, **kwargs)
        captured.setdefault("full", metadata)
        return metadata

    builder.build = first_build_is_the_full_batch
    full = runner._build_attention_metadata_with_async_moe_ubatches((), kwargs, kwargs)
    assert "before" in captured, "the stage build never ran"
    assert full is captured["full"]  # the planner hands back upstream's full batch
    stages = runner._afd_async_moe_ubatch_metadata["attn_metadata"]
    return runner, full, captured["before"], stages


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_stage_build_leaves_the_full_batch_and_the_builders_as_built(
        standin_plugin, kind):
    """Stage 1's builder fails after stage 0 wrote through builder 0 and the padded-slot
    buffer: the full batch, every builder buffer and binding are as before the stage build."""
    scheduled, computed, pcp, rank = [700, 300, 1500, 400, 96], [128, 2048, 512, 0, 1664], 8, 3
    captured = {}
    with pytest.raises(RuntimeError, match="stage 1's builder failed"):
        _built(standin_plugin, kind, scheduled, computed, pcp, rank, fail_stage_1=True,
               captured=captured)
    runner = captured["runner"]
    assert changed_fields(captured["before"], captured["full"]) == []
    builders = metadata_builders(runner)
    now = stage_written_buffers(builders, runner.pcp_manager)
    assert len(now) == len(captured["buffers"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(captured["buffers"], now, strict=True))
    assert [dict(vars(builder)) for builder in builders] == captured["bindings"]

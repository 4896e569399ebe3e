"""Upstream's own ``request`` split under PCP overwrites the full batch's slots (a finding).

Read at afd-plugin release/v0.19.1rc1 2f4f4627 (``v1/worker/npu/attention_model_runner.py``,
``AFDNPUAttentionModelRunner._build_attention_metadata_with_ubatches``) and vllm-ascend
v0.19.1rc1 da421afad719: the plugin builds the full batch first (builder 0 of the
group; under MLA-CP / attention-CP its ``slot_mapping`` stays a view of the
``PCPManager.pcp_padded_slot_mapping_list[gid]`` buffer, ``mla_v1.py``; under SFA-CP a
view of builder 0's ``slot_mapping_buf``, ``sfa_cp.py``), then, for its own
request-boundary stages, pads the full batch's slots again
(``_get_block_table_and_slot_mapping(0)``), runs ``_build_stage_local_pcp_metadata`` per
stage, which calls ``get_padded_slot_mapping`` for the stage's tokens (it clones the
result, but the manager's buffer keeps the last stage's slots; the plugin's
``restore_pcp_manager_state`` does not restore it), and builds stage ``ubid`` with
``get_metadata_builder(ubid or 0)``. The dense layers (``first_k_dense_replace``) then
write their KV with the full batch's slots. main 2e4378f has no PCP stage rebuild.

The hook never touches this path (``request`` runs exactly as the plugin alone, issue
30), so these tests drive the release stand-in runner's own stage build
(``hook_standins``) with no hook installed, and assert the contamination and name the
tokens whose slots are lost; then show that the guard the hook puts around
``token_balanced`` (``builder_state``), proposed upstream in docs/ascend.md, keeps the
full batch bit-identical on the same path.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from afd_split import plan_split
from afd_split.engine.state import preserved_state
from afd_split.hook.glue.builder_state import (
    builder_state_targets,
    metadata_builders,
    stage_written_buffers,
)
from afd_split.hook.glue.evidence_only import FULL_BATCH_CONTAMINATED, record_plugin_step
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.stage import zigzag_layout
from pytest_afd.backends.cpu.pcp_builders import changed_fields, full_batch_fields, logical_slots
from tests.support.hook_pcp_runner import RELEASE, configure_builders, pcp_runner

REQUEST_SPLIT_CASES = [
    # (scheduled, computed, pcp): prefills of different cached lengths; one request a
    # multiple of 2 * pcp, the others not
    ([700, 300, 1500, 400, 96], [128, 2048, 512, 0, 1664], 8),
    ([96, 40, 120, 64], [0, 32, 200, 16], 2),
    ([1000, 1000], [0, 256], 8),
]
CASE_IDS = ["five", "four", "1000x2"]
KINDS = ("sfa_cp", "mla_cp")


def request_boundary_slices(scheduled, rank_rows) -> list:
    """The plugin's own split (``create_request_boundary_ubatch_slices``; the same cut as
    ``plan_split(policy="request_boundary")``): request and rank-row slices per stage."""
    boundary = plan_split(np.asarray(scheduled), policy="request_boundary").ubatches[1]
    first = boundary.request_slice.start
    cut = int(np.sum(rank_rows[:first]))
    total = int(np.sum(rank_rows))
    return [SimpleNamespace(request_slice=slice(0, first), token_slice=slice(0, cut)),
            SimpleNamespace(request_slice=slice(first, len(scheduled)),
                            token_slice=slice(cut, total))]


def _stage_common(common, ubatch_slice):
    """The stage's common metadata as the plugin's slicer leaves it before the rebuild (the
    fields the stand-in builders read; the rebuild replaces slots and PCP metadata)."""
    rows = ubatch_slice.token_slice
    requests = ubatch_slice.request_slice
    stage = copy.copy(common)
    qsl = common.query_start_loc_cpu[requests.start:requests.stop + 1]
    stage.query_start_loc_cpu = qsl - qsl[0]
    stage.num_actual_tokens = stage.num_input_tokens = rows.stop - rows.start
    stage.positions = common.positions[rows]
    return stage


def _upstream_request_step(standin_plugin, monkeypatch, kind, scheduled, computed, pcp, rank,
                           *, guarded=False, captured=None):
    """The plugin's own ``request`` step on ``rank``: full batch, then its stage build.
    Returns (full metadata, its fields before the stage build); ``captured`` gets the
    runner, its rank rows and the stage slices."""
    seams = standin_plugin(RELEASE)  # no hook installed: the plugin alone
    runner, batch = pcp_runner(seams, scheduled, computed, pcp, rank)
    configure_builders(runner, kind, scheduled, pcp)
    monkeypatch.setattr(seams.runner_module, "split_attn_metadata",
                        lambda slices, common, _: [_stage_common(common, s) for s in slices],
                        raising=True)
    full = type(runner).__mro__[1]._build_attention_metadata(runner)  # NPUModelRunner's
    before = full_batch_fields(full)
    rank_rows = np.asarray(batch.rank_rows)
    slices = request_boundary_slices(scheduled, rank_rows)
    builders = metadata_builders(runner)
    targets = builder_state_targets(builders, stage_written_buffers(builders, runner.pcp_manager))
    with preserved_state(*(targets if guarded else ())):
        runner._build_attention_metadata_with_ubatches(
            ubatch_slices=slices, num_reqs=len(scheduled),
            num_tokens_padded=int(rank_rows.sum()))
    if captured is not None:
        captured.update(runner=runner, rank_rows=rank_rows, slices=slices)
    return full, before


def lost_slots(scheduled, pcp: int, before, full) -> list[tuple[int, int, int]]:
    """(token, slot upstream built, slot after the stage build) of every real token of the
    full batch whose slot changed (``-1``: its KV is not written at all)."""
    layout = zigzag_layout(np.asarray(scheduled), pcp)
    was = logical_slots(layout, before["slot_mapping"].numpy())
    now = logical_slots(layout, full.slot_mapping.numpy())
    return [(int(token), int(was[token]), int(now[token]))
            for token in np.flatnonzero(was != now)]


@pytest.mark.parametrize(("scheduled", "computed", "pcp"), REQUEST_SPLIT_CASES, ids=CASE_IDS)
def test_upstream_request_split_overwrites_the_mla_cp_full_batchs_slots(
        standin_plugin, monkeypatch, scheduled, computed, pcp):
    for rank in (0, pcp - 1):
        full, before = _upstream_request_step(standin_plugin, monkeypatch, "mla_cp", scheduled,
                                              computed, pcp, rank)
        assert changed_fields(before, full) == ["slot_mapping"], rank
        lost = lost_slots(scheduled, pcp, before, full)
        # The buffer holds the last stage's slots from its first entry on: every real token
        # of the first stage's requests (at least) lost its slot.
        first_stage = request_boundary_slices(scheduled, np.ones(len(scheduled)))[0]
        assert len(lost) >= sum(scheduled[first_stage.request_slice]), (rank, len(lost))
        assert all(built >= 0 and now != built for _, built, now in lost)


@pytest.mark.parametrize(("scheduled", "computed", "pcp"), REQUEST_SPLIT_CASES, ids=CASE_IDS)
def test_upstream_request_split_leaves_the_sfa_cp_full_batch(standin_plugin, monkeypatch,
                                                             scheduled, computed, pcp):
    """SFA-CP (DeepSeek V3.2) copies the slots into builder 0's own buffer, and stage 0 of a
    request-boundary split writes there exactly the full batch's first padded slots (the
    padded layout is in request order): the same values. Only a cut inside a request
    (``token_balanced``) pads the head piece differently (issue 29)."""
    for rank in (0, pcp - 1):
        full, before = _upstream_request_step(standin_plugin, monkeypatch, "sfa_cp", scheduled,
                                              computed, pcp, rank)
        assert changed_fields(before, full) == [], rank


def test_the_lost_slots_are_named_for_the_issues_case(standin_plugin, monkeypatch):
    """[1000, 1000] computed [0, 256] at PCP 8 under MLA-CP (the plugin splits between the
    two requests): the full batch's first padded slots become stage 1's, so the dense
    layers write request 0's KV into request 1's slots, and request 0's own slots get
    nothing; request 1's own entries are left as built."""
    scheduled, pcp = [1000, 1000], 8
    full, before = _upstream_request_step(standin_plugin, monkeypatch, "mla_cp", scheduled,
                                          [0, 256], pcp, 3)
    lost = lost_slots(scheduled, pcp, before, full)
    layout = zigzag_layout(np.asarray(scheduled), pcp)
    built = logical_slots(layout, before["slot_mapping"].numpy())
    assert [token for token, _, _ in lost] == list(range(1000))  # all of request 0
    assert [now for _, _, now in lost] == built[1000:2000].tolist()  # request 1's slots
    assert lost[0] == (0, int(built[0]), int(built[1000]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("scheduled", "computed", "pcp"), REQUEST_SPLIT_CASES, ids=CASE_IDS)
def test_the_proposed_fix_keeps_the_full_batch(standin_plugin, monkeypatch, kind, scheduled,
                                               computed, pcp):
    """The hook's guard (builder bindings and buffer contents preserved) around the same
    stage build: the full batch stays bit-identical on every rank."""
    for rank in range(pcp):
        full, before = _upstream_request_step(standin_plugin, monkeypatch, kind, scheduled,
                                              computed, pcp, rank, guarded=True)
        assert changed_fields(before, full) == [], (kind, rank)


class _Lines:
    def __init__(self) -> None:
        self.lines: list[dict] = []

    def append(self, line: dict) -> None:
        self.lines.append(line)


def _evidence_line(captured, full) -> dict:
    """The evidence-only hook's step line for the plugin's own ``request`` step above (the
    router's result is ``(per-layer full metadata, common)``)."""
    runner = captured["runner"]
    runner._afd_async_moe_ubatch_metadata = {"ubatch_slices": captured["slices"]}
    session = SimpleNamespace(steps_planned=0, writer=_Lines(), ranks=StepRanks(global_rank=0),
                              alignment=EngineAlignment(tp_size=1, sequence_parallel=False,
                                                        pcp_size=8),
                              expert_load=None)
    values = {"num_scheduled_tokens_np": captured["rank_rows"],
              "num_tokens_padded": int(captured["rank_rows"].sum())}
    record_plugin_step(runner, session, values, "request", "request",
                       ({"model.layers.0.self_attn": full}, runner.common))
    (line,) = session.writer.lines
    return line


@pytest.mark.parametrize("kind", KINDS)
def test_the_request_controls_evidence_marks_the_contaminated_full_batch(standin_plugin,
                                                                          monkeypatch, kind):
    """The evidence-only hook reads (host-only) which of the full batch's fields view the
    PCP manager's padded-slot buffer after the plugin's own stage build: MLA-CP's slots do
    and the step line says so; SFA-CP's own buffer is not marked. The plugin's objects are
    left as they were."""
    captured = {}
    full, before = _upstream_request_step(standin_plugin, monkeypatch, kind, [1000, 1000],
                                          [0, 256], 8, 3, captured=captured)
    after = full_batch_fields(full)
    line = _evidence_line(captured, full)
    assert changed_fields(after, full) == []  # recording wrote nothing the plugin reads
    assert [ubatch["num_real_tokens"] for ubatch in line["ubatches"]] == [
        int(captured["rank_rows"][:1].sum()), int(captured["rank_rows"][1:].sum())]
    if kind == "mla_cp":
        mark = line[FULL_BATCH_CONTAMINATED]
        assert mark["fields"] == ["StandInCpMetadata.slot_mapping"]
        assert mark["buffer"] == "PCPManager.pcp_padded_slot_mapping_list"
        assert changed_fields(before, full) == ["slot_mapping"]  # and it really is
    else:
        assert FULL_BATCH_CONTAMINATED not in line

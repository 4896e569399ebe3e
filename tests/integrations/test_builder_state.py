"""``builder_state``: which buffers are guarded, restored contents, owned stage views."""

from types import SimpleNamespace

import pytest
import torch

from afd_split.engine.standin_builders import (
    PaddedSlotBuffer,
    StandInAttentionGroup,
    StandInSfaCpBuilder,
)
from afd_split.engine.state import BufferContents, preserved_state
from afd_split.hook.glue.builder_state import (
    builder_state_targets,
    metadata_builders,
    own_stage_views,
    stage_write_bound,
    stage_written_buffers,
)


def _runner():
    builders = [StandInSfaCpBuilder(max_num_batched_tokens=64, max_num_seqs=2, pcp_size=2)
                for _ in range(2)]
    manager = SimpleNamespace(pcp_padded_slot_mapping_list=[PaddedSlotBuffer(64).buffer],
                              query_lens_pcp_full=SimpleNamespace(cpu=torch.zeros(4),
                                                                  gpu=torch.zeros(4)))
    group = StandInAttentionGroup(builders)
    return SimpleNamespace(attn_groups=[[group, group]], pcp_manager=manager), builders


def test_every_builder_once_and_every_stage_written_buffer():
    runner, builders = _runner()
    assert metadata_builders(runner) == builders  # the group listed twice counts once
    buffers = stage_written_buffers(builders, runner.pcp_manager)
    assert [b.data_ptr() for b in buffers] == [
        builders[0].slot_mapping_buf.data_ptr(), builders[1].slot_mapping_buf.data_ptr(),
        runner.pcp_manager.pcp_padded_slot_mapping_list[0].data_ptr(),
        runner.pcp_manager.query_lens_pcp_full.cpu.data_ptr(),
        runner.pcp_manager.query_lens_pcp_full.gpu.data_ptr()]
    assert stage_written_buffers([], None) == []


@pytest.mark.parametrize("fail", [False, True])
def test_buffer_contents_and_bindings_restored_in_place(fail):
    _, builders = _runner()
    buffer = builders[0].slot_mapping_buf
    buffer.fill_(7)
    full_view = buffer[:8]
    targets = builder_state_targets(builders, [buffer])
    try:
        with preserved_state(*targets):
            buffer[:4] = -1
            builders[0].slot_mapping = "stage"
            if fail:
                raise RuntimeError("stage build failed")
    except RuntimeError:
        assert fail
    assert full_view.tolist() == [7] * 8 and full_view.data_ptr() == buffer.data_ptr()
    assert not hasattr(builders[0], "slot_mapping")


def test_own_stage_views_copies_only_fields_viewing_a_guarded_buffer():
    _, builders = _runner()
    buffer = builders[0].slot_mapping_buf
    buffer.fill_(3)
    other = torch.arange(4)
    inner = SimpleNamespace(restore=buffer[2:6])
    stage = SimpleNamespace(slot_mapping=buffer[:4], positions=other, inner=inner)
    copied = own_stage_views([{"layer.0": stage, "layer.1": stage}], [buffer])
    assert copied == 2  # the shared object once; the nested view too
    buffer.fill_(0)
    assert stage.slot_mapping.tolist() == [3] * 4 and inner.restore.tolist() == [3] * 4
    assert stage.positions is other
    assert own_stage_views([stage], []) == 0
    assert isinstance(BufferContents(buffer).buffer, torch.Tensor)


def test_a_limited_guard_restores_its_prefix_only_and_keeps_views():
    buffer = torch.arange(10)
    view = buffer[:4]
    with preserved_state(BufferContents(buffer, limit=6)):
        buffer[:8] = -1  # a build writing past the limit
    assert view.tolist() == [0, 1, 2, 3] and view.data_ptr() == buffer.data_ptr()
    assert buffer.tolist() == [0, 1, 2, 3, 4, 5, -1, -1, 8, 9]  # the tail is not restored
    with preserved_state(BufferContents(buffer, limit=100)):  # past the end: the whole buffer
        buffer.fill_(7)
    assert buffer.tolist() == [0, 1, 2, 3, 4, 5, -1, -1, 8, 9]


def test_stage_write_bound_by_hand():
    # 3 requests, 1,000 tokens at PCP 8: 1,000 + 2 * 8 * (3 + 1) = 1,064 slots; the per-rank
    # rows (130 padded) * 8 = 1,040 are fewer.
    assert stage_write_bound([500, 300, 200], 128, 130, 8) == 1064
    # DP padding past the scheduled tokens: the padded rows decide.
    assert stage_write_bound([10], 10, 4096, 1) == 4096
    assert stage_write_bound([10], 10, None, 1) == 10 + 2 * 1 * 2
    targets = builder_state_targets([], [torch.zeros(3)], limit=5)
    assert [t.limit for t in targets] == [5]

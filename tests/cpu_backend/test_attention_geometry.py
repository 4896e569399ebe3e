"""One attention geometry per forward, ubatch and metadata, read by every layer, and the PCP
emulation's per-step derivations (issue 43: the harness's host cost per forward).

The cached paths must be bit-identical to deriving everything afresh: every layer its own
geometry, every rank and stage its own layouts and masks. Random batches through the
backend (token-balanced cuts inside requests, PCP 8 and 2, chunked continuations, prefix
hits) compare logits, next tokens, expert load and step evidence exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints, plan_split
from afd_split.checks.metadata import BatchMetadata
from afd_split.pcp.stage import stage_rows, stage_tokens
from pytest_afd.backends.cpu import build_model, named_config
from pytest_afd.backends.cpu import executor as cpu_executor
from pytest_afd.backends.cpu.attention_geometry import AttentionGeometry
from pytest_afd.backends.cpu.backend import CpuBackend
from pytest_afd.backends.cpu.pcp import PcpEmulation
from pytest_afd.backends.cpu.pcp_builders import StepPcp
from pytest_afd.core.backend import PromptRequest, RunSettings

BLOCK = 16
RUNS = 3
"""Rounds over the six cases: random batches each round (a round is ~0.5 s of forwards)."""
# (pcp_size, split_align, chunk_size, prefix hit): every PCP size the gates run, chunked
# continuations (computed tokens > 0) and prefix hits.
CASES = [(8, 1, None, False), (8, 1, 16, True), (2, 2, 32, False), (2, 2, None, True),
         (1, 4, 16, True), (1, 4, None, False)]


@pytest.fixture(scope="module")
def model():
    return build_model(named_config("reduced", num_hidden_layers=3, first_k_dense_replace=1),
                       seed=0)


def _prompts(rng, tag: str, prefix: tuple = ()) -> list[PromptRequest]:
    lengths = rng.integers(1, 61, int(rng.integers(1, 5)))
    return [PromptRequest(f"{tag}{i}", prefix + tuple(int(t) for t in rng.integers(0, 2048, n)))
            for i, n in enumerate(lengths)]


def _outputs(model) -> list:
    """Every run's logits, next tokens, expert load and step evidence over the cases."""
    backend = CpuBackend(model, seed=0)
    rng = np.random.default_rng(7)
    seen = []
    for run in range(RUNS):
        for case, (pcp, align, chunk, prefix_hit) in enumerate(CASES):
            settings = RunSettings(chunk_size=chunk, prefix_caching=prefix_hit, block_size=BLOCK,
                                   split_align=align, pcp_size=pcp)
            backend.reset_prefix_cache()
            prefix = ()
            if prefix_hit:
                prefix = tuple(int(t) for t in rng.integers(0, 2048, 32))
                backend.run([PromptRequest(f"seed{run}-{case}", (*prefix, 1))], settings)
            out = backend.run(_prompts(rng, f"r{run}-{case}-", prefix), settings)
            seen.append(([r.logits for r in out.requests], [r.next_token for r in out.requests],
                         [r.num_cached_tokens for r in out.requests], out.expert_load,
                         [{k: v for k, v in step.items() if not k.endswith("_s")}
                          for step in out.steps]))
    return seen


def _assert_identical(cached: list, fresh: list) -> None:
    assert len(cached) == len(fresh)
    for ours, theirs in zip(cached, fresh, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(ours[0], theirs[0], strict=True))
        assert ours[1:] == theirs[1:]


def test_one_geometry_per_forward_equals_every_layer_deriving_its_own(model, monkeypatch):
    made = []
    original = AttentionGeometry.of.__func__

    def counted(cls, *args):
        made.append(1)
        return original(cls, *args)

    monkeypatch.setattr(AttentionGeometry, "of", classmethod(counted))
    cached = _outputs(model)
    cached_made = len(made)
    monkeypatch.setattr(cpu_executor._Stage, "attention_geometry", lambda self, config, metadata: None)
    made.clear()
    fresh = _outputs(model)
    _assert_identical(cached, fresh)
    assert any(steps for *_, steps in cached)
    assert cached_made * 2 < len(made)  # the cache really was read by the later layers


def _batch(lengths, computed) -> BatchMetadata:
    counts = np.asarray(lengths)
    seq = counts + np.asarray(computed)
    positions = np.concatenate([np.arange(c, s) for c, s in zip(computed, seq, strict=True)])
    blocks = -(-int(seq.max()) // BLOCK)
    table = np.arange(len(counts) * blocks).reshape(len(counts), blocks)
    slots = np.concatenate([table[i, p // BLOCK] * BLOCK + p % BLOCK for i, p in enumerate(
        np.split(positions, np.cumsum(counts)[:-1]))])
    return BatchMetadata(np.concatenate([[0], np.cumsum(counts)]), seq, np.asarray(computed),
                         slots, table, positions, block_size=BLOCK)


def _same_geometry(ours: AttentionGeometry, theirs: AttentionGeometry) -> bool:
    tensors = ("rows", "positions", "cos", "sin", "slots")
    if not all(torch.equal(getattr(ours, n), getattr(theirs, n)) for n in tensors):
        return False
    if ours.needs_index != theirs.needs_index or len(ours.requests) != len(theirs.requests):
        return False
    for a, b in zip(ours.requests, theirs.requests, strict=True):
        if a.index != b.index or not torch.equal(a.rows, b.rows) or not torch.equal(a.context,
                                                                                    b.context):
            return False
        for x, y in zip(a.blocks, b.blocks, strict=True):
            if (x.key_end, x.padded_end) != (y.key_end, y.padded_end) or not torch.equal(
                    x.causal, y.causal) or (x.mask is None) != (y.mask is None):
                return False
            if x.mask is not None and not torch.equal(x.mask, y.mask):
                return False
    return True


def test_a_geometry_is_reused_only_for_the_same_rows_and_other_slots(model):
    config = dataclasses.replace(model.config, index_topk=48)  # some blocks narrowed per layer
    metadata = _batch([70, 5, 30], [0, 40, 10])
    geometry = AttentionGeometry.of(config, metadata, None, metadata.num_tokens)
    assert any(b.mask is None for r in geometry.requests for b in r.blocks)
    assert any(b.mask is not None for r in geometry.requests for b in r.blocks)
    other_slots = dataclasses.replace(metadata, slot_mapping=metadata.slot_mapping + BLOCK)
    reused = geometry.with_slots_of(other_slots)
    assert reused is not None and reused.metadata is other_slots
    assert _same_geometry(reused, AttentionGeometry.of(config, other_slots, None,
                                                       metadata.num_tokens))
    for name in ("positions", "seq_lens", "query_start_loc", "block_table"):
        copied = dataclasses.replace(metadata, **{name: np.array(getattr(metadata, name))})
        assert geometry.with_slots_of(copied) is None, name  # not the same array: derive anew
    with pytest.raises(ValueError, match="another metadata"):
        geometry.check_for(other_slots, metadata.num_tokens)
    with pytest.raises(ValueError, match="another metadata"):
        geometry.check_for(metadata, metadata.num_tokens + 1)


@pytest.mark.parametrize("pcp", [2, 8])
def test_the_emulations_step_layouts_equal_the_split_paths_own(pcp):
    lengths, computed = [150, 37, 260, 1], [0, 48, 16, 3]
    metadata = _batch(lengths, computed)
    plan = plan_split(lengths, policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=pcp, align=1))
    emulation = PcpEmulation(plan, metadata)
    pieces = stage_tokens(plan, metadata.num_computed_tokens)
    reference = stage_rows(plan, metadata.num_computed_tokens, pcp).stages
    assert len(emulation.stages) == len(reference) == len(emulation.stage_pieces)
    for ours, theirs, piece, own in zip(emulation.stages, reference, emulation.stage_pieces,
                                        pieces, strict=True):
        for field in dataclasses.fields(theirs):
            assert np.array_equal(getattr(ours, field.name), getattr(theirs, field.name))
        assert np.array_equal(piece.num_computed_tokens, own.num_computed_tokens)
        assert np.array_equal(piece.num_scheduled_tokens, own.num_scheduled_tokens)
    step = StepPcp.make(list(pieces), emulation.computed, pcp, emulation.parent,
                        emulation.stages)
    assert np.array_equal(step.unpad_mask, emulation.parent.unpad_mask)
    assert all(np.array_equal(mask, layout.unpad_mask)
               for mask, layout in zip(step.stage_unpad_masks, reference, strict=True))

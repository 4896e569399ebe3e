"""CpuBackend through the Backend protocol: scheduling, split evidence, prefix hits, modes."""

import numpy as np
import pytest

from pytest_afd.backends import create_backend
from pytest_afd.backends.cpu import CAPABILITIES, CpuBackend, load_per_rank, named_config
from pytest_afd.backends.cpu import create as create_cpu
from pytest_afd.core.backend import Backend, PromptRequest, RunSettings
from pytest_afd.golden.store import FLOAT32_ATOL, FLOAT32_RTOL, W8A8_ATOL, W8A8_RTOL
from pytest_afd.topology.spec import parse_topology

BLOCK = 32


def prompts_with_shared_prefix(lengths=(40, 300, 150), prefix=200, seed=0):
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 2048, prefix).tolist()
    return [
        PromptRequest(f"req{i}", tuple(shared + rng.integers(0, 2048, n).tolist()))
        for i, n in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def backend():
    be = create_backend("cpu", topology=None, model_name="reduced", seed=0, results_dir=".")
    yield be
    be.close()


@pytest.fixture(scope="module")
def prompts():
    return prompts_with_shared_prefix()


@pytest.fixture(scope="module")
def reference(backend, prompts):
    return backend.run(prompts, RunSettings(split_policy="none", block_size=BLOCK))


def logits(outputs):
    return np.stack([r.logits for r in outputs.requests])


def assert_close(a, b, atol=FLOAT32_ATOL, rtol=FLOAT32_RTOL):
    np.testing.assert_allclose(logits(a), logits(b), atol=atol, rtol=rtol)


def test_implements_protocol(backend):
    assert isinstance(backend, Backend) and isinstance(backend, CpuBackend)
    assert backend.capabilities == CAPABILITIES
    facts = backend.describe()
    assert facts["model"]["num_layers"] == 10 and len(facts["model"]["weights_sha256"]) == 64


def test_reference_outputs(reference, prompts):
    assert [r.request_id for r in reference.requests] == [p.request_id for p in prompts]
    for out in reference.requests:
        assert out.logits.shape == (2048,) and out.logits.dtype == np.float32
        assert out.next_token == int(out.logits.argmax()) and out.num_cached_tokens == 0
    assert len(reference.steps) == 1 and reference.steps[0]["is_split"] is False
    assert np.asarray(reference.expert_load).shape == (7, 32)


@pytest.mark.parametrize(
    "settings",
    [
        RunSettings(block_size=BLOCK),
        RunSettings(split_policy="request_boundary", block_size=BLOCK),
        RunSettings(block_size=BLOCK, split_align=8, pcp_size=2),
        RunSettings(block_size=BLOCK, chunk_size=128),
        RunSettings(block_size=BLOCK, chunk_size=256, max_num_seqs=2),
    ],
    ids=["token_balanced", "request_boundary", "align8_pcp2", "chunk128", "chunk256_seqs2"],
)
def test_split_and_chunked_runs_match_reference(backend, prompts, reference, settings):
    out = backend.run(prompts, settings)
    assert_close(out, reference)
    assert [r.next_token for r in out.requests] == [r.next_token for r in reference.requests]
    assert out.steps and all("schedule" in s and "policy" in s for s in out.steps)
    if settings.chunk_size:
        assert len(out.steps) > 1
        assert max(s["schedule"]["num_tokens"] for s in out.steps) <= settings.chunk_size


def test_prefix_hits_are_realized_and_match(backend, prompts, reference):
    backend.reset_prefix_cache()
    settings = RunSettings(block_size=BLOCK, prefix_caching=True)
    cold = backend.run(prompts, settings)
    assert [r.num_cached_tokens for r in cold.requests] == [0, 0, 0]
    warm = backend.run(prompts, settings)
    assert [r.num_cached_tokens for r in warm.requests] == [224, 480, 320]
    assert warm.steps[0]["cached_tokens"] == [224, 480, 320]
    assert warm.steps[0]["num_real_tokens"] == sum(p.num_prompt_tokens for p in prompts) - 1024
    assert_close(warm, reference)
    suffix = np.random.default_rng(99).integers(0, 2048, 90).tolist()
    other = PromptRequest("new", prompts[0].prompt_token_ids[:200] + tuple(suffix))
    hit = backend.run([other], settings)
    assert hit.requests[0].num_cached_tokens == 192
    backend.reset_prefix_cache()
    assert backend.run(prompts, settings).requests[1].num_cached_tokens == 0


def test_w8a8_within_documented_tolerance_and_not_float(backend, prompts, reference):
    quant = RunSettings(block_size=BLOCK, quantization="w8a8", split_policy="none")
    w8a8 = backend.run(prompts, quant)
    assert not np.allclose(logits(w8a8), logits(reference), atol=FLOAT32_ATOL)
    split = backend.run(prompts, RunSettings(block_size=BLOCK, quantization="w8a8"))
    assert_close(split, w8a8, atol=W8A8_ATOL, rtol=W8A8_RTOL)


def test_forced_routing_evidence(backend, prompts, reference):
    out = backend.run(prompts, RunSettings(block_size=BLOCK, routing="forced_balanced"))
    load = np.asarray(out.expert_load)
    assert (load.max(1) - load.min(1) <= len(prompts)).all()
    assert not np.allclose(logits(out), logits(reference), atol=1e-3)


def test_per_rank_load_uses_topology_emulation(prompts):
    topology = parse_topology("dp3pcp8-ep8")
    be = create_cpu(topology=topology, model_name="reduced", seed=0, results_dir=".")
    out = be.run(prompts, RunSettings(block_size=BLOCK))
    step = out.steps[0]
    assert step["constraints"]["pcp_size"] == topology.cpu_emulation().pcp_size
    per_rank = np.asarray(step["expert_load_per_rank"])
    assert per_rank.shape == (7, 8)
    np.testing.assert_array_equal(per_rank, load_per_rank(np.asarray(out.expert_load), 8))
    np.testing.assert_array_equal(np.asarray(step["expert_load"]), np.asarray(out.expert_load))
    assert be.describe()["topology_emulation"]["num_ep_ranks"] == 8


def test_load_per_rank_uneven():
    load = np.arange(10).reshape(1, 10)
    assert load_per_rank(load, 3).tolist() == [[0 + 1 + 2 + 3, 4 + 5 + 6, 7 + 8 + 9]]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (RunSettings(block_size=100), "block_size=100"),
        (RunSettings(block_size=BLOCK, chunk_size=100), "chunk 100"),
    ],
)
def test_bad_settings_raise(backend, prompts, settings, message):
    with pytest.raises(ValueError, match=message):
        backend.run(prompts, settings)


def test_bad_prompts_raise(backend):
    with pytest.raises(ValueError, match="'a' appears more than once"):
        backend.run([PromptRequest("a", (1,)), PromptRequest("a", (2,))], RunSettings())
    with pytest.raises(ValueError, match="token id 5000"):
        backend.run([PromptRequest("b", (1, 5000))], RunSettings())
    with pytest.raises(ValueError, match="empty prompt"):
        backend.run([PromptRequest("c", ())], RunSettings())


def test_create_rejects_unknown_model():
    with pytest.raises(ValueError, match="model_name='nope'"):
        create_cpu(topology=None, model_name="nope", seed=0, results_dir=".")


def test_create_from_pretrained_directory(tmp_path, prompts, reference):
    from pytest_afd.backends.cpu import init_weights, save_pretrained

    save_pretrained(named_config("reduced"), init_weights(named_config("reduced"), 0), tmp_path)
    be = create_cpu(topology=None, model_name=str(tmp_path), seed=0, results_dir=".")
    out = be.run(prompts, RunSettings(split_policy="none", block_size=BLOCK))
    np.testing.assert_array_equal(logits(out), logits(reference))


def test_instrumented_run_reports_per_layer_components(backend, prompts, reference):
    out = backend.run(prompts, RunSettings(block_size=BLOCK, instrument=True))
    layers = out.timings["layers"]
    assert len(layers) == 10
    assert set(layers[0]) == {"attention", "dense_mlp"}
    assert set(layers[5]) == {"attention", "route", "routed_moe", "shared_moe"}
    assert all(v > 0 for layer in layers for v in layer.values())
    assert len(out.timings["ubatches"][5]) == 2  # token-balanced split: two ubatches
    np.testing.assert_array_equal(logits(out), logits(reference))
    assert backend.run(prompts, RunSettings(block_size=BLOCK)).timings == {}


def test_split_layout_settings_override_topology_emulation():
    from pytest_afd.backends.cpu import split_layout

    topology = parse_topology("dp3pcp8-ep8")
    from_topology = split_layout(RunSettings(), topology)
    assert (from_topology.pcp_size, from_topology.num_ep_ranks) == (8, 8)
    overridden = split_layout(RunSettings(split_align=4, pcp_size=2), topology)
    assert (overridden.split_align, overridden.pcp_size, overridden.num_ep_ranks) == (4, 2, 8)
    assert split_layout(RunSettings(pcp_size=2), None).num_ep_ranks == 1
    # An explicit 1 is a choice, not "unset": it must not fall back to the topology's PCP 8.
    explicit_one = split_layout(RunSettings(pcp_size=1), topology)
    assert explicit_one.pcp_size == 1


@pytest.mark.parametrize("field", ["split_align", "pcp_size"])
def test_run_settings_reject_non_positive_layout(field):
    with pytest.raises(ValueError, match=field):
        RunSettings(**{field: 0})


def test_in_process_run_reports_its_peak_memory(backend, prompts):
    run = backend.run(prompts, RunSettings(split_policy="none", block_size=BLOCK))
    # At least the model's own weights are resident while it runs.
    weights_bytes = sum(t.numel() * t.element_size() for t in backend.model.weights.values())
    assert run.peak_memory_bytes is not None and run.peak_memory_bytes > weights_bytes

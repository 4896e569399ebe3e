"""The runner's patched metadata router installs the layer/stage profiler ranges once,
only when the plugin's Attention profiler is on, for every ``async_moe_split`` value
(stand-in runners of both pinned branches: ``evidence_only_standins``)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from afd_split.hook.facts.pinned import BRANCHES
from afd_split.hook.glue import layer_ranges
from afd_split.hook.patches.router import install_evidence_only
from tests.support.evidence_only_standins import deciding_runner_source
from tests.support.hook_standins import _load


class Layer(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.is_moe_layer = layer_idx, layer_idx > 0
        self.self_attn = torch.nn.Linear(4, 4)
        self.mlp = torch.nn.Linear(4, 4)


def router_kwargs(tokens):
    tokens = np.asarray(tokens, dtype=np.int64)
    return {"num_tokens": int(tokens.sum()), "num_reqs": len(tokens),
            "max_query_len": int(tokens.max()), "num_tokens_padded": int(tokens.sum()),
            "num_reqs_padded": len(tokens), "ubatch_slices": None, "logits_indices": None,
            "use_spec_decode": False, "for_cudagraph_capture": False,
            "num_scheduled_tokens": None, "num_scheduled_tokens_np": tokens,
            "cascade_attn_prefix_lens": None}


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("split", ["none", "request", "token_balanced"])
def test_router_installs_ranges_when_the_profiler_is_on(tmp_path, monkeypatch, branch, split):
    module = _load(tmp_path / "attention_model_runner.py", deciding_runner_source(branch))
    try:
        assert install_evidence_only(module, lambda runner: None, lambda: "request") == branch
        model = torch.nn.ModuleList([Layer(0), Layer(1)])
        runner = module.AFDNPUAttentionModelRunner()
        runner.afd_async_extra_info = SimpleNamespace(
            async_moe_ubatching=split != "none", async_moe_split=split, async_moe_num_ubatches=2)
        runner.ubatch_slices = runner._afd_async_moe_ubatch_metadata = None
        runner.get_model = lambda: model
        runner.common = {"rows": np.arange(8 * 3).reshape(8, 3), "requests": np.arange(2)}
        monkeypatch.delenv(layer_ranges.ATTENTION_PROFILER_ENABLE, raising=False)
        runner._build_attention_metadata(**router_kwargs([5, 3]))
        assert layer_ranges.RANGES_ATTRIBUTE not in vars(runner)  # off: nothing installed
        monkeypatch.setenv(layer_ranges.ATTENTION_PROFILER_ENABLE, "1")
        runner._build_attention_metadata(**router_kwargs([5, 3]))
        runner._build_attention_metadata(**router_kwargs([4, 4]))
        installed = vars(runner)[layer_ranges.RANGES_ATTRIBUTE]
        assert installed.ranges == [("attention", 0), ("dense_mlp", 0), ("attention", 1)]
        assert len(model[0].self_attn._forward_pre_hooks) == 1  # once, not per step
    finally:
        sys.modules.pop(module.__name__, None)

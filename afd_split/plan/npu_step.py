"""Modelled NPU prefill step time, anchored on a published Ascend figure.

Why a separate model: CPU timings on this host say nothing about NPU time, and
the calibrated ``CostModel`` (``afd_split.plan.cost``) defaults to the reduced
model's CPU calibration. What a study costs on the recipe's deployment and how
large the hook's host cost is against a real step both need an NPU figure.

Anchor (the one published figure used): CloudMatrix-Infer (Zuo et al., "Serving
Large Language Models on Huawei CloudMatrix384", arXiv 2506.12708, 2025) reports
a prefill throughput of **6,688 tokens/s per Ascend 910C NPU** serving
DeepSeek-R1 (the same 61-layer, 671B MLA+MoE architecture V3.2 builds on).

Derivation of the recipe's step (stated, so it can be checked by hand):

* the recipe (afd-plugin ``recipe/npu/CAMAsyncAFDConnector/deepseek_v3_2``,
  ``pytest_afd.backends.vllm_ascend.recipe``) deploys 24 Attention NPUs
  (DP 3 x PCP 8) and 8 FFN NPUs: 32 NPUs, two 16-NPU nodes;
* the published figure is a per-NPU share of a deployment's throughput, so the
  deployment prefills ``6,688 x 32 = 214,016`` tokens/s;
* one step of ``--max-num-batched-tokens 140000`` tokens then takes
  ``140,000 / 214,016 = 0.654 s``.

The model is proportional (no fixed per-step term): the published figure gives
no floor, and a proportional model makes small steps *shorter*, so a host-cost
fraction against it is an upper bound (conservative). Pure Python; no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

CLOUDMATRIX_PREFILL_TOKENS_PER_S_PER_NPU = 6688.0
"""CloudMatrix-Infer, DeepSeek-R1 prefill on Ascend 910C, tokens/s per NPU."""
CLOUDMATRIX_SOURCE = ("CloudMatrix-Infer (arXiv 2506.12708): 6,688 prefill tokens/s per "
                      "Ascend 910C NPU, DeepSeek-R1")
RECIPE_ATTENTION_NPUS = 24
"""DP 3 x PCP 8 (``--data-parallel-size 3 --prefill-context-parallel-size 8``)."""
RECIPE_FFN_NPUS = 8
"""FFN ``--data-parallel-size 8``."""
RECIPE_STEP_TOKENS = 140_000
"""The Attention role's ``--max-num-batched-tokens``."""


@dataclass(frozen=True)
class NpuStepModel:
    """``step_s(tokens) = tokens / (tokens_per_s_per_npu * npus)``."""

    tokens_per_s_per_npu: float = CLOUDMATRIX_PREFILL_TOKENS_PER_S_PER_NPU
    npus: int = RECIPE_ATTENTION_NPUS + RECIPE_FFN_NPUS
    source: str = CLOUDMATRIX_SOURCE

    def __post_init__(self) -> None:
        if not self.tokens_per_s_per_npu > 0:
            raise ValueError(f"NpuStepModel.tokens_per_s_per_npu must be > 0, "
                             f"got {self.tokens_per_s_per_npu!r}")
        if self.npus < 1:
            raise ValueError(f"NpuStepModel.npus must be >= 1, got {self.npus!r}")

    @property
    def deployment_tokens_per_s(self) -> float:
        return self.tokens_per_s_per_npu * self.npus

    def step_s(self, num_tokens: int) -> float:
        """Modelled device time of one prefill step of ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens!r}")
        return num_tokens / self.deployment_tokens_per_s

    def to_evidence(self) -> dict:
        return {**asdict(self), "deployment_tokens_per_s": self.deployment_tokens_per_s,
                "recipe_step_tokens": RECIPE_STEP_TOKENS,
                "recipe_step_s": self.step_s(RECIPE_STEP_TOKENS),
                "form": "step_s = tokens / (tokens_per_s_per_npu * npus); no fixed term "
                        "(conservative for host-cost fractions)"}


RECIPE_NPU_STEP = NpuStepModel()
"""The recipe's 32-NPU deployment at CloudMatrix-Infer's per-NPU prefill rate."""

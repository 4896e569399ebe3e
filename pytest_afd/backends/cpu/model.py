"""DeepSeek V3.2-structured model, split into the per-layer pieces AFD places apart.

The pieces follow docs/contracts.md ("CPU model structure"): ``embed``; per layer
``attention`` (input norm, MLA with the V3.2 lightning indexer, paged latent KV,
residual), ``ffn_input`` (post-attention norm), ``route`` (gate, Attention side),
``experts`` + ``shared_experts`` (FFN side) or dense ``mlp``; ``final``. The maths
follows transformers' ``DeepseekV32ForCausalLM`` (its parity test is the check),
with one deliberate difference: the indexer breaks top-k ties by position so
that token selection does not depend on how a batch was cut.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from pytest_afd.backends.cpu.attention_geometry import (
    AttentionGeometry,
    RequestGeometry,
    sdpa_mask,
)
from pytest_afd.backends.cpu.attention_geometry import (
    row_positions as row_positions,  # re-exported: the executors import it from here
)
from pytest_afd.backends.cpu.config import GROUP_SCORE_TOP, ModelConfig
from pytest_afd.backends.cpu.kv_cache import PagedKVCache
from pytest_afd.backends.cpu.ops import (
    QUANT_NONE,
    QUANTIZATIONS,
    GroupedLinear,
    Linear,
    pad_keys,
    pad_rows,
    rms_norm,
    rope_half_split,
    rope_interleaved,
    row_linear,
    select_topk,
    swiglu,
)
from pytest_afd.backends.cpu.weights import (
    Weights,
    check_weights,
    expected_shapes,
    init_weights,
    layer_prefix,
)

ROUTING_NATURAL = "natural"
ROUTING_FORCED = "forced_balanced"
ROUTINGS = (ROUTING_NATURAL, ROUTING_FORCED)
ROUTER_DENOMINATOR_EPS = 1e-20
INDEXER_KEY_NORM_EPS = 1e-6


class DecoderLayer:
    """One decoder layer's pieces; a layer is MoE when ``index >= first_k_dense_replace``."""

    def __init__(self, config: ModelConfig, index: int, weights: Weights, quantization: str,
                 routing: str) -> None:
        c = self.config = config
        self.index = index
        self.is_moe = config.is_moe_layer(index)
        self.routing = routing
        p = layer_prefix(index)
        a = p + "self_attn."
        w = weights

        def linear(name: str) -> Linear:
            return Linear(w[name], quantization)

        self.input_norm = w[p + "input_layernorm.weight"]
        self.post_norm = w[p + "post_attention_layernorm.weight"]
        self.q_a_proj = linear(a + "q_a_proj.weight")
        self.q_a_norm = w[a + "q_a_layernorm.weight"]
        self.q_b_proj = linear(a + "q_b_proj.weight")
        self.kv_a_proj = linear(a + "kv_a_proj_with_mqa.weight")
        self.kv_a_norm = w[a + "kv_a_layernorm.weight"]
        self.kv_b_proj = linear(a + "kv_b_proj.weight")
        self.o_proj = linear(a + "o_proj.weight")
        # The indexer stays in float, as the real model keeps it out of W8A8.
        self.index_wq_b = w[a + "indexer.wq_b.weight"]
        self.index_wk = w[a + "indexer.wk.weight"]
        self.index_k_norm = (w[a + "indexer.k_norm.weight"], w[a + "indexer.k_norm.bias"])
        self.index_weights_proj = w[a + "indexer.weights_proj.weight"]
        self.scaling = c.qk_head_dim**-0.5
        self.index_scale = c.index_head_dim**-0.5
        self.index_head_weight = c.index_n_heads**-0.5
        m = p + "mlp."
        if self.is_moe:
            # The router gate stays in float32, as in the W8A8 checkpoints.
            self.gate_weight = w[m + "gate.weight"]
            self.gate_bias = w[m + "gate.e_score_correction_bias"]
            self.expert_gate_up = GroupedLinear(w[m + "experts.gate_up_proj"], quantization)
            self.expert_down = GroupedLinear(w[m + "experts.down_proj"], quantization)
            self.shared = None
            if c.n_shared_experts:
                self.shared = tuple(
                    linear(m + f"shared_experts.{n}_proj.weight") for n in ("gate", "up", "down")
                )
        else:
            self.dense = tuple(linear(m + f"{n}_proj.weight") for n in ("gate", "up", "down"))

    # ---- Attention side -------------------------------------------------
    def attention(self, hidden: torch.Tensor, metadata, kv_cache: PagedKVCache,
                  real_rows: np.ndarray | None = None,
                  geometry: AttentionGeometry | None = None) -> torch.Tensor:
        """``hidden + MLA(norm(hidden))`` over one batch's rows, reading/writing paged KV.

        ``metadata`` is an ``afd_split.checks.metadata.BatchMetadata`` for the real tokens. When
        ``real_rows`` is given, ``hidden`` holds padded rows and ``real_rows[t]``
        is token t's row: padding rows go through every projection (they cost
        like real work) but are never written to the cache and attend nothing.
        ``geometry``: what the rows and metadata alone determine, made once per forward
        for every layer (``AttentionGeometry.of(config, metadata, real_rows, rows)``);
        None derives it here.
        """
        c = self.config
        num_rows = hidden.shape[0]
        if geometry is None:
            geometry = AttentionGeometry.of(c, metadata, real_rows, num_rows)
        geometry.check_for(metadata, num_rows)
        rows, cos, sin = geometry.rows, geometry.cos, geometry.sin
        x = rms_norm(hidden, self.input_norm, c.rms_norm_eps)
        q_resid = rms_norm(self.q_a_proj(x), self.q_a_norm, c.rms_norm_eps)
        query = self.q_b_proj(q_resid).view(num_rows, c.num_attention_heads, c.qk_head_dim)
        q_nope, q_rope = query.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_a_proj(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = rms_norm(latent, self.kv_a_norm, c.rms_norm_eps)
        query = torch.cat([q_nope, rope_interleaved(q_rope, cos[:, None], sin[:, None])], dim=-1)
        k_rope = rope_interleaved(k_rope, cos, sin)
        index_key = self._index_key(x, cos, sin)
        kv_cache.write(self.index, geometry.slots, latent[rows], k_rope[rows], index_key[rows])

        index_query = index_weights = None
        if geometry.needs_index:
            index_query, index_weights = self._index_query(x, q_resid, cos, sin)
        attn_out = hidden.new_zeros((num_rows, c.num_attention_heads, c.v_head_dim))
        for request in geometry.requests:
            self._attend_request(query, request, kv_cache, index_query, index_weights, attn_out)
        return hidden + self.o_proj(attn_out.reshape(num_rows, -1))

    def _attend_request(self, query: torch.Tensor, request: RequestGeometry,
                        kv_cache: PagedKVCache, index_query: torch.Tensor | None,
                        index_weights: torch.Tensor | None, attn_out: torch.Tensor) -> None:
        """One request's query rows against its cached context (``request.context``), into
        attn_out."""
        c = self.config
        ctx = request.context
        ctx_latent, ctx_rope, ctx_index_key = kv_cache.read(self.index, ctx)
        kv = self.kv_b_proj(ctx_latent).view(len(ctx), c.num_attention_heads, -1)
        k_nope, value = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        key = torch.cat([k_nope, ctx_rope[:, None, :].expand(-1, c.num_attention_heads, -1)], -1)
        key, value = pad_keys(key).transpose(0, 1), pad_keys(value).transpose(0, 1)
        for block in request.blocks:
            block_rows, mask = block.rows, block.mask
            if mask is None:  # more than index_topk keys: this layer's indexer narrows it
                mask = sdpa_mask(self._sparse_mask(index_query[block_rows],
                                                   index_weights[block_rows],
                                                   ctx_index_key[:block.key_end], block.causal),
                                 block.key_end, block.padded_end, block.num_rows)
            block_query, num_block_rows = pad_rows(query[block_rows])
            out = F.scaled_dot_product_attention(
                block_query.transpose(0, 1), key[:, :block.padded_end],
                value[:, :block.padded_end], attn_mask=mask, scale=self.scaling,
            )
            attn_out[block_rows] = out.transpose(0, 1)[:num_block_rows]

    def _index_key(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        weight, bias = self.index_k_norm
        key = F.layer_norm(row_linear(x, self.index_wk), (c.index_head_dim,), weight, bias,
                           INDEXER_KEY_NORM_EPS)
        rot, rest = key.split([c.qk_rope_head_dim, c.index_head_dim - c.qk_rope_head_dim], dim=-1)
        return torch.cat([rope_half_split(rot, cos, sin), rest], dim=-1)

    def _index_query(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        query = row_linear(q_resid, self.index_wq_b).view(-1, c.index_n_heads, c.index_head_dim)
        rot, rest = query.split([c.qk_rope_head_dim, c.index_head_dim - c.qk_rope_head_dim], -1)
        query = torch.cat([rope_half_split(rot, cos[:, None], sin[:, None]), rest], dim=-1)
        weights = row_linear(x, self.index_weights_proj) * self.index_head_weight
        return query, weights

    def _sparse_mask(self, index_query: torch.Tensor, index_weights: torch.Tensor,
                     index_key: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        """Causal mask narrowed to the indexer's top-k keys for rows with more than k keys.

        Scores are accumulated in float64 and rounded to float32 so that they (and
        so the selection) do not depend on the GEMM shape of the batch.
        """
        c = self.config
        keys_t = index_key.double().T
        # relu(scale * s) = scale * relu(s): the scale folds into the head weights.
        head_weights = index_weights.double() * self.index_scale
        scores = torch.zeros(causal.shape, dtype=torch.float64)
        for head in range(c.index_n_heads):
            head_scores = torch.mm(index_query[:, head].double(), keys_t).clamp_(min=0)
            scores.add_(head_scores.mul_(head_weights[:, head, None]))
        scores = scores.float().masked_fill_(~causal, float("-inf"))
        sparse_rows = causal.sum(-1) > c.index_topk
        mask = causal.clone()
        mask[sparse_rows] = select_topk(scores[sparse_rows], c.index_topk)
        return mask

    def ffn_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-attention norm: what the gate reads and the FFN side receives."""
        return rms_norm(hidden, self.post_norm, self.config.rms_norm_eps)

    def route(self, normed: torch.Tensor, positions: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sigmoid scores, group-limited top-k, normalised and scaled weights.

        ``forced_balanced`` keeps the weights but assigns experts round-robin by
        token position (not by row), so it is balanced and still independent of
        how the batch is cut; its outputs are synthetic.
        """
        c = self.config
        num_rows = normed.shape[0]
        scores = row_linear(normed.float(), self.gate_weight).sigmoid()
        choice = scores + self.gate_bias
        group_scores = choice.view(num_rows, c.n_group, -1).topk(GROUP_SCORE_TOP, dim=-1).values.sum(-1)
        group_idx = group_scores.topk(c.topk_group, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0).bool()
        expert_mask = group_mask[:, :, None].expand(-1, -1, c.n_routed_experts // c.n_group)
        choice = choice.masked_fill(~expert_mask.reshape(num_rows, -1), float("-inf"))
        topk_ids = choice.topk(c.num_experts_per_tok, dim=-1, sorted=False).indices
        topk_weights = scores.gather(1, topk_ids)
        if c.norm_topk_prob:
            topk_weights = topk_weights / (topk_weights.sum(-1, keepdim=True) + ROUTER_DENOMINATOR_EPS)
        topk_weights = topk_weights * c.routed_scaling_factor
        if self.routing == ROUTING_FORCED:
            order = torch.arange(num_rows) if positions is None else positions
            slot = order[:, None] * c.num_experts_per_tok + torch.arange(c.num_experts_per_tok)
            topk_ids = slot % c.n_routed_experts
        return topk_ids, topk_weights

    # ---- FFN side ---------------------------------------------------------
    def experts(self, normed: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        """Routed experts; a token's contributions are added in ascending expert order."""
        num_experts = self.config.n_routed_experts
        k = topk_ids.shape[1]
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        experts = flat[order]
        counts = torch.bincount(flat, minlength=num_experts)
        starts = torch.cumsum(counts, 0) - counts
        slots = torch.arange(len(flat)) - starts[experts]
        tokens = order // k
        grouped = normed.new_zeros((num_experts, int(counts.max()), normed.shape[1]))
        grouped[experts, slots] = normed[tokens]
        gate, up = self.expert_gate_up(grouped).chunk(2, dim=-1)
        expert_out = self.expert_down(F.silu(gate) * up)[experts, slots]
        out = torch.zeros_like(normed)
        out.index_add_(0, tokens, expert_out * topk_weights.reshape(-1)[order, None])
        return out

    def shared_experts(self, normed: torch.Tensor) -> torch.Tensor:
        if self.shared is None:
            return torch.zeros_like(normed)
        return swiglu(self.shared, normed)

    def mlp(self, normed: torch.Tensor) -> torch.Tensor:
        """Dense MLP of the first ``first_k_dense_replace`` layers."""
        return swiglu(self.dense, normed)

    def ffn(self, hidden: torch.Tensor, positions: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """In-process composition of the FFN pieces: (hidden + ffn(norm(hidden)), topk ids)."""
        normed = self.ffn_input(hidden)
        if not self.is_moe:
            return hidden + self.mlp(normed), None
        topk_ids, topk_weights = self.route(normed, positions)
        moe = self.experts(normed, topk_ids, topk_weights) + self.shared_experts(normed)
        return hidden + moe, topk_ids



class DeepseekV32Model:
    """The whole model as pieces; ``quantization`` and ``routing`` are fixed per instance."""

    def __init__(self, config: ModelConfig, weights: Weights, *, quantization: str = QUANT_NONE,
                 routing: str = ROUTING_NATURAL) -> None:
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={quantization!r}; expected one of {QUANTIZATIONS}")
        if routing not in ROUTINGS:
            raise ValueError(f"routing={routing!r}; expected one of {ROUTINGS}")
        self.config = config
        self.weights = check_weights(config, weights)
        self.quantization = quantization
        self.routing = routing
        self.layers = [
            DecoderLayer(config, i, self.weights, quantization, routing)
            for i in range(config.num_hidden_layers)
        ]
        self._embed = self.weights["model.embed_tokens.weight"]
        self._norm = self.weights["model.norm.weight"]
        self._lm_head = self.weights["lm_head.weight"]

    def variant(self, *, quantization: str, routing: str) -> DeepseekV32Model:
        """The same weights with another precision / routing mode."""
        if quantization == self.quantization and routing == self.routing:
            return self
        return DeepseekV32Model(self.config, self.weights, quantization=quantization, routing=routing)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(input_ids, dtype=torch.int64)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            bad = int(ids.max()) if int(ids.max()) >= self.config.vocab_size else int(ids.min())
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        return F.embedding(ids, self._embed)

    def final(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head (kept in float, as W8A8 checkpoints do)."""
        return row_linear(rms_norm(hidden, self._norm, self.config.rms_norm_eps), self._lm_head)


def build_model(config: ModelConfig, seed: int = 0, *, quantization: str = QUANT_NONE,
                routing: str = ROUTING_NATURAL) -> DeepseekV32Model:
    """A model with deterministic seeded weights (see :func:`weights.init_weights`)."""
    return DeepseekV32Model(config, init_weights(config, seed), quantization=quantization,
                            routing=routing)


def num_parameters(config: ModelConfig) -> int:
    """Parameter count of a config (for the manifest)."""
    return sum(math.prod(shape) for shape in expected_shapes(config).values())

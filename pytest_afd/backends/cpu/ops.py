"""The CPU model's numeric building blocks, chosen so a row's result never depends on its batch.

Row-count-independent linear layers (plain and W8A8-emulated, per expert), RMS norm,
RoPE in both layouts, the tie-stable top-k and key padding: what lets split, chunked and
cached runs be bitwise equal to the unsplit one (see ``MIN_KERNEL_ROWS``, ``KEY_BLOCK``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from pytest_afd.backends.cpu.config import ModelConfig

QUANT_NONE = "none"
QUANT_W8A8 = "w8a8"
QUANTIZATIONS = (QUANT_NONE, QUANT_W8A8)

INT8_MAX = 127.0
# Smallest scale a zero row/channel is quantized with (avoids 0/0).
MIN_QUANT_SCALE = 1e-12
# Query rows attended per block: bounds the score matrix and skips the
# causally masked half of long prefills.
QUERY_BLOCK = 512
# CPU GEMM / attention kernels take another code path (other rounding) for
# few rows: below 4 rows, and with 2 or 8 threads also for 5-7 and 9-11 rows
# (measured, torch 2.13). Padding to this keeps every row's result independent
# of how many rows share the call, so split, chunked and cached runs are
# bitwise equal to the unsplit one (which keeps W8A8 rounding decisions equal).
MIN_KERNEL_ROWS = 16
# CPU attention rounds differently for some key lengths; attending over a
# multiple of this many keys (zero keys masked out) keeps a query row's result
# independent of how much context its block happens to span.
KEY_BLOCK = 512


def pad_rows(x: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, int]:
    """``x`` with zero rows appended along ``dim`` up to MIN_KERNEL_ROWS, and its real row count."""
    rows = x.shape[dim]
    if rows >= MIN_KERNEL_ROWS:
        return x, rows
    pad_shape = list(x.shape)
    pad_shape[dim] = MIN_KERNEL_ROWS - rows
    return torch.cat([x, x.new_zeros(pad_shape)], dim=dim), rows


def row_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear`` whose per-row result does not depend on the row count."""
    padded, rows = pad_rows(x)
    return F.linear(padded, weight)[:rows]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of the last dim (values kept as integral float32)."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(MIN_QUANT_SCALE) / INT8_MAX
    return torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX), scale


class Linear:
    """``y = x W^T``, or its W8A8 emulation: int8 per-output-channel weights and
    dynamic per-token int8 activations, integer products accumulated exactly in
    float32 (exact while in_features * 127**2 < 2**24), then rescaled."""

    def __init__(self, weight: torch.Tensor, quantization: str = QUANT_NONE) -> None:
        self.weight = weight
        self.quantized = quantization == QUANT_W8A8
        if self.quantized:
            self.qweight, scale = quantize_rows(weight)
            self.weight_scale = scale.squeeze(-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return row_linear(x, self.weight)
        qx, x_scale = quantize_rows(x)
        return row_linear(qx, self.qweight) * x_scale * self.weight_scale


class GroupedLinear:
    """One :class:`Linear` per expert, applied to every expert's rows in one batched matmul.

    ``weight`` is [experts, out, in]; inputs are [experts, rows, in] (rows padded
    to the busiest expert). Quantization is per expert and output channel.
    """

    def __init__(self, weight: torch.Tensor, quantization: str = QUANT_NONE) -> None:
        self.weight_t = weight.transpose(1, 2)
        self.quantized = quantization == QUANT_W8A8
        if self.quantized:
            qweight, scale = quantize_rows(weight)
            self.qweight_t = qweight.transpose(1, 2)
            self.weight_scale = scale.transpose(1, 2)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        padded, rows = pad_rows(x, dim=1)
        if not self.quantized:
            return torch.bmm(padded, self.weight_t)[:, :rows]
        qx, x_scale = quantize_rows(padded)
        return (torch.bmm(qx, self.qweight_t) * x_scale * self.weight_scale)[:, :rows]


def rope_tables(config: ModelConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of each position's rotary angles, shape [N, qk_rope_head_dim / 2]."""
    dim = config.qk_rope_head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """MLA's RoPE on interleaved pairs; output in half-split layout (as transformers)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The indexer's non-interleaved (rotate-half) RoPE; ``cos``/``sin`` hold one angle per pair."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def select_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the top ``k`` per row: higher score first, then lower position.

    ``torch.topk`` breaks exact ties differently for different shapes, and the
    indexer's ReLU scores tie often; this rule makes the selection of a row a
    function of its scores alone, whatever batch it was computed in.
    """
    kth = scores.topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    above = scores > kth
    ties = scores == kth
    tie_budget = k - above.sum(-1, keepdim=True)
    return above | (ties & (ties.cumsum(-1) <= tie_budget))

def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pad_keys(keys: torch.Tensor) -> torch.Tensor:
    """Zero keys appended up to a multiple of KEY_BLOCK (always masked out)."""
    extra = round_up(len(keys), KEY_BLOCK) - len(keys)
    return F.pad(keys, (0, 0, 0, 0, 0, extra)) if extra else keys


def swiglu(projections: Sequence[Linear], x: torch.Tensor) -> torch.Tensor:
    gate, up, down = projections
    return down(F.silu(gate(x)) * up(x))


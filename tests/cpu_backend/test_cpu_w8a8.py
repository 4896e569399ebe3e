"""W8A8 emulation: int8 grids, per-channel / per-token scales, exact integer products."""

import torch

from pytest_afd.backends.cpu import Linear
from pytest_afd.backends.cpu.ops import INT8_MAX, GroupedLinear, quantize_rows


def test_quantize_rows_is_symmetric_int8_per_row():
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]])
    q, scale = quantize_rows(x)
    assert torch.equal(q[0], torch.tensor([64.0, -127.0, 32.0]))
    assert torch.equal(q[1], torch.zeros(3))
    assert scale[0, 0] == 1.0 / INT8_MAX


def test_w8a8_linear_error_is_bounded_by_the_grids():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=generator) / 8
    x = torch.randn(20, 64, generator=generator)
    exact = Linear(weight)(x)
    quant = Linear(weight, "w8a8")(x)
    assert not torch.equal(exact, quant)
    # |x w - qx qw| <= sum |x||dw| + |dx||w| + |dx||dw|, each delta at most half a step.
    dx = x.abs().amax(-1, keepdim=True) / INT8_MAX / 2
    dw = weight.abs().amax(-1) / INT8_MAX / 2
    bound = x.abs() @ (dw[:, None].expand_as(weight)).T + dx * weight.abs().sum(-1) + dx * dw * 64
    assert ((exact - quant).abs() <= bound * 1.001 + 1e-6).all()


def test_grouped_linear_equals_per_expert_linear():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(4, 16, 32, generator=generator)
    x = torch.randn(4, 5, 32, generator=generator)
    for mode in ("none", "w8a8"):
        grouped = GroupedLinear(weight, mode)(x)
        single = torch.stack([Linear(weight[e], mode)(x[e]) for e in range(4)])
        torch.testing.assert_close(grouped, single)

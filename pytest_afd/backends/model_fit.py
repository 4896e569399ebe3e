"""Does a topology fit the model? Routed experts over the EP ranks, attention heads over TP.

One check for the pytest session (at start-up, a usage error before any test
runs) and ``afd-launch-plan`` (a plan error), so both refuse the same layouts
with the same words. A topology the check passes still has its own rules
(:mod:`pytest_afd.topology.spec`); this is only about the model's sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_afd.topology.spec import RolePart, Topology

# DeepSeek V3.2 (Hugging Face ``DeepseekV32Config``: ``n_routed_experts``,
# ``num_attention_heads``): what the recipe deploys on NPUs.
DEEPSEEK_V3_2_ROUTED_EXPERTS = 256
DEEPSEEK_V3_2_ATTENTION_HEADS = 128
CPU_BACKEND = "cpu"


@dataclass(frozen=True)
class ModelShape:
    """The model sizes a layout has to divide."""

    name: str
    routed_experts: int
    attention_heads: int | None  # None: heads not sharded (the CPU model emulates TP)


DEEPSEEK_V3_2 = ModelShape("DeepSeek V3.2", DEEPSEEK_V3_2_ROUTED_EXPERTS,
                           DEEPSEEK_V3_2_ATTENTION_HEADS)


def attention_tp(part: RolePart) -> int:
    """The TP width the attention heads are sharded over (sp shares the TP group)."""
    return max(part.size("tp"), part.size("sp"))


def experts_error(shape: ModelShape, ep_ranks: int, where: str) -> str | None:
    if shape.routed_experts % ep_ranks:
        return (f"{where}: {shape.name}'s {shape.routed_experts} routed experts cannot be spread "
                f"evenly over {ep_ranks} EP ranks")
    return None


def heads_error(shape: ModelShape, tp: int, where: str) -> str | None:
    if shape.attention_heads is not None and shape.attention_heads % tp:
        return (f"{where}: {shape.name}'s {shape.attention_heads} attention heads cannot be "
                f"sharded evenly over tp{tp}")
    return None


def fit_errors(topology: Topology, shapes: tuple[ModelShape, ...]) -> list[str]:
    """Every way ``topology`` does not fit one of ``shapes`` (empty when it fits)."""
    ep_where = f"{topology.canonical} ({(topology.ffn or topology.attention).spec!r})"
    tp_where = f"{topology.canonical} ({topology.attention.spec!r})"
    found = []
    for shape in shapes:
        found += [experts_error(shape, topology.num_ep_ranks, ep_where),
                  heads_error(shape, attention_tp(topology.attention), tp_where)]
    return list(dict.fromkeys(error for error in found if error is not None))


def session_shapes(backend_name: str, model_name: str) -> tuple[ModelShape, ...]:
    """The shapes a session's topology must fit.

    The CPU backend spreads its own small model's experts over the EP ranks
    (expert accounting, the AFD runtime's FFN ranks) and stands in for a DeepSeek
    V3.2 deployment of the same topology, so both count; other backends run
    DeepSeek V3.2.
    """
    if backend_name != CPU_BACKEND:
        return (DEEPSEEK_V3_2,)
    from pytest_afd.backends.cpu.config import parse_model_name

    config = parse_model_name(model_name)
    cpu_model = ModelShape(f"the CPU model ({model_name})", config.n_routed_experts, None)
    return (cpu_model, DEEPSEEK_V3_2)

"""A parsed NPU topology: role parts, rank counts, the rank layout and the CPU emulation.

Parsing the topology string (grammar, limits, aliases) is :mod:`pytest_afd.topology.spec`,
which re-exports these names; see its docstring for how ranks are counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DIMS = ("dp", "pcp", "dcp", "cp", "tp", "sp", "pp", "ep")
GROUP_DIMS = ("tp", "cp", "sp", "dcp")

# Atlas 800 A2 / A3 nodes carry 8 NPUs; override with --afd-devices-per-node.
DEFAULT_DEVICES_PER_NODE = 8
# The CPU AFD runtime runs one Attention process and one FFN process.
CPU_ATTENTION_PROCESSES = 1
CPU_FFN_PROCESSES = 1


class TopologyError(ValueError):
    """A topology string (or alias file) is malformed; the message names the offending token."""


@dataclass(frozen=True)
class RolePart:
    """One role's parallel dims (the Attention or the FFN side)."""

    spec: str
    dims: Mapping[str, int]

    def size(self, dim: str) -> int:
        return self.dims.get(dim, 1)

    @property
    def group(self) -> int:
        """Intra-stage device group shared by tp/cp/sp/dcp."""
        return max(self.size(d) for d in GROUP_DIMS)

    @property
    def width(self) -> int:
        """Ranks per pipeline stage."""
        dense = self.size("dp") * self.size("pcp") * self.group
        return self.size("ep") if dense == 1 else dense

    @property
    def ranks(self) -> int:
        return self.size("pp") * self.width

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "dims": dict(self.dims), "ranks": self.ranks}


@dataclass(frozen=True)
class RankInfo:
    """Where one global rank lives and its indices inside its role."""

    rank: int
    node: int
    device: int
    role: str  # "attention", "ffn" or "colocated"
    dp: int
    pcp: int
    pp: int
    group: int  # index inside the tp/cp/sp group
    ep: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CpuEmulation:
    """How the CPU backend scales a topology down (recorded in the manifest).

    The arithmetic that shapes a split is kept exact (SP/TP alignment unit, PCP
    padding, number of EP ranks for per-rank expert accounting); the device
    count is not: one Attention DP replica runs in one process and, for an AFD
    topology, all FFN ranks run in one FFN process.
    """

    split_align: int
    pcp_size: int
    num_ep_ranks: int
    attention_processes: int
    ffn_processes: int
    note: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Topology:
    spec: str
    attention: RolePart
    ffn: RolePart | None
    alias: str | None = None

    @property
    def is_afd(self) -> bool:
        return self.ffn is not None

    @property
    def canonical(self) -> str:
        return "-".join(part.spec for part in self.parts)

    @property
    def parts(self) -> tuple[RolePart, ...]:
        return (self.attention,) if self.ffn is None else (self.attention, self.ffn)

    @property
    def attention_ranks(self) -> int:
        return self.attention.ranks

    @property
    def ffn_ranks(self) -> int:
        """FFN ranks on their own devices (0 when FFN is co-located with Attention)."""
        return 0 if self.ffn is None else self.ffn.ranks

    @property
    def total_ranks(self) -> int:
        return self.attention_ranks + self.ffn_ranks

    @property
    def devices_needed(self) -> int:
        return self.total_ranks

    @property
    def attention_ffn_ratio(self) -> float | None:
        """Attention ranks per FFN rank (``dp3pcp8-ep8`` → 3.0); None when not AFD."""
        return None if self.ffn is None else self.attention_ranks / self.ffn_ranks

    @property
    def ratio_label(self) -> str:
        if self.ffn is None:
            return "co-located"
        common = math.gcd(self.attention_ranks, self.ffn_ranks)
        return f"{self.attention_ranks // common}:{self.ffn_ranks // common}"

    @property
    def num_ep_ranks(self) -> int:
        """EP ranks the routed experts are spread over (the FFN part's for AFD)."""
        return (self.ffn or self.attention).size("ep")

    def nodes_needed(self, devices_per_node: int = DEFAULT_DEVICES_PER_NODE) -> int:
        if devices_per_node < 1:
            raise ValueError(f"devices_per_node={devices_per_node}; expected >= 1")
        return math.ceil(self.devices_needed / devices_per_node)

    def rank_layout(self, devices_per_node: int = DEFAULT_DEVICES_PER_NODE) -> list[RankInfo]:
        """Global ranks, Attention first then FFN, packed onto nodes in rank order.

        Inside a part the layout is ``[pp][dp][pcp][group]`` with the group
        fastest (vLLM's world-rank order); ``ep`` is the local index modulo ep.
        """
        if devices_per_node < 1:
            raise ValueError(f"devices_per_node={devices_per_node}; expected >= 1")
        layout = []
        roles = ("colocated",) if self.ffn is None else ("attention", "ffn")
        offset = 0
        for role, part in zip(roles, self.parts, strict=True):
            for local in range(part.ranks):
                rank = offset + local
                layout.append(
                    RankInfo(
                        rank=rank,
                        node=rank // devices_per_node,
                        device=rank % devices_per_node,
                        role=role,
                        **_part_indices(part, local),
                    )
                )
            offset += part.ranks
        return layout

    def cpu_emulation(self) -> CpuEmulation:
        """The documented scaled-down CPU mapping of this topology."""
        split_align = max(self.attention.size("tp"), self.attention.size("sp"))
        pcp_size = self.attention.size("pcp")
        ffn_processes = CPU_FFN_PROCESSES if self.is_afd else 0
        role_note = (
            f"{CPU_ATTENTION_PROCESSES} Attention process + {ffn_processes} FFN process stand for "
            f"{self.attention_ranks} Attention + {self.ffn_ranks} FFN ranks"
            if self.is_afd
            else f"{CPU_ATTENTION_PROCESSES} co-located process stands for {self.attention_ranks} ranks"
        )
        pcp_rows = (f", each split stage's rows laid out over {pcp_size} emulated PCP ranks by "
                    "afd_split's stage-PCP zigzag and restored" if pcp_size > 1 else "")
        note = (
            f"{self.canonical} emulated on CPU: one DP replica (dp{self.attention.size('dp')} -> 1), "
            f"{role_note}; split alignment {split_align} (TP/SP unit) and PCP padding 2*{pcp_size} "
            f"kept exact{pcp_rows}; expert load accounted over {self.num_ep_ranks} EP ranks; "
            f"pp{self.attention.size('pp')} stages run in sequence in one process"
        )
        return CpuEmulation(
            split_align=split_align,
            pcp_size=pcp_size,
            num_ep_ranks=self.num_ep_ranks,
            attention_processes=CPU_ATTENTION_PROCESSES,
            ffn_processes=ffn_processes,
            note=note,
        )

    def to_json(self, devices_per_node: int = DEFAULT_DEVICES_PER_NODE) -> dict[str, Any]:
        """The manifest's ``topology`` object (without ``cpu_emulation``, which the caller decides)."""
        return {
            "spec": self.spec,
            "alias": self.alias,
            "canonical": self.canonical,
            "is_afd": self.is_afd,
            "attention": self.attention.to_json(),
            "ffn": self.ffn.to_json() if self.ffn is not None else None,
            "attention_ffn_ratio": self.attention_ffn_ratio,
            "ratio_label": self.ratio_label,
            "total_ranks": self.total_ranks,
            "rank_mapping": [r.to_json() for r in self.rank_layout(devices_per_node)],
        }

    def __str__(self) -> str:
        return self.canonical


def _part_indices(part: RolePart, local: int) -> dict[str, int]:
    group = part.group
    pcp = part.size("pcp")
    dp = part.size("dp")
    ep_index = local % part.size("ep")
    if part.width == part.size("ep") and dp * pcp * group == 1:
        # An ep-only part: one expert shard per rank.
        return {"pp": local // part.width, "dp": 0, "pcp": 0, "group": 0, "ep": ep_index}
    within_stage = local % part.width
    return {
        "pp": local // part.width,
        "dp": within_stage // (pcp * group),
        "pcp": (within_stage // group) % pcp,
        "group": within_stage % group,
        "ep": ep_index,
    }


"""NPU topology strings: grammar, rank counts, rank layout and the CPU emulation.

Grammar (case-insensitive, see ``docs/topology.md``)::

    topology  := part [ "-" part ]          # a second part makes it AFD: attention-ffn
    part      := ( dim size )+              # each dim at most once per part
    dim       := dp | pcp | dcp | cp | tp | sp | pp | ep
    size      := positive integer without leading zeros (ASCII digits)

A topology may use at most ``MAX_TOTAL_RANKS`` ranks (Attention + FFN), so a
typo such as ``dp99999999999`` is a clear error instead of a rank layout that
never finishes.

Rank counting, per part: ``ranks = pp * width`` with
``width = dp * pcp * group`` where ``group = max(tp, cp, sp, dcp)`` is the
intra-stage device group those dims share (each must divide it: ``cp8tp8`` is
Attention-CP8 then MoE-TP8 on the same 8 devices). ``ep`` lays the experts over
the part's ranks and must divide ``dp * pcp * group``; a part made of ``ep``
alone (an FFN part such as ``ep8``) has ``ep`` ranks. One rank per device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

DIMS = ("dp", "pcp", "dcp", "cp", "tp", "sp", "pp", "ep")
GROUP_DIMS = ("tp", "cp", "sp", "dcp")
GRAMMAR = (
    "<attention>[-<ffn>], each part a run of <dim><size> with dim in "
    "dp|pcp|dcp|cp|tp|sp|pp|ep (each at most once, case-insensitive) and size a positive integer, "
    "e.g. dp3pcp8-ep8, dp4pcp8, pp2cp8tp8, dp32ep32"
)
# Longest names first so "pcp"/"dcp" win over "cp" and "pp".
# ASCII digits only: str.isdigit and \\d also accept e.g. Arabic-Indic digits.
_DIM_PATTERN = re.compile(r"(pcp|dcp|dp|cp|tp|sp|pp|ep)([0-9]*)")
_WORD_PATTERN = re.compile(r"[a-z]+[0-9]*")
MAX_PARTS = 2
# 1,024 nodes of 8 NPUs: far past any AFD deployment studied, small enough
# that the per-rank manifest mapping stays cheap to build and to write.
MAX_TOTAL_RANKS = 8192
# A size needs at most as many digits as MAX_TOTAL_RANKS (checked before int()).
MAX_SIZE_DIGITS = len(str(MAX_TOTAL_RANKS))
# Longer strings are refused before parsing (and quoted shortened in the error).
MAX_SPEC_CHARS = 128
# Atlas 800 A2 / A3 nodes carry 8 NPUs; override with --afd-devices-per-node.
DEFAULT_DEVICES_PER_NODE = 8
# The DeepSeek V3.2 CAM async recipe's AFD layout: the CPU backend's default.
DEFAULT_CPU_TOPOLOGY = "dp3pcp8-ep8"
BUILTIN_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "recipe": "dp3pcp8-ep8",
        "recipe-afd": "dp3pcp8-ep8",
        "recipe-baseline": "dp4pcp8",
        "pp2-prefill": "pp2cp8tp8",
        "pp4-prefill": "pp4cp8tp8",
        "dp32-ep32": "dp32ep32",
    }
)
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


def _parse_part(text: str, whole: str, role: str) -> RolePart:
    if not text:
        raise TopologyError(f"topology {whole!r}: the {role} part is empty; expected {GRAMMAR}")
    dims: dict[str, int] = {}
    position = 0
    while position < len(text):
        match = _DIM_PATTERN.match(text, position)
        if match is None:
            word = _WORD_PATTERN.match(text, position)
            token = word.group(0) if word else text[position]
            raise TopologyError(
                f"topology {whole!r}: unknown token {token!r} in the {role} part {text!r}; expected {GRAMMAR}"
            )
        dim, size_text = match.group(1), match.group(2)
        token = match.group(0)
        if not size_text:
            raise TopologyError(
                f"topology {whole!r}: token {token!r} has no size (write e.g. {dim}8); expected {GRAMMAR}"
            )
        if size_text.startswith("0"):
            raise TopologyError(
                f"topology {whole!r}: token {token!r} needs a positive size without leading zeros"
            )
        if dim in dims:
            raise TopologyError(
                f"topology {whole!r}: dim {dim!r} repeated in token {token!r} of {text!r}"
            )
        if len(size_text) > MAX_SIZE_DIGITS:
            raise TopologyError(
                f"topology {whole!r}: token {token!r} has a {len(size_text)}-digit size; "
                f"a topology has at most {MAX_TOTAL_RANKS} ranks"
            )
        dims[dim] = int(size_text)
        position = match.end()
    part = RolePart(spec="".join(f"{d}{s}" for d, s in dims.items()), dims=MappingProxyType(dims))
    _check_part(part, whole)
    return part


def _check_part(part: RolePart, whole: str) -> None:
    for dim in GROUP_DIMS:
        if part.group % part.size(dim):
            raise TopologyError(
                f"topology {whole!r}: {dim}{part.size(dim)} does not divide the {part.group}-device "
                f"tp/cp/sp/dcp group of {part.spec!r}"
            )
    dense = part.size("dp") * part.size("pcp") * part.group
    if dense > 1 and dense % part.size("ep"):
        raise TopologyError(
            f"topology {whole!r}: ep{part.size('ep')} does not divide the {dense} ranks per stage of {part.spec!r}"
        )


def parse_topology(spec: str, aliases: Mapping[str, str] | None = None) -> Topology:
    """Parse ``spec`` (a topology string or an alias name) into a :class:`Topology`."""
    if not isinstance(spec, str):
        raise TopologyError(f"topology must be a string, got {type(spec).__name__} {spec!r}")
    text = spec.strip().lower()
    alias_table = {**BUILTIN_ALIASES, **{k.lower(): v for k, v in (aliases or {}).items()}}
    alias = None
    if text in alias_table:
        alias, text = text, alias_table[text].strip().lower()
    if not text:
        raise TopologyError(f"topology {spec!r} is empty; expected {GRAMMAR}")
    if len(text) > MAX_SPEC_CHARS:
        raise TopologyError(
            f"topology {spec[:40]!r}... is {len(text)} characters long; at most {MAX_SPEC_CHARS} "
            f"(a topology has at most {MAX_TOTAL_RANKS} ranks)"
        )
    if not text.isascii():
        odd = next(char for char in text if not char.isascii())
        raise TopologyError(
            f"topology {spec!r} contains the non-ASCII character {odd!r} (U+{ord(odd):04X}); "
            f"sizes are ASCII digits 0-9: {GRAMMAR}"
        )
    if re.search(r"\s", text):
        raise TopologyError(f"topology {spec!r} contains whitespace; expected {GRAMMAR}")
    parts = text.split("-")
    if len(parts) > MAX_PARTS:
        raise TopologyError(
            f"topology {spec!r} has {len(parts)} parts ({parts[2]!r} is extra); at most attention-ffn: {GRAMMAR}"
        )
    attention = _parse_part(parts[0], spec, "attention")
    ffn = _parse_part(parts[1], spec, "ffn") if len(parts) == MAX_PARTS else None
    topology = Topology(spec=spec, attention=attention, ffn=ffn, alias=alias)
    if topology.total_ranks > MAX_TOTAL_RANKS:
        raise TopologyError(
            f"topology {spec!r} needs {topology.total_ranks} ranks ({topology.attention_ranks} "
            f"attention + {topology.ffn_ranks} ffn); at most {MAX_TOTAL_RANKS} are supported"
        )
    return topology


def load_aliases(path: str | Path) -> dict[str, str]:
    """Read ``{alias: topology}`` from a YAML file (top-level mapping or under ``aliases:``).

    Every alias target is parsed now so a bad file fails at startup, naming the alias.
    """
    file = Path(path)
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TopologyError(f"topology alias file {file} does not exist") from exc
    except IsADirectoryError as exc:
        raise TopologyError(f"topology alias file {file} is a directory, not a YAML file") from exc
    except UnicodeDecodeError as exc:
        raise TopologyError(
            f"topology alias file {file} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from exc
    except OSError as exc:
        raise TopologyError(f"topology alias file {file} cannot be read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise TopologyError(f"topology alias file {file} is not valid YAML: {exc}") from exc
    if isinstance(loaded, Mapping) and set(loaded) == {"aliases"}:
        loaded = loaded["aliases"]
    if not isinstance(loaded, Mapping):
        raise TopologyError(
            f"topology alias file {file}: expected a mapping of alias -> topology, got {type(loaded).__name__}"
        )
    aliases = {}
    for name, target in loaded.items():
        if not isinstance(name, str) or not isinstance(target, str):
            raise TopologyError(
                f"topology alias file {file}: entry {name!r}: {target!r} must map a string to a string"
            )
        try:
            parse_topology(target)
        except TopologyError as exc:
            raise TopologyError(f"topology alias file {file}: alias {name!r}: {exc}") from exc
        aliases[name.lower()] = target
    return aliases

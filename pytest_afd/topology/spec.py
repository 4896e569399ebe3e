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

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import yaml

from pytest_afd.topology.layout import (
    CPU_ATTENTION_PROCESSES,
    CPU_FFN_PROCESSES,
    DEFAULT_DEVICES_PER_NODE,
    DIMS,
    GROUP_DIMS,
    CpuEmulation,
    RankInfo,
    RolePart,
    Topology,
    TopologyError,
)

__all__ = [
    "BUILTIN_ALIASES",
    "CPU_ATTENTION_PROCESSES",
    "CPU_FFN_PROCESSES",
    "DEFAULT_CPU_TOPOLOGY",
    "DEFAULT_DEVICES_PER_NODE",
    "DIMS",
    "GRAMMAR",
    "GROUP_DIMS",
    "MAX_TOTAL_RANKS",
    "CpuEmulation",
    "RankInfo",
    "RolePart",
    "Topology",
    "TopologyError",
    "afd_suggestion",
    "load_aliases",
    "parse_topology",
]

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


def afd_suggestion(topology: Topology, aliases: Mapping[str, str] | None = None) -> str | None:
    """The AFD layout a co-located ``topology`` is one ``-`` away from, when it looks meant.

    ``dp3pcp8ep8`` is grammatical (24 co-located ranks, experts over 8 of them), so
    refusing it would refuse a valid layout; but with the dash lost it silently runs
    a non-AFD layout. Suggested when inserting ``-`` between two dims gives a valid
    AFD topology that is a known layout (an alias target with an FFN part), or whose
    FFN part is ``ep`` alone while the co-located ``ep`` spans fewer ranks than the
    part has per stage (a lost dash's signature; ``dp32ep32``, co-located EP over
    every rank, is left alone). None otherwise.
    """
    if topology.is_afd:
        return None
    part = topology.attention
    tokens = [f"{dim}{size}" for dim, size in part.dims.items()]
    targets = {**BUILTIN_ALIASES, **(aliases or {})}.values()
    known = set()
    for target in targets:
        try:
            parsed = parse_topology(target)
        except TopologyError:
            continue
        if parsed.is_afd:
            known.add(parsed.canonical)
    per_stage = part.size("dp") * part.size("pcp") * part.group
    for cut in range(1, len(tokens)):
        try:
            candidate = parse_topology(f"{''.join(tokens[:cut])}-{''.join(tokens[cut:])}")
        except TopologyError:
            continue
        if not candidate.is_afd:  # the text is an alias name (``dp32-ep32``: co-located)
            continue
        lost_dash = set(candidate.ffn.dims) == {"ep"} and part.size("ep") < per_stage
        if candidate.canonical in known or lost_dash:
            return candidate.canonical
    return None


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

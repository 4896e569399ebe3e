"""Topology grammar, rank counts, layout, aliases and the CPU emulation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_afd.topology.spec import (
    DEFAULT_CPU_TOPOLOGY,
    MAX_TOTAL_RANKS,
    TopologyError,
    load_aliases,
    parse_topology,
)

# (spec, attention ranks, ffn ranks, is_afd, ratio, nodes of 8)
SEED_TOPOLOGIES = [
    ("dp3pcp8-ep8", 24, 8, True, 3.0, 4),
    ("dp4pcp8", 32, 0, False, None, 4),
    ("pp2cp8tp8", 16, 0, False, None, 2),
    ("pp4cp8tp8", 32, 0, False, None, 4),
    ("dp32ep32", 32, 0, False, None, 4),
    ("dp16ep16", 16, 0, False, None, 2),
    ("tp8", 8, 0, False, None, 1),
    ("pp2tp8", 16, 0, False, None, 2),
]


@pytest.mark.parametrize(("spec", "attn", "ffn", "afd", "ratio", "nodes"), SEED_TOPOLOGIES)
def test_plugin_seed_topologies(spec, attn, ffn, afd, ratio, nodes):
    topo = parse_topology(spec)
    assert topo.attention_ranks == attn
    assert topo.ffn_ranks == ffn
    assert topo.is_afd is afd
    assert topo.attention_ffn_ratio == ratio
    assert topo.devices_needed == attn + ffn
    assert topo.nodes_needed(8) == nodes
    assert len(topo.rank_layout(8)) == attn + ffn


def test_plugin_topology_case_insensitive_and_canonical():
    topo = parse_topology("  DP3PCP8-EP8 ")
    assert topo.canonical == "dp3pcp8-ep8"
    assert topo.ratio_label == "3:1"
    assert topo.nodes_needed(16) == 2


MALFORMED = [
    ("", "empty"),
    ("dp", "'dp' has no size"),
    ("dp0pcp8", "'dp0'"),
    ("dp03", "'dp03'"),
    ("xp3", "'xp3'"),
    ("dp3pcp8-ep8-tp2", "'tp2' is extra"),
    ("-ep8", "attention part is empty"),
    ("dp3-", "ffn part is empty"),
    ("dp2dp4", "'dp4'"),
    ("dp3 pcp8", "whitespace"),
    ("dp3pcp8_ep8", "'_'"),
    ("tp8cp3", "cp3 does not divide"),
    ("dp3ep8", "ep8 does not divide"),
    ("3dp", "'3'"),
    ("dp3pcp8-ep", "'ep' has no size"),
]


@pytest.mark.parametrize(("spec", "needle"), MALFORMED)
def test_plugin_malformed_topology_names_the_token(spec, needle):
    with pytest.raises(TopologyError) as info:
        parse_topology(spec)
    assert needle in str(info.value)


def test_plugin_unknown_token_message_shows_grammar():
    with pytest.raises(TopologyError, match=r"unknown token 'zz4'.*<attention>\[-<ffn>\]"):
        parse_topology("dp2zz4")


def test_plugin_non_string_topology():
    with pytest.raises(TopologyError, match="must be a string"):
        parse_topology(32)


def test_plugin_rank_layout_afd():
    topo = parse_topology("dp3pcp8-ep8")
    layout = topo.rank_layout(8)
    attention = [r for r in layout if r.role == "attention"]
    ffn = [r for r in layout if r.role == "ffn"]
    assert len(attention) == 24 and len(ffn) == 8
    assert [r.rank for r in layout] == list(range(32))
    # pcp fastest (tp group is 1), then dp.
    assert (attention[9].dp, attention[9].pcp) == (1, 1)
    assert {r.dp for r in attention} == {0, 1, 2}
    assert [r.ep for r in ffn] == list(range(8))
    assert {r.node for r in ffn} == {3}
    assert (layout[10].node, layout[10].device) == (1, 2)


def test_plugin_rank_layout_pp_and_group():
    layout = parse_topology("pp2cp8tp8").rank_layout(8)
    assert {r.role for r in layout} == {"colocated"}
    assert [r.pp for r in layout] == [0] * 8 + [1] * 8
    assert [r.group for r in layout[:8]] == list(range(8))
    assert layout[15].node == 1


def test_plugin_rank_layout_rejects_bad_devices_per_node():
    with pytest.raises(ValueError, match="devices_per_node=0"):
        parse_topology("dp4pcp8").rank_layout(0)


def test_plugin_cpu_emulation_of_default_topology():
    topo = parse_topology(DEFAULT_CPU_TOPOLOGY)
    emu = topo.cpu_emulation()
    assert (emu.split_align, emu.pcp_size, emu.num_ep_ranks) == (1, 8, 8)
    assert (emu.attention_processes, emu.ffn_processes) == (1, 1)
    assert "dp3 -> 1" in emu.note and "24 Attention + 8 FFN" in emu.note


def test_plugin_cpu_emulation_non_afd_and_tp():
    emu = parse_topology("pp2cp8tp8").cpu_emulation()
    assert emu.split_align == 8 and emu.ffn_processes == 0
    assert parse_topology("dp32ep32").cpu_emulation().num_ep_ranks == 32
    assert parse_topology("tp4sp4").cpu_emulation().split_align == 4


def test_plugin_builtin_and_file_aliases(tmp_path):
    assert parse_topology("recipe").canonical == "dp3pcp8-ep8"
    assert parse_topology("recipe").alias == "recipe"
    path = tmp_path / "aliases.yaml"
    path.write_text("aliases:\n  small: dp2pcp2-ep2\n  Big: dp4pcp8\n")
    aliases = load_aliases(path)
    assert parse_topology("small", aliases).total_ranks == 6
    assert parse_topology("BIG", aliases).total_ranks == 32


def test_plugin_bad_alias_file_names_alias(tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("broken: dp3xx2\n")
    with pytest.raises(TopologyError, match=r"alias 'broken'.*'xx2'"):
        load_aliases(path)
    path.write_text("- not\n- a mapping\n")
    with pytest.raises(TopologyError, match="expected a mapping"):
        load_aliases(path)
    with pytest.raises(TopologyError, match="does not exist"):
        load_aliases(tmp_path / "missing.yaml")


# --- properties -------------------------------------------------------------------------------

SIZES = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def valid_parts(draw):
    group = draw(st.sampled_from([1, 2, 4, 8]))
    dims = {"dp": draw(SIZES), "pcp": draw(SIZES), "pp": draw(st.sampled_from([1, 2, 4]))}
    for dim in ("tp", "cp", "sp", "dcp"):
        if draw(st.booleans()):
            dims[dim] = draw(st.sampled_from([d for d in (1, 2, 4, 8) if group % d == 0]))
    dims["tp"] = group if "tp" not in dims and group > 1 else dims.get("tp", 1)
    dense = dims["dp"] * dims["pcp"] * max(dims.get(d, 1) for d in ("tp", "cp", "sp", "dcp"))
    dims["ep"] = draw(st.sampled_from([d for d in range(1, dense + 1) if dense % d == 0]))
    keep = {d: s for d, s in dims.items() if s > 1 or d == "dp"}
    order = draw(st.permutations(list(keep)))
    return {d: keep[d] for d in order}


def render(dims, upper):
    text = "".join(f"{d}{s}" for d, s in dims.items())
    return text.upper() if upper else text


@settings(max_examples=60, deadline=None)
@given(attention=valid_parts(), ffn=st.one_of(st.none(), st.sampled_from([1, 2, 4, 8, 16])),
       upper=st.booleans())
def test_plugin_property_valid_topologies_parse_and_count(attention, ffn, upper):
    spec = render(attention, upper) + ("" if ffn is None else f"-ep{ffn}")
    topo = parse_topology(spec)
    group = max(attention.get(d, 1) for d in ("tp", "cp", "sp", "dcp"))
    expected = attention.get("pp", 1) * attention["dp"] * attention.get("pcp", 1) * group
    assert topo.attention_ranks == expected
    assert topo.ffn_ranks == (0 if ffn is None else ffn)
    assert parse_topology(topo.canonical).canonical == topo.canonical
    layout = topo.rank_layout(8)
    assert [r.rank for r in layout] == list(range(topo.total_ranks))
    assert len({(r.node, r.device) for r in layout}) == topo.total_ranks


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="dpcteso0123456789-_ xP", max_size=16))
def test_plugin_property_arbitrary_strings_parse_or_raise_topology_error(text):
    try:
        topo = parse_topology(text)
    except TopologyError as exc:
        assert "topology" in str(exc)
    else:
        assert topo.total_ranks >= 1


def test_plugin_rank_count_is_bounded_with_a_clear_error():
    assert parse_topology("dp1024pcp8").total_ranks == MAX_TOTAL_RANKS  # the limit itself parses
    assert parse_topology("dp1023pcp8-ep8").total_ranks == MAX_TOTAL_RANKS
    with pytest.raises(TopologyError, match=r"'dp1024pcp8-ep8' needs 8200 ranks .* at most 8192"):
        parse_topology("dp1024pcp8-ep8")
    with pytest.raises(TopologyError, match=r"token 'dp99999999999' has a 11-digit size"):
        parse_topology("dp99999999999pcp8-ep8")
    with pytest.raises(TopologyError, match=r"is 5002 characters long; at most 128"):
        parse_topology("dp" + "9" * 5000)  # int() would refuse more than 4,300 digits


@pytest.mark.parametrize("digit", ["\u0663", "\uff18", "\u0968", "\u00b2"])
def test_plugin_non_ascii_digits_are_refused(digit):
    with pytest.raises(TopologyError, match=rf"non-ASCII character '{digit}' \(U\+{ord(digit):04X}\)"):
        parse_topology(f"dp3pcp{digit}-ep8")


def test_plugin_launch_plan_refuses_an_oversized_topology_at_once(capsys):
    from pytest_afd.backends.vllm_ascend.launch import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--npu-topology", "dp99999999999pcp8-ep8", "--model", "/models/x"])
    assert exit_info.value.code == 2
    assert "afd-launch-plan: error: topology 'dp99999999999pcp8-ep8'" in capsys.readouterr().err


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(categories=("Nd", "No")), min_size=1, max_size=3))
def test_plugin_property_only_ascii_digits_are_sizes(digits):
    try:
        topo = parse_topology(f"dp{digits}")
    except TopologyError as exc:
        assert "topology" in str(exc)
    else:
        assert digits.isascii() and topo.attention_ranks == int(digits)

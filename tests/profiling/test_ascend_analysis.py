"""msprof-analyze + classification on the committed ``*_ascend_pt`` fixtures (both roles)."""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

from afd_split.ranges import parse_range, range_name
from pytest_afd.profiling import ascend, components, kernels, msprof
from tests.support import make_fixtures

DATA = Path(make_fixtures.DATA_DIR)
ROLE_DIRS = {"attention": DATA / "attention", "ffn": DATA / "ffn"}
LOAD = [[10, 12], [8, 20]]


@pytest.fixture(scope="module")
def profile(fixture_analysis_session):
    """``ascend.analyse`` with the expert load, on the session's real msprof-analyze output."""
    with fixture_analysis_session.reusing():
        return ascend.analyse(ROLE_DIRS, expert_load_per_rank=LOAD)


def test_reused_msprof_output_gives_the_real_analysis(reused_msprof):
    """The shared output stands in only for identical trees, and yields the real profile."""
    assert ascend.analyse(ROLE_DIRS) == reused_msprof.profile
    assert reused_msprof.reused == [ROLE_DIRS["attention"], ROLE_DIRS["ffn"]]
    assert reused_msprof.kept_output(DATA) is None


def test_fixtures_are_generated():
    expected = make_fixtures.fixture_files()
    on_disk = {str(p.relative_to(DATA)): p.read_text() for p in DATA.rglob("*") if p.is_file()}
    assert on_disk == expected


def test_range_grammar_round_trips_and_rejects_other_names():
    assert parse_range(range_name("attention", 5, 0)).layer == 5
    assert parse_range(range_name("final")).ubatch == -1
    assert parse_range("aten::mm") is None
    with pytest.raises(ValueError, match="Attention"):
        range_name("Attention")


@pytest.mark.parametrize(("op_type", "stage", "component"), [
    ("SparseFlashAttention", None, components.ATTENTION),
    ("lightning_indexer", "route", components.ATTENTION),
    ("async_dispatch_send", None, components.CAM),
    ("hcom_allReduce_", "attention", components.COLLECTIVES),
    ("MatMulV2", "dense_mlp", components.DENSE_MLP),
    ("MatMulV2", "routed_moe", components.ROUTED_MOE),
    ("MatMulV2", None, components.OTHER),
    ("MatMulV2", "brand_new_stage", components.UNCLASSIFIED),
    ("MysteryFusedOp", "attention", components.UNCLASSIFIED),
])
def test_classify(op_type, stage, component):
    assert components.classify(op_type, stage) == component


def _encoded(kernel):
    """The fixture names each kernel ``<type>_<layer>_<ubatch>_<index>``."""
    _, layer, ubatch, _ = kernel.name.rsplit("_", 3)
    return int(layer), int(ubatch)


def test_kernels_are_placed_by_their_launch_flow():
    for role_dir in ROLE_DIRS.values():
        for rank_dir in kernels.rank_dirs(role_dir):
            placed = kernels.read_kernels(rank_dir)
            assert placed and all(k.tag is not None for k in placed)
            assert all((k.tag.layer, k.tag.ubatch) == _encoded(k) for k in placed)


def test_device_times_alone_would_misplace_kernels():
    """Without the flows (device start in host ranges) attribution goes wrong: flows matter."""
    rank_dir = kernels.rank_dirs(ROLE_DIRS["attention"])[0]
    ranges, _ = kernels.read_ranges_and_flows(
        rank_dir / kernels.OUTPUT_DIR / kernels.TRACE_VIEW)
    starts = [r.start_ns for r in ranges]
    wrong = [k for k in kernels.read_kernels(rank_dir)
             if (tag := kernels.innermost(ranges, starts, k.start_ns)) is None
             or (tag.layer, tag.ubatch) != _encoded(k)]
    assert wrong


def test_step_trace_comes_from_msprof_analyze(fixture_analysis_session):
    """Read from msprof-analyze's real output for the FFN ranks (run once per session)."""
    result = fixture_analysis_session.kept_output(ROLE_DIRS["ffn"])
    assert (result / msprof.STEP_TRACE_CSV).is_file()
    rows = msprof.step_trace(result)
    assert {(r["rank"], r["step"]) for r in rows} == {(0, "1"), (0, "2"), (1, "1"), (1, "2")}
    csv_path = next(kernels.rank_dirs(ROLE_DIRS["ffn"])[0].rglob("step_trace_time.csv"))
    first = csv_path.read_text().splitlines()[1].split(",")
    assert rows[0]["computing_ns"] == round(float(first[1]) * 1e3)
    assert rows[0]["free_ns"] == round(float(first[5]) * 1e3)


def test_nothing_is_dropped(profile):
    for role, role_dir in ROLE_DIRS.items():
        ranks = kernels.rank_dirs(role_dir)
        total = sum(kernels.seconds(kernels.read_kernels(d)) for d in ranks)
        table = sum(r["seconds"] for r in profile["per_layer"] if r["role"] == role)
        assert table == pytest.approx(total / len(ranks) / 2)  # two steps, mean over ranks


def test_components_and_unknowns(profile):
    seen = Counter(r["component"] for r in profile["per_layer"])
    for component in (components.ATTENTION, components.DENSE_MLP, components.ROUTED_MOE,
                      components.SHARED_MOE, components.CAM, components.COLLECTIVES,
                      components.OTHER):
        assert seen[component], component
    (unknown,) = profile["unclassified"]
    assert unknown["type"] == make_fixtures.UNKNOWN_TYPE
    assert unknown["count"] == 2 * 2 * 2  # ranks x steps x ubatches
    assert unknown["names"]


def test_straggler_beside_expert_load(profile):
    layers = {e["layer"]: e for e in profile["straggler"]["per_layer"]}
    assert layers[2]["slowest_rank"] == 1
    assert layers[2]["straggler_s"] > 10 * layers[1]["straggler_s"]
    assert profile["straggler"]["expert_load_per_rank"] == LOAD


def test_collectives_per_named_group(profile):
    groups = {(c["role"], c["group"]): c for c in profile["collectives"]}
    assert set(groups) == {("attention", "tp"), ("ffn", "ep")}
    assert groups[("attention", "tp")]["ops_per_step"] == 5  # one all-reduce per attention range
    assert groups[("attention", "tp")]["volume_mb_per_step"] == pytest.approx(10.0)


def test_per_step_and_busy(profile):
    assert [s["step"] for s in profile["per_step"]] == ["1", "2"]
    for step in profile["per_step"]:
        assert 0.0 < step["overlap_fraction"] < 1.0
        assert step["exposed_bubble_s"] > 0
        assert step["critical_role"] in ("attention", "ffn")
    for role in ("attention", "ffn"):
        assert 0.0 < profile["roles"][role]["busy_fraction"] < 1.0


def test_missing_msprof_analyze_is_a_clear_error(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(msprof.importlib.metadata, "version", missing)
    with pytest.raises(msprof.ProfilingUnavailable, match=r"pytest-afd\[profile\]"):
        ascend.analyse(ROLE_DIRS)


def test_a_directory_without_ranks_is_named(tmp_path):
    with pytest.raises(msprof.ProfilingUnavailable, match=str(tmp_path)):
        msprof.run_cluster_analysis(tmp_path, tmp_path / "out")


def validate_def(name, value):
    """Validate ``value`` against ``$defs/<name>`` of schemas/result.schema.json."""
    import json

    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "schemas" / "result.schema.json").read_text())
    wrapper = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{name}"}
    jsonschema.validate(value, wrapper)


def test_profile_matches_the_schema(profile):
    import json

    import jsonschema

    validate_def("profile", json.loads(json.dumps(profile)))
    broken = {**profile, "per_layer": [{**profile["per_layer"][0], "component": "mystery"}]}
    with pytest.raises(jsonschema.ValidationError):
        validate_def("profile", broken)

"""Every summary figure of a known-answer export (tests/support/known_export.py) to 1% or 1 us,
and the same export's figures against msprof-analyze's own outputs on it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

from pytest_afd.profiling import ascend, evidence, msprof
from tests.support import known_export

US = 1e-6
ABS_S = 1 * US  # 1 us
REL = 0.01  # 1 %


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """(profile, {role: msprof-analyze output dir}) of the known-answer export."""
    root = tmp_path_factory.mktemp("known-export")
    role_dirs = known_export.write(root / "export")
    work = root / "msprof"
    roles = {role: ascend.load_role(role, path, work) for role, path in role_dirs.items()}
    profile = evidence.build(roles, source=ascend.SOURCE, analyzer=ascend.analyzer())
    return json.loads(json.dumps(profile)), {r: work / r / msprof.OUTPUT_DIR for r in roles}


def close(actual, expected, *, seconds: bool) -> bool:
    if not isinstance(actual, (int, float)):
        return False
    return actual == pytest.approx(expected, rel=REL, abs=ABS_S if seconds else 0)


# Figures computed by hand from the export's chosen times (tests/support/known_export.py).
EXPECTED_STEP = {
    # attention busy [0,220)+[400,620) = 440 us; FFN busy [200,300)+[600,700) = 200 us;
    # both busy [200,220)+[600,620) = 40 us -> 40 / min(440, 200)
    "overlap_fraction": 0.2,
    # Free 260 + Bubble 0 + AsyncCombineRecv in the wait ranges 150 + 150
    "exposed_bubble_s": 560 * US,
    # FFN rank 1's Stage 1100 us > FFN rank 0's 1000 > Attention's 1000
    "critical_path_s": 1100 * US,
    # grouped matmuls per step: rank 1 2 x 70 = 140, rank 0 2 x 50 = 100 -> 140 - 120
    "straggler_s": 20 * US,
}
EXPECTED_ROLES = {"attention": 1 - 260 / (700 + 40 + 260),
                  "ffn": 1 - (840 + 900) / (1000 + 1100)}
EXPECTED_LAYERS = {  # (role, layer, range, component) -> (rank mean, slowest rank) per step
    ("attention", 0, "attention", "attention"): (200 * US, 200 * US),
    ("attention", 1, "attention", "attention"): (200 * US, 200 * US),
    ("attention", 0, "attention", "tp_sp_pcp_collectives"): (40 * US, 40 * US),
    ("attention", 1, "attention", "tp_sp_pcp_collectives"): (40 * US, 40 * US),
    ("attention", 0, "wait", "cam_dispatch_combine"): (150 * US, 150 * US),
    ("attention", 1, "wait", "cam_dispatch_combine"): (150 * US, 150 * US),
    ("ffn", -1, "none", "routed_moe"): (120 * US, 140 * US),
    ("ffn", -1, "none", "tp_sp_pcp_collectives"): (60 * US, 60 * US),
}
EXPECTED_GROUPS = {  # per step and rank: ops, time, volume MB, bandwidth GB/s, per transport
    ("attention", "tp"): (2, 80 * US, 4.0, 100.0, {"SDMA": (4.0, 100.0)}),
    # 2 ops x (SDMA 0.75 MB in 0.01 ms + RDMA 0.25 MB in 0.01 ms); HCCS/PCIE are inside SDMA
    ("ffn", "ep"): (2, 60 * US, 2.0, 50.0, {"SDMA": (1.5, 75.0), "RDMA": (0.5, 25.0)}),
}


def test_every_per_step_figure(analysed):
    profile, _ = analysed
    assert [s["step"] for s in profile["per_step"]] == ["1", "2"]
    for step in profile["per_step"]:
        for key, expected in EXPECTED_STEP.items():
            assert close(step[key], expected, seconds=key.endswith("_s")), (key, step[key])
        assert (step["critical_role"], step["critical_rank"]) == ("ffn", 1)
        assert step["straggler_slowest_rank"] == 1
        assert close(step["communication_overlap_fraction"]["attention"], 40 / 80, seconds=False)
        assert step["communication_overlap_fraction"]["ffn"] == 0.0  # the file says Overlapped 0


def test_identical_steps_give_identical_figures(analysed):
    """Step 2 starts 10 000.333 us after step 1; integer ns keep the figures identical."""
    first, second = ({k: v for k, v in s.items() if k != "step"}
                     for s in analysed[0]["per_step"])
    assert first == second


def test_every_role_and_straggler_figure(analysed):
    profile, _ = analysed
    for role, expected in EXPECTED_ROLES.items():
        assert close(profile["roles"][role]["busy_fraction"], expected, seconds=False), role
        assert profile["roles"][role]["steps"] == ["1", "2"]
    straggler = profile["straggler"]
    assert close(straggler["total_s"], 20 * US, seconds=True)
    assert straggler["slowest_rank"] == 1
    for step in straggler["per_step"]:
        assert step["per_rank_s"] == {"0": pytest.approx(100 * US), "1": pytest.approx(140 * US)}
    # No layer ranges on the FFN role: per layer is absent with its reason, not [] or 0.
    assert "no AFD layer range" in straggler["per_layer"]["absent_reason"]


def test_every_per_layer_row(analysed):
    rows = {(r["role"], r["layer"], r["range"], r["component"]): r
            for r in analysed[0]["per_layer"]}
    assert set(rows) == set(EXPECTED_LAYERS)
    for key, (mean, slowest) in EXPECTED_LAYERS.items():
        assert close(rows[key]["seconds"], mean, seconds=True), key
        assert close(rows[key]["max_rank_seconds"], slowest, seconds=True), key
    assert analysed[0]["unclassified"] == []


def test_every_collective_figure(analysed):
    groups = {(c["role"], c["group"]): c for c in analysed[0]["collectives"]}
    assert set(groups) == set(EXPECTED_GROUPS)
    for key, (ops, time_s, volume, bandwidth, transports) in EXPECTED_GROUPS.items():
        group = groups[key]
        assert group["ops_per_step"] == ops
        assert close(group["time_s_per_step"], time_s, seconds=True)
        assert close(group["volume_mb_per_step"], volume, seconds=False), key
        assert close(group["bandwidth_gb_s"], bandwidth, seconds=False), key
        assert set(group["transports"]) == set(transports)
        for name, (size, rate) in transports.items():
            assert close(group["transports"][name]["volume_mb_per_step"], size, seconds=False)
            assert close(group["transports"][name]["bandwidth_gb_s"], rate, seconds=False)


def _cluster_totals(output: Path) -> dict[tuple[str, str, int], dict]:
    """msprof-analyze's own "Total Op Info" per (group hash, step, rank), read as plain JSON."""
    doc = json.loads((output / msprof.COMMUNICATION_JSON).read_text())
    return {(op.split("@", 1)[1], step, int(rank)): info["Communication Bandwidth Info"]
            for steps in doc.values() for step, ops in steps.items()
            for op, per_rank in ops.items() if op.startswith(msprof.TOTAL_OP_PREFIX)
            for rank, info in per_rank.items()}


def test_collectives_agree_with_msprof_analyze_communication_analysis(analysed):
    """Volume = its SDMA + RDMA transit sizes; per-transport bandwidth = its Bandwidth(GB/s)."""
    profile, outputs = analysed
    groups = {(c["role"], c["group"]): c for c in profile["collectives"]}
    for role, output in outputs.items():
        totals = _cluster_totals(output)
        assert totals
        (group,) = [g for (r, _), g in groups.items() if r == role]
        volume = sum(t[name]["Transit Size(MB)"] for t in totals.values()
                     for name in ("SDMA", "RDMA"))
        assert group["volume_mb_per_step"] == pytest.approx(volume / len(totals))
        for name, figures in group["transports"].items():
            for bandwidth in totals.values():
                assert figures["bandwidth_gb_s"] == pytest.approx(
                    bandwidth[name]["Bandwidth(GB/s)"], rel=1e-3)
        # HCCS is part of SDMA (msprof-analyze keeps both rows): adding it would double.
        hccs = sum(t["HCCS"]["Transit Size(MB)"] for t in totals.values())
        assert hccs > 0 and group["volume_mb_per_step"] < (volume + hccs) / len(totals)


def test_step_trace_agrees_with_msprof_analyze(analysed):
    """Critical path and busy fraction use its cluster_step_trace_time.csv rows, exactly."""
    profile, outputs = analysed
    stages = []
    for role, output in outputs.items():
        with (output / msprof.STEP_TRACE_CSV).open(newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if r["Type"] == "rank"]
        assert {(r["Step"], r["Index"]) for r in rows} == {
            (s, str(k)) for s in ("1", "2") for k in profile["roles"][role]["ranks"]}
        stages += [float(r["Stage"]) * US for r in rows]
        idle = sum(float(r["Free"]) + float(r["Bubble"]) for r in rows)
        span = sum(float(r["Computing"]) + float(r["Communication(Not Overlapped)"])
                   + float(r["Free"]) for r in rows)
        assert profile["roles"][role]["busy_fraction"] == pytest.approx(1 - idle / span)
    assert all(s["critical_path_s"] == pytest.approx(max(stages))
               for s in profile["per_step"])


def test_kernel_times_agree_with_kernel_details(analysed, tmp_path):
    """The per-layer table sums to kernel_details.csv's durations, read as plain CSV."""
    profile, _ = analysed
    role_dirs = known_export.write(tmp_path)
    for role, path in role_dirs.items():
        durations, ranks = 0.0, 0
        for details in sorted(path.rglob("kernel_details.csv")):
            ranks += 1
            with details.open(newline="") as handle:
                durations += sum(float(r["Duration(us)"]) for r in csv.DictReader(handle))
        table = sum(r["seconds"] for r in profile["per_layer"] if r["role"] == role)
        assert table == pytest.approx(durations * US / ranks / 2)  # mean rank, per step


def test_profile_summary_prints_the_figures(analysed):
    """What ``profile-summary`` prints for the known-answer export (no file paths only)."""
    from pytest_afd.profiling.summary_text import render

    text = render(analysed[0])
    for line in ("attention: busy 74.0% | overlap with the other role 20.0% | exposed bubble "
                 "560.0 us/step | communication overlap 50.0%",
                 "ffn: busy 17.1% | overlap with the other role 20.0% | straggler 20.0 us/step "
                 "(slowest rank 1) | communication overlap 0.0%",
                 "step 2: overlap 20.0% | exposed bubble 560.0 us | critical path 1.100 ms "
                 "(ffn rank 1) | straggler 20.0 us (rank 1)",
                 "attention/tp ranks [0]: 2 ops, time 80.0 us, volume 4 MB, bandwidth 100 GB/s "
                 "[SDMA 4 MB @ 100 GB/s]",
                 "ffn/ep ranks [0, 1]: 2 ops, time 60.0 us, volume 2 MB, bandwidth 50 GB/s "
                 "[RDMA 0.5 MB @ 25 GB/s, SDMA 1.5 MB @ 75 GB/s]",
                 "attention L0 attention attention: 200.0 us / 200.0 us",
                 "ffn no layer none routed_moe: 120.0 us / 140.0 us"):
        assert line in text, line

"""Profiler data no one here wrote (tests/profiling/real_exports/README.md): the summary agrees
with msprof-analyze's own outputs and with the files read as plain CSV / JSON."""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from pathlib import Path

import pytest

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

from pytest_afd.profiling import ascend, components, evidence, msprof

REAL = Path(__file__).with_name("real_exports")
NPU_MFU = REAL / "npu_mfu_analyzer_rank0"
MSTT_OUTPUT = REAL / "mstt_advisor_cluster_output"
US = Decimal("1e-6")
NS = 1e-9


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(RoleData, msprof-analyze output) of the real rank, analysed once."""
    work = tmp_path_factory.mktemp("real-msprof")
    role = ascend.load_role("attention", NPU_MFU, work)
    return role, work / "attention" / msprof.OUTPUT_DIR


def _build(role: evidence.RoleData, name: str = "attention") -> dict:
    data = evidence.RoleData(name, role.ranks, role.collectives)
    profile = evidence.build({name: data}, source=ascend.SOURCE, analyzer=ascend.analyzer())
    return json.loads(json.dumps(profile))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_step_trace_figures_are_msprof_analyzes(real):
    """Critical path, exposed bubble, busy and communication overlap from its collated row."""
    role, output = real
    (row,) = [r for r in _rows(output / msprof.STEP_TRACE_CSV) if r["Type"] == "rank"]
    (own,) = _rows(next(NPU_MFU.rglob("step_trace_time.csv")))
    assert row["Stage"] == own["Stage"]  # msprof-analyze collated the rank's own file
    value = {k: Decimal(v) * US for k, v in row.items() if k not in ("Step", "Type", "Index")}
    profile = _build(role)
    (step,) = profile["per_step"]
    assert step["step"] == ""  # no profiler schedule: Step is empty, as in the file
    # To the ns: the file's float-printed us ("27566772.42000007") become whole ns.
    assert step["critical_path_s"] == pytest.approx(float(value["Stage"]), abs=NS)
    # No AFD wait range in this trace: exposed bubble is the step trace's Free + Bubble.
    assert step["exposed_bubble_s"] == pytest.approx(float(value["Free"] + value["Bubble"]),
                                                     abs=NS)
    assert step["communication_overlap_fraction"]["attention"] == pytest.approx(
        float(value["Overlapped"] / value["Communication"]))
    span = value["Computing"] + value["Communication(Not Overlapped)"] + value["Free"]
    assert profile["roles"]["attention"]["busy_fraction"] == pytest.approx(
        float(1 - (value["Free"] + value["Bubble"]) / span))


def test_kernel_figures_sum_kernel_details_exactly(real):
    """Every kernel row is counted once; the ns parse of its text loses no digit."""
    role, _ = real
    rows = _rows(next(NPU_MFU.rglob("kernel_details.csv")))
    assert len(role.ranks[0].items) == len(rows) == 200
    total = sum(Decimal(r["Duration(us)"]) for r in rows)
    assert sum(i.duration_ns for i in role.ranks[0].items) == total * 1000
    first = min(Decimal(r["Start Time(us)"]) for r in rows)  # "1777097775243356.820\t"
    assert min(i.start_ns for i in role.ranks[0].items) == first * 1000
    table = sum(Decimal(str(r["seconds"])) for r in _build(role)["per_layer"])
    assert table == pytest.approx(total * US, rel=Decimal("1e-12"))


def test_real_kernel_details_list_hcom_collectives(real):
    """The hcom_* question, settled on real data: collectives are kernel rows."""
    role, _ = real
    hcom = [i for i in role.ranks[0].items if i.op_type.startswith("hcom_")]
    assert hcom and {i.op_type for i in hcom} == {"hcom_allGather_"}
    assert all(i.component == components.COLLECTIVES for i in hcom)
    collective_rows = [r for r in _build(role)["per_layer"]
                       if r["component"] == components.COLLECTIVES]
    assert sum(r["seconds"] for r in collective_rows) == pytest.approx(
        sum(i.duration_ns for i in hcom) / 1e9)


def test_unknowns_are_absent_never_zero(real):
    """One rank, no FFN pair, no communication.json: absent with reasons, not 0."""
    role, _ = real
    attention = _build(role)
    assert "needs profiles of both roles" in attention["per_step"][0]["overlap_fraction"][
        "absent_reason"]
    assert attention["straggler"]["absent_reason"] == "no FFN-side profile"
    assert attention["collectives"] == []  # the export has no communication.json to read
    as_ffn = _build(role, "ffn")
    assert "no other rank" in as_ffn["straggler"]["total_s"]["absent_reason"]
    assert "no other rank" in as_ffn["per_step"][0]["straggler_s"]["absent_reason"]


def test_real_hccl_analysis_sdma_is_the_sum_of_hccs_pcie_sio():
    """msprof-analyze's output of a real run: every SDMA row = HCCS + PCIE + SIO, so the
    volume is SDMA + RDMA (adding every row would count intra-node traffic twice)."""
    doc = json.loads((MSTT_OUTPUT / "cluster_communication.json").read_text())
    infos = [info["Communication Bandwidth Info"] for steps in doc.values()
             for ops in steps.values() for per_rank in ops.values() for info in per_rank.values()]
    assert len(infos) == 4
    for bandwidth in infos:
        for key in ("Transit Size(MB)", "Transit Time(ms)"):
            parts = sum(bandwidth.get(link, {}).get(key, 0) for link in msprof.SDMA_LINKS)
            assert bandwidth["SDMA"][key] == pytest.approx(parts)
        counted = msprof.transports(bandwidth)
        volume = sum(t["volume_mb"] for t in counted.values())
        assert volume == pytest.approx(bandwidth["SDMA"]["Transit Size(MB)"]
                                       + bandwidth["RDMA"]["Transit Size(MB)"])
        everything = sum(row["Transit Size(MB)"] for row in bandwidth.values())
        assert everything == pytest.approx(2 * volume)  # what the old reader reported

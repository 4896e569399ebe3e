"""A second real export no one here wrote: two torch_npu ranks of one HCCL group
(tests/profiling/real_exports/README.md, ``msinsight_level1_2ranks``). The summary is
cross-checked against msprof-analyze's own cluster output on the same directory and
against the ranks' own files: step trace, per-collective time, volume and bandwidth,
the communication matrix, and the kernel rows (the ``hcom_*`` question).

Tolerance: 1 us for times, 1e-9 relative for sizes, and msprof-analyze's own 4-decimal
rounding for the bandwidth it prints.
"""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from pathlib import Path

import pytest

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

from pytest_afd.profiling import ascend, components, evidence, msprof, summary_text

EXPORT = Path(__file__).with_name("real_exports") / "msinsight_level1_2ranks"
RANKS = (0, 1)
STEP = "50"
US_NS = 1000  # ns per us
MS_NS = 1_000_000  # ns per ms
TIME_TOL_NS = 1000  # 1 us
PRINTED_BANDWIDTH_DIGITS = 4  # msprof-analyze rounds Bandwidth(GB/s) to 4 decimals
LOCAL = "LOCAL"  # on-chip copy in the matrix: no link traffic


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """(RoleData, profile, msprof-analyze output directory), analysed once."""
    work = tmp_path_factory.mktemp("msinsight-msprof")
    role = ascend.load_role("ffn", EXPORT, work)
    profile = evidence.build({"ffn": role}, source=ascend.SOURCE, analyzer=ascend.analyzer())
    return role, json.loads(json.dumps(profile)), work / "ffn" / msprof.OUTPUT_DIR


def _own(rank: int, name: str) -> Path:
    return EXPORT / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / name


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _cluster_rows(output: Path) -> dict[int, dict[str, Decimal]]:
    rows = [r for r in _csv(output / msprof.STEP_TRACE_CSV) if r["Type"] == "rank"]
    return {int(r["Index"]): {k: Decimal(v) for k, v in r.items()
                              if k not in ("Step", "Type", "Index")} for r in rows}


def test_msprof_analyze_collates_both_ranks_step_traces_unchanged(analysed):
    _, _, output = analysed
    cluster = _cluster_rows(output)
    assert sorted(cluster) == list(RANKS)
    for rank in RANKS:
        (own,) = _csv(_own(rank, "step_trace_time.csv"))
        assert own["Step"] == STEP
        for column in ("Computing", "Communication", "Overlapped", "Free", "Stage"):
            assert cluster[rank][column] == Decimal(own[column]), (rank, column)


def test_step_figures_agree_with_msprof_analyzes_step_trace(analysed):
    _, profile, output = analysed
    cluster = _cluster_rows(output)
    (step,) = profile["per_step"]
    assert step["step"] == STEP
    slowest = max(RANKS, key=lambda r: cluster[r]["Stage"])
    assert step["critical_rank"] == slowest == 0  # 136581.0 us against 131912.5 us
    assert step["critical_path_s"] * 1e9 == pytest.approx(
        float(cluster[slowest]["Stage"]) * US_NS, abs=TIME_TOL_NS)
    overlapped = sum(cluster[r]["Overlapped"] for r in RANKS)
    communication = sum(cluster[r]["Communication"] for r in RANKS)
    assert step["communication_overlap_fraction"]["ffn"] == pytest.approx(
        float(overlapped / communication), rel=1e-9)
    idle = sum(cluster[r]["Free"] + cluster[r]["Bubble"] for r in RANKS)
    span = sum(cluster[r]["Computing"] + cluster[r]["Communication(Not Overlapped)"]
               + cluster[r]["Free"] for r in RANKS)
    assert profile["roles"]["ffn"]["busy_fraction"] == pytest.approx(float(1 - idle / span),
                                                                    rel=1e-9)


def _records(role) -> dict[int, dict]:
    records = {r["rank"]: r for r in role.collectives}
    assert sorted(records) == list(RANKS) and {r["step"] for r in records.values()} == {STEP}
    return records


def test_per_rank_collectives_are_msprof_analyzes_totals(analysed):
    """Time, volume and transit time per rank = its "Total Op Info"; volume counted once."""
    role, _, output = analysed
    doc = _json(output / msprof.COMMUNICATION_JSON)
    (ops,) = [ops for steps in doc.values() for ops in steps.values()]
    (total_key,) = [k for k in ops if k.startswith(msprof.TOTAL_OP_PREFIX)]
    for rank, record in _records(role).items():
        info = ops[total_key][str(rank)]
        bandwidth = info["Communication Bandwidth Info"]
        assert record["num_ops"] == 4  # hcom_allReduce__586_{0..3}_1
        assert record["time_ns"] == pytest.approx(
            info["Communication Time Info"]["Elapse Time(ms)"] * MS_NS, abs=1)
        sdma, rdma = bandwidth["SDMA"], bandwidth["RDMA"]
        assert record["volume_mb"] == pytest.approx(
            sdma["Transit Size(MB)"] + rdma["Transit Size(MB)"], rel=1e-12)
        assert record["transit_time_ns"] == pytest.approx(
            (sdma["Transit Time(ms)"] + rdma["Transit Time(ms)"]) * MS_NS, abs=1)
        # msprof-analyze prints each transport's bandwidth (MB/ms = GB/s) to 4 decimals.
        ours = record["volume_mb"] / (record["transit_time_ns"] / MS_NS)
        assert round(ours, PRINTED_BANDWIDTH_DIGITS) == sdma["Bandwidth(GB/s)"]
        # HCCS is the only link here, and SDMA is its aggregate: not added twice.
        assert sdma["Transit Size(MB)"] == pytest.approx(bandwidth["HCCS"]["Transit Size(MB)"])


def test_per_rank_collectives_sum_the_ranks_own_ops(analysed):
    """The same totals from each op of the rank's own communication.json."""
    role, _, _ = analysed
    for rank, record in _records(role).items():
        ops = _json(_own(rank, "communication.json"))[f"step{STEP}"]["collective"]
        each = [info for name, info in ops.items() if name.startswith("hcom_")]
        assert len(each) == record["num_ops"]
        elapse_ms = sum(i["Communication Time Info"]["Elapse Time(ms)"] for i in each)
        assert record["time_ns"] == pytest.approx(elapse_ms * MS_NS, abs=TIME_TOL_NS)
        size = sum(i["Communication Bandwidth Info"]["SDMA"]["Transit Size(MB)"] for i in each)
        assert record["volume_mb"] == pytest.approx(size, rel=1e-9)


def test_group_summary_is_per_step_mean_and_pooled_bandwidth(analysed):
    role, profile, _ = analysed
    records = _records(role)
    (group,) = profile["collectives"]
    assert group["ranks"] == list(RANKS) and group["ops_per_step"] == 4
    assert group["time_s_per_step"] * 1e9 == pytest.approx(
        sum(r["time_ns"] for r in records.values()) / len(RANKS), abs=TIME_TOL_NS)
    assert group["volume_mb_per_step"] == pytest.approx(427.596096, rel=1e-9)  # each rank
    pooled = (sum(r["volume_mb"] for r in records.values())
              / (sum(r["transit_time_ns"] for r in records.values()) / MS_NS))
    assert group["bandwidth_gb_s"] == pytest.approx(pooled, rel=1e-12)
    assert group["bandwidth_gb_s"] == pytest.approx(15.5774, rel=1e-4)


def test_volume_and_transit_time_agree_with_the_communication_matrix(analysed):
    """Each rank's links in its own communication_matrix.json (the "-total" op, LOCAL
    on-chip copies left out) carry exactly the volume and transit time the summary reports."""
    role, _, output = analysed
    records = _records(role)
    for rank in RANKS:
        ops = _json(_own(rank, "communication_matrix.json"))[f"step{STEP}"]["collective"]
        (total,) = [links for name, links in ops.items() if name.startswith("allreduce-total@")]
        links = [link for link in total.values() if link["Transport Type"] != LOCAL]
        assert len(links) == 7  # an 8-rank ring: this rank to each of the 7 others
        assert records[rank]["volume_mb"] == pytest.approx(
            sum(link["Transit Size(MB)"] for link in links), rel=1e-9)
        assert records[rank]["transit_time_ns"] == pytest.approx(
            sum(link["Transit Time(ms)"] for link in links) * MS_NS, abs=TIME_TOL_NS)
    # msprof-analyze's cluster matrix keeps only links between the ranks it was given
    # (0 and 1 of the 8): the same 0-1 / 1-0 entries, so not a rank's whole volume.
    cluster = _json(output / "cluster_communication_matrix.json")
    (ops,) = [ops for steps in cluster.values() for ops in steps.values()]
    (total,) = [links for name, links in ops.items() if name.startswith("allreduce-total@")]
    assert set(total) == {"0-0", "0-1", "1-0", "1-1"}
    for src, dst in ((0, 1), (1, 0)):
        own = _json(_own(src, "communication_matrix.json"))[f"step{STEP}"]["collective"]
        (own_total,) = [v for k, v in own.items() if k.startswith("allreduce-total@")]
        assert total[f"{src}-{dst}"]["Transit Size(MB)"] == own_total[f"{src}-{dst}"][
            "Transit Size(MB)"]


def test_kernel_rows_sum_exactly_and_hcom_rows_are_the_collectives(analysed):
    """The hcom_* question on a second real export: every HCCL op of communication.json is a
    kernel_details row (Type hcom_allReduce_, core HCCL) with the op's start and elapse time,
    and the summary files it under collectives."""
    role, _, _ = analysed
    for rank_data in role.ranks:
        rows = _csv(_own(rank_data.rank, "kernel_details.csv"))
        assert len(rank_data.items) == len(rows) == 14
        assert sum(i.duration_ns for i in rank_data.items) == sum(
            Decimal(r["Duration(us)"]) for r in rows) * US_NS
        hcom = {i.name: i for i in rank_data.items if i.op_type.startswith("hcom_")}
        assert {i.op_type for i in hcom.values()} == {"hcom_allReduce_"}
        assert {r["Accelerator Core"] for r in rows if r["Name"] in hcom} == {"HCCL"}
        assert all(i.component == components.COLLECTIVES for i in hcom.values())
        ops = _json(_own(rank_data.rank, "communication.json"))[f"step{STEP}"]["collective"]
        for name, info in ops.items():
            if not name.startswith("hcom_"):
                continue
            kernel = hcom[name.split("@")[0]]
            time_info = info["Communication Time Info"]
            assert kernel.duration_ns == pytest.approx(time_info["Elapse Time(ms)"] * MS_NS,
                                                       abs=TIME_TOL_NS)
            assert kernel.start_ns == pytest.approx(time_info["Start Timestamp(us)"] * US_NS,
                                                    abs=TIME_TOL_NS)
        (trace,) = _csv(_own(rank_data.rank, "step_trace_time.csv"))
        assert sum(i.duration_ns for i in hcom.values()) == pytest.approx(
            float(trace["Communication"]) * US_NS, abs=TIME_TOL_NS)


def test_unknowns_on_this_export_are_absent_with_reasons(analysed):
    """No routed-expert kernel and one role only: absent records, never 0."""
    _, profile, _ = analysed
    (step,) = profile["per_step"]
    assert "no routed-expert kernel" in step["straggler_s"]["absent_reason"]
    assert "both roles" in step["overlap_fraction"]["absent_reason"]
    assert step["straggler_s"]["value"] is None


def test_printed_summary_shows_msprof_analyzes_collective_figures(analysed):
    """What ``pytest-afd profile-summary`` prints for this export: the group's figures."""
    _, profile, _ = analysed
    text = summary_text.render(profile)
    assert ("ranks [0, 1]: 4 ops, time 103.184 ms, volume 428 MB, bandwidth 15.6 GB/s "
            "[SDMA 428 MB @ 15.6 GB/s]") in text
    assert "critical path 136.581 ms (ffn rank 0)" in text
    assert "straggler: no routed-expert kernel" in text

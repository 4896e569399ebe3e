"""The workloads table shows both distributions of a hit-ratio twin: whole prompts (equal to
the hit-0 twin's) and what a warm cache leaves to compute."""

from pytest_afd import report
from pytest_afd.results.documents import prompt_length_summary
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write

NODE = "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two"


def test_hit_ratio_twins_share_the_lengths_and_show_the_uncached_ones(tmp_path):
    for ratio in (0.0, 0.75):
        workload = make_workload("long_short", requested_hit_ratio=ratio, **SMALL)
        doc = make_result(f"{NODE}/best/{workload.name}/unchunked", "stage_d", workload,
                          "token_balanced")
        doc["workload"]["shared_prefix_tokens"] = workload.shared_prefix_tokens
        doc["workload"]["uncached_prompt_lengths"] = prompt_length_summary(
            workload.uncached_lengths)
        write(tmp_path, stamped(doc, "passed", session="s", created_at="2026-12-01T12:00:00Z"))
    text = report.render(tmp_path).read_text()
    rows = {cells[0]: cells for line in text[text.index("Workloads:"):].splitlines()
            if line.startswith("| long_short")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    cold, warm = rows["long_short-fixed"], rows["long_short-fixed-hit75"]
    assert cold[2:11] == warm[2:11]  # requests, total, mean, p50, p90, p99, CV, min, max
    assert cold[-1] == "—" and warm[-1] != "—"
    p50, _, largest = warm[-1].partition(" / ")
    assert float(p50) <= float(warm[5]) and float(largest) < float(warm[10])

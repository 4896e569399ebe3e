"""``pytest-afd report --no-plots``: the same tables and conclusions, no figure drawn or written."""

from pytest_afd import report
from pytest_afd.__main__ import main
from pytest_afd.report.rendering import NO_PLOTS_LINE
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write


def _results(directory):
    workload = make_workload("bimodal", **SMALL)
    for policy, wall in (("none", 1.0), ("request_boundary", 1.2), ("token_balanced", 0.9)):
        doc = make_result(f"stage_a/bimodal/{policy}", "stage_a", workload, policy, wall_s=wall,
                          host=(0.5, 0.4))
        write(directory, stamped(doc, "passed", session="s1",
                                 created_at="2026-12-01T12:00:00+00:00"))


def _without_plot_lines(text):
    """The report minus what only a drawn figure brings (images, captions, the point key)
    and blank lines."""
    kept, skipping = [], False
    for line in text.splitlines():
        if line.startswith("Key to the numbered points"):
            skipping = True
        elif skipping and line.startswith("#"):
            skipping = False
        if (skipping or not line.strip() or line.startswith("![")
                or (line.startswith("*") and line.endswith(".*"))):
            continue
        kept.append(line)
    return "\n".join(kept)


def test_no_plots_keeps_every_table_and_conclusion_and_writes_no_figure(tmp_path):
    _results(tmp_path)
    with_plots = report.render(tmp_path, tmp_path / "full").read_text()
    assert list((tmp_path / "full" / "plots").glob("*.png")), "the default draws figures"
    text_only = report.render(tmp_path, tmp_path / "text", plots=False).read_text()
    assert not list((tmp_path / "text" / "plots").glob("*.png"))
    assert "![" not in text_only and NO_PLOTS_LINE in text_only
    assert NO_PLOTS_LINE not in with_plots
    assert _without_plot_lines(text_only).replace(NO_PLOTS_LINE + "\n", "") == \
        _without_plot_lines(with_plots)


def test_the_cli_flag_reaches_the_renderer(tmp_path, capsys):
    _results(tmp_path)
    assert main(["report", str(tmp_path), "--no-plots", "--output", str(tmp_path / "r")]) == 0
    written = capsys.readouterr().out.strip()
    assert written.endswith("report.md")
    assert NO_PLOTS_LINE in (tmp_path / "r" / "report.md").read_text()
    assert not list((tmp_path / "r" / "plots").glob("*.png"))

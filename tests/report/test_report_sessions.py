"""Verdicts, sessions and bad input: failures first, latest session by default, no crash."""

import base64
import json

import pytest

from pytest_afd import report
from pytest_afd.__main__ import main
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EARLY, LATE = "2026-12-01T10:00:00+00:00", "2026-12-01T12:00:00+00:00"


def _rows(text):
    return [line for line in text.splitlines() if line.startswith("| ")]


@pytest.fixture
def two_sessions(tmp_path):
    workload = make_workload("uniform", **SMALL)
    old = make_result("stage_a/old/token_balanced", "stage_a", workload, "token_balanced")
    write(tmp_path, stamped(old, "passed", session="s-early", created_at=EARLY))
    legacy = make_result("stage_a/legacy/token_balanced", "stage_a", workload, "token_balanced")
    write(tmp_path, {**legacy, "created_at": EARLY})
    for name, status, reason in (
        ("good", "passed", None),
        ("broken", "failed", "AssertionError: split outputs differ\nmore lines"),
        ("crashed", "error", "the test did not finish"),
    ):
        doc = make_result(f"stage_a/{name}/token_balanced", "stage_a", workload, "token_balanced")
        write(tmp_path, stamped(doc, status, session="s-late", created_at=LATE, reason=reason))
    return tmp_path


def test_latest_session_by_default_with_verdicts_and_failures_first(two_sessions):
    text = report.render(two_sessions, plots=False).read_text()
    assert "Session: s-late (the latest)." in text
    assert "2 result(s) of 2 earlier session(s) are not shown; `--all-sessions`" in text
    assert "old/" not in text and "legacy/" not in text
    failures = text[text.index("## Failures") : text.index("## Stacks")]
    assert (
        "| stage_a/broken/token_balanced | stage_a | failed: AssertionError: split outputs differ |"
        in failures
    )
    assert (
        "| stage_a/crashed/token_balanced | stage_a | error: the test did not finish |" in failures
    )
    section = text[text.index("## stage_a") :]
    cases = [row.split("|")[1].strip() for row in _rows(section) if "token_balanced |" in row]
    verdicts = [row.split("|")[2].strip() for row in _rows(section) if "token_balanced |" in row]
    assert cases[:3] == ["broken/token_balanced", "crashed/token_balanced", "good/token_balanced"]
    assert verdicts[0].startswith("failed: ") and verdicts[1].startswith("error: ")
    assert verdicts[2] == "passed"


def test_all_sessions_reports_everything_and_legacy_is_unknown(two_sessions):
    text = report.render(two_sessions, all_sessions=True, plots=False).read_text()
    assert "Sessions: all (3: legacy (no session id), s-early, s-late)." in text
    legacy = next(row for row in _rows(text) if row.startswith("| legacy/token_balanced |"))
    assert legacy.split("|")[2].strip() == "unknown"
    assert (
        main(["report", str(two_sessions), "--all-sessions", "--output", str(two_sessions / "all")])
        == 0
    )
    assert "| old/token_balanced | passed |" in (two_sessions / "all" / "report.md").read_text()


def test_a_result_from_before_run_identities_is_read_not_skipped(tmp_path):
    workload = make_workload("uniform", **SMALL)
    doc = make_result("stage_c/old", "stage_c", workload, "token_balanced")
    del doc["manifest"]["run"]  # as written before manifests carried the run identity
    (tmp_path / "old.json").write_text(json.dumps(doc))
    text = report.render(tmp_path, plots=False).read_text()
    assert "| stage_c/old |" in text and "Skipped files" not in text
    assert "1 result(s) predate recorded outcomes" in text


def test_non_utf8_and_deeply_nested_files_are_skipped_with_a_reason(tmp_path):
    workload = make_workload("uniform", **SMALL)
    write(tmp_path, make_result("stage_c/ok", "stage_c", workload, "token_balanced"))
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "deep_result.json").write_text(
        json.dumps({"kind": "afd-result", "x": 1})[:-1]
        + ', "notes": '
        + "[" * 50_000
        + "]" * 50_000
        + "}"
    )
    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    skipped = text[text.index("## Skipped files") :]
    assert "| `binary.json` | not UTF-8 text (byte 0: invalid start byte) |" in skipped
    assert "| `deep.json` | unreadable JSON: nested too deeply to parse |" in skipped
    assert "`deep_result.json` |" in skipped
    assert "| stage_c/ok |" in text


def test_output_that_is_a_file_is_a_clear_error(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("not a directory")
    assert main(["report", str(tmp_path), "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --output ") and "is a file, not a directory" in err
    assert "Traceback" not in err
    blocked = tmp_path / "taken" / "below"  # a directory under a file cannot be created
    assert main(["report", str(tmp_path), "--output", str(blocked)]) == 2
    assert "cannot write the report under" in capsys.readouterr().err


def test_html_page_has_the_tables_and_plots_inline(two_sessions):
    report.render(two_sessions)
    page = (two_sessions / "report" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert (
        "<th>verdict</th>" in page
        and "<td>failed: AssertionError: split outputs differ</td>" in page
    )
    images = [part.split('"')[0] for part in page.split('<img src="')[1:]]
    assert images and all(src.startswith("data:image/png;base64,") for src in images)
    assert all(base64.b64decode(src.partition(",")[2])[:8] == PNG_SIGNATURE for src in images)
    assert 'href="plots/' not in page and 'src="plots/' not in page  # one self-contained file
    toc = page[page.index('<nav id="contents">') : page.index("</nav>")]
    assert '<a href="#Verdicts">' in toc and '<a href="#stage_a">' in toc
    assert '<h2 id="stage_a">' in page
    assert '<tr id="stage_a-Stack_' in page  # every case row has an anchor
    broken = next(row for row in page.split("<tr ")
                  if "failed: AssertionError: split outputs differ" in row)
    assert 'class="bad"' in broken.split(">")[0]  # failed rows are highlighted
    good = next(row for row in page.split("<tr ") if "<td>good/token_balanced</td>" in row)
    assert 'class="bad"' not in good.split(">")[0]
    assert '<table class="sortable">' in page and "querySelectorAll(\"table.sortable\")" in page


def test_trace_imbalance_text_explains_its_keys(capsys):
    assert main(["trace-imbalance"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == [
        "trace",
        "batches",
        "mean",
        "p90",
        "unsplittable_fraction",
    ]
    assert "conv" in out and "2421" in out
    for key in ("batches:", "mean:", "p90:", "unsplittable_fraction:"):
        assert f"  {key} " in out


def test_the_report_does_not_import_the_pytest_plugin():
    import subprocess
    import sys

    code = (
        "import sys, pytest_afd.report, pytest_afd.report.compare;"
        "print(sorted(m for m in sys.modules if m in ('pytest', 'pytest_afd.plugin', '_pytest')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def _count_validations(monkeypatch):
    from pytest_afd.report import loading

    calls = []
    original = loading._validation_reason

    def counting(doc):
        calls.append(doc["case_id"])
        return original(doc)

    monkeypatch.setattr(loading, "_validation_reason", counting)
    return calls


def test_sessions_are_filtered_before_validating_and_verdicts_are_cached(
    two_sessions, monkeypatch
):
    calls = _count_validations(monkeypatch)
    report.render(two_sessions, plots=False)
    assert sorted(calls) == [f"stage_a/{n}/token_balanced" for n in ("broken", "crashed", "good")]
    calls.clear()
    text = report.render(two_sessions, plots=False).read_text()
    assert calls == []  # unchanged files: verdicts come from the cache
    assert "2 result(s) of 2 earlier session(s) are not shown" in text
    good = next(two_sessions.glob("stage_a_good*.json"))
    good.write_text(good.read_text().replace('"passed"', '"failed"', 1))  # new size/mtime
    report.render(two_sessions, plots=False)
    assert calls == ["stage_a/good/token_balanced"]


def test_a_changed_file_is_validated_again_not_trusted_from_the_cache(two_sessions):
    report.render(two_sessions, plots=False)
    good = next(two_sessions.glob("stage_a_good*.json"))
    doc = json.loads(good.read_text())
    del doc["metrics"]["ttft_s"]
    good.write_text(json.dumps(doc, indent=2, sort_keys=True))
    text = report.render(two_sessions, plots=False).read_text()
    skipped = text[text.index("## Skipped files") :]
    assert "stage_a/good/token_balanced" in skipped and "ttft_s" in skipped

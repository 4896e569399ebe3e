"""``python -m pytest_afd profile-summary`` on the ascend_pt fixtures (CPU traces: afd_runtime)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_afd.__main__ import main
from pytest_afd.profiling import summary
from pytest_afd.report import profile_plots

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

DATA = Path(__file__).with_name("data")


def test_summary_of_both_roles_writes_json_and_plots(tmp_path, capsys, reused_msprof):
    out = tmp_path / "summary"
    assert main(["profile-summary", f"attention={DATA / 'attention'}", str(DATA / "ffn"),
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    profile = json.loads((out / summary.PROFILE_JSON).read_text())
    # The CLI writes what the API gives (the session's real ascend.analyse of both roles).
    assert len(reused_msprof.reused) == 2
    assert profile == json.loads(json.dumps(reused_msprof.profile))
    assert profile["source"] == "ascend_pt"
    assert set(profile["roles"]) == {"attention", "ffn"}
    written = printed.split("Written:")[1].split()
    assert {Path(p).name for p in written} == {"profile.json", "profile_layers.png",
                                               "profile_overlap.png"}
    # The figures themselves are printed, not only file paths.
    assert "Per role" in printed and "straggler" in printed and "Collectives" in printed
    assert f"{profile['straggler']['slowest_rank']})" in printed
    layers = profile_plots.layer_components(profile)
    assert len(layers) == 3 and "ffn/routed_moe" in layers[2]


def test_summary_json_flag_prints_the_profile(tmp_path, capsys, reused_msprof):
    out = tmp_path / "summary"
    assert main(["profile-summary", f"attention={DATA / 'attention'}", str(DATA / "ffn"),
                 "--output", str(out), "--no-plots", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (out / summary.PROFILE_JSON).read_text())


@pytest.mark.parametrize(("argv", "message"), [
    (["/no/such/dir"], "is not a directory"),
    ([str(DATA)], "cannot tell the role"),
    ([str(DATA / "attention"), f"attention={DATA / 'attention'}"], "a second attention"),
])
def test_bad_directories_are_named(argv, message, capsys, tmp_path):
    assert main(["profile-summary", *argv, "--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().out


def test_empty_directory_is_not_a_profile(tmp_path, capsys):
    (tmp_path / "attn").mkdir()
    assert main(["profile-summary", str(tmp_path / "attn"), "--output", str(tmp_path)]) == 2
    assert "no *_ascend_pt" in capsys.readouterr().out

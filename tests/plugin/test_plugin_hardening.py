"""Hardening of the plugin's session: a crashed xdist worker and bad option values.

Every bad value fails at start-up with a usage error that names the value and
where it came from (CLI flag, env variable, ini key or file), never INTERNALERROR.
"""

import json
import os
import stat
import time
from pathlib import Path

import pytest

from tests.support.forked_pytest import runpytest_forked
from tests.support.plugin_pytester import FAST

pytest_plugins = ["pytester"]

# Collected in this order, xdist's load scheduling hands the first worker
# test_a then test_c: it writes one result, then dies.
CRASH_USER = """
import os
import signal

import pytest

def test_a(record_case):
    record_case()

def test_c():
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.parametrize("n", range(5))
def test_z(record_case, n):
    record_case()
"""


def test_crashed_xdist_worker_fails_its_test_and_keeps_every_result(fork_server, fake):
    fake.makepyfile(test_crash=CRASH_USER)
    result = runpytest_forked(fork_server, fake, *FAST, "-n", "2", "-p", "xdist")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=6, failed=1)  # the killed test is failed, every other test ran
    result.stdout.fnmatch_lines(["*test_crash.py::test_c*", "*worker gw? crashed*read back*"])
    summary = json.loads((fake.path / "afd-results" / "summary.json").read_text())
    [lost] = summary["lost_workers"]
    assert lost["worker"].startswith("gw")
    on_disk = {json.loads(path.read_text())["case_id"]
               for path in (fake.path / "afd-results").glob("*.json") if path.name != "summary.json"}
    assert len(on_disk) == 6
    # Nothing dropped: the live worker's results came back through xdist, the dead
    # worker's were read back from disk, with their test outcomes.
    assert sorted(entry["case_id"] for entry in summary["results"]) == sorted(on_disk)
    assert {entry["outcome"] for entry in summary["results"]} == {"passed"}
    recovered = {entry["case_id"] for entry in summary["results"] if entry.get("recovered")}
    assert recovered == {"test_crash.py::test_a"}


def test_recovery_reads_only_this_sessions_valid_results(tmp_path):
    from pytest_afd.results.directory import results_written_since

    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "broken.json").write_bytes(b"\xff\xfe")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert results_written_since(tmp_path, since=0.0) == []
    assert results_written_since(tmp_path / "missing", since=0.0) == []

def run(pytester, *args):
    return pytester.runpytest(*FAST, *args)


# A test that would leave a marker if it ran: start-up errors must stop the session first.
MARKER_USER = """
def test_workload(tmp_path_factory):
    open("ran.txt", "w").write("ran")
"""


def usage_error(fake, *args, ini=None, env=None, monkeypatch=None):
    """Run with a bad value; the session stops at start-up with a usage error. Returns stderr."""
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    if ini is not None:
        fake.makeini(f"[pytest]\n{ini}\n")
    fake.makepyfile(test_marker=MARKER_USER)
    result = run(fake, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert not (fake.path / "ran.txt").exists()
    err = result.stderr.str()
    assert "INTERNALERROR" not in err + result.stdout.str()
    return err


@pytest.mark.parametrize(
    ("args", "env", "ini", "message"),
    [
        # Empty values are errors, not the default in disguise.
        (["--npu-topology", ""], {}, None, "--npu-topology='': empty"),
        (["--npu-topology", "  "], {}, None, "--npu-topology='  ': empty"),
        (["--afd-results-dir", ""], {}, None, "--afd-results-dir='': empty"),
        # Range errors name where the value came from.
        ([], {"AFD_REPEATS": "2"}, None, "$AFD_REPEATS=2: expected at least 3"),
        ([], {}, "afd_warmups = -1", "ini afd_warmups=-1: expected at least 0"),
        (["--afd-repeats", "1"], {}, None, "--afd-repeats=1: expected at least 3"),
        ([], {"AFD_WARMUPS": "1000000"}, None, "$AFD_WARMUPS=1000000: expected at most 100"),
        (["--afd-seed", "-1"], {}, None, "--afd-seed=-1: expected at least 0"),
        ([], {"AFD_SEED": str(2**32)}, None, "$AFD_SEED=4294967296: expected at most 4294967295"),
        ([], {}, "afd_devices_per_node = 0", "ini afd_devices_per_node=0: expected at least 1"),
        # Only ASCII digits, and no 5,000-digit numbers handed to int().
        (["--afd-repeats", "\u0663"], {}, None, "--afd-repeats='\u0663': expected an integer"),
        (["--afd-seed", "9" * 5000], {}, None, "--afd-seed='99999999999999999999...'"),
        (["--afd-repeats", "1_000"], {}, None, "--afd-repeats='1_000': expected an integer"),
    ],
)
def test_bad_values_name_their_source(fake, monkeypatch, args, env, ini, message):
    err = usage_error(fake, *args, ini=ini, env=env, monkeypatch=monkeypatch)
    assert message in err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (["--npu-topology", "dp\u0663pcp8-ep8"], "non-ASCII character '\u0663' (U+0663)"),
        (["--npu-topology", "dp99999999999pcp8-ep8"], "11-digit size; a topology has at most 8192 ranks"),
        (["--npu-topology", "dp" + "9" * 5000], "is 5002 characters long"),
        (["--npu-topology", "dp1025pcp8"], "needs 8200 ranks"),
        ({"AFD_NPU_TOPOLOGY": "dp9999pcp8"}, "$AFD_NPU_TOPOLOGY: topology 'dp9999pcp8' needs 79992 ranks"),
        ("afd_npu_topology = dp3pcp8-ep8-tp2", "ini afd_npu_topology: topology"),
    ],
)
def test_bad_topologies_are_bounded_usage_errors(fake, monkeypatch, source, message):
    if isinstance(source, list):
        err = usage_error(fake, *source)
    elif isinstance(source, dict):
        err = usage_error(fake, env=source, monkeypatch=monkeypatch)
    else:
        err = usage_error(fake, ini=source)
    assert message in err


def test_alias_file_that_is_binary_or_a_directory_is_a_usage_error(fake, tmp_path):
    binary = tmp_path / "aliases.yaml"
    binary.write_bytes(b"\xff\xfe\x00small: dp2")
    err = usage_error(fake, "--afd-topology-aliases", str(binary))
    assert f"--afd-topology-aliases: topology alias file {binary} is not UTF-8 text" in err
    err = usage_error(fake, "--afd-topology-aliases", str(tmp_path))
    assert f"topology alias file {tmp_path} is a directory" in err


def test_results_dir_that_is_a_file_fails_at_start_up(fake, monkeypatch, tmp_path):
    target = tmp_path / "results-file"
    target.write_text("not a directory")
    err = usage_error(fake, "--afd-results-dir", str(target))
    assert f"--afd-results-dir={str(target)!r} is a file, not a directory" in err
    err = usage_error(fake, env={"AFD_RESULTS_DIR": str(target / "sub")}, monkeypatch=monkeypatch)
    assert f"$AFD_RESULTS_DIR={str(target / 'sub')!r} cannot be created: {str(target)!r} is a file" in err


def _unwritable_dir(tmp_path):
    """A directory this process cannot write in (chmod does not stop root: use a sysfs dir)."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        return locked
    candidate = Path("/sys")
    try:
        probe = candidate / ".afd-probe"
        probe.write_text("x")
    except OSError:
        return candidate
    probe.unlink()
    pytest.skip("running as root on a host whose /sys is writable: no unwritable directory")


def test_unwritable_results_dir_fails_at_start_up(fake, tmp_path):
    locked = _unwritable_dir(tmp_path)
    err = usage_error(fake, "--afd-results-dir", str(locked / "results"))
    assert f"--afd-results-dir={str(locked / 'results')!r} is not writable" in err
    fake.makeini(f"[pytest]\nafd_golden_dir = {locked}\n")
    err = usage_error(fake, "--afd-update-golden")
    assert f"ini afd_golden_dir={str(locked)!r} is not writable" in err


def test_stale_temp_files_of_killed_writes_are_removed_at_session_start(fake):
    results = fake.path / "afd-results"
    (results / "nested").mkdir(parents=True)
    stale = [results / ".case-abc.json.k1l2.tmp", results / "nested" / ".x.json.q.tmp"]
    fresh = results / ".case-def.json.w3.tmp"  # may be a write in flight in another session
    kept = results / "case-abc.json"
    for path in (*stale, fresh, kept):
        path.write_text("{")
    old = time.time() - 3600
    for path in (*stale, kept):
        os.utime(path, (old, old))
    fake.makepyfile(test_x="def test_x():\n    pass\n")
    result = run(fake)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["afd: removed 2 stale temp file(s) of killed writes*"])
    assert not any(path.exists() for path in stale)
    assert fresh.exists() and kept.exists()


def test_help_texts_are_plain_and_show_defaults(fake):
    result = run(fake, "--help")
    text = result.stdout.str()
    section = text[text.index("pytest-afd: AFD prefill harness"):]
    section = section[: section.index("\n\n")]
    assert "`" not in section
    flat = " ".join(section.split())
    for flag, default in (("--afd-backend", "cpu"), ("--afd-model", "reduced"),
                          ("--afd-repeats", "3"), ("--afd-warmups", "1"),
                          ("--afd-run-order", "interleaved"), ("--npu-topology", "dp3pcp8-ep8"),
                          ("--afd-results-dir", "<rootdir>/afd-results")):
        after = flat[flat.index(flag):]
        assert f"(default: {default};" in after[: after.index(" --", 3)], flag

"""--afd-ab-url / --afd-ab-python / --afd-ab-checkout: checked before any case measures, each
error naming the bad value and the flag or variable it came from; each side's environment."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_afd.core.code_identity import checkout_commit, running_code
from pytest_afd.run import ab_sides
from tests.support.inner_pytest import UNRELATED_PLUGINS

REPO = Path(__file__).resolve().parents[2]
SETTINGS_ENV = {"AFD_ASCEND_SERVER_SETTINGS": "{}"}


def _parse(urls=None, pythons=None, checkouts=None, *, settings_ab=None, backend="cpu",
           environ=None, reach=False):
    return ab_sides.parse_sides(urls, pythons, checkouts, settings_ab=settings_ab,
                                backend=backend, environ=environ or {}, reach=reach)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"urls": ["http://h:1", "http://h:2"], "settings_ab": ["chunk_size=8", "chunk_size=16"]},
     "--afd-ab ['chunk_size=8', 'chunk_size=16'] and --afd-ab-url"),
    ({"urls": ["http://h:1", "http://h:2"], "checkouts": [".", "."]},
     "--afd-ab-url compares two deployments"),
    ({"urls": ["http://h:1", "http://h:2"], "backend": "cpu", "environ": SETTINGS_ENV},
     "add --afd-backend vllm-ascend (got 'cpu')"),
    ({"urls": ["http://h:1", "h:2"], "backend": "vllm-ascend", "environ": SETTINGS_ENV},
     "--afd-ab-url B 'h:2': not an http(s)://HOST:PORT URL"),
    ({"urls": ["http://h:1", "http://h:2"], "backend": "vllm-ascend"},
     "--afd-ab-url needs $AFD_ASCEND_SERVER_SETTINGS"),
    ({"urls": ["http://h:1", "http://h:2"], "backend": "vllm-ascend",
      "environ": {**SETTINGS_ENV, "AFD_ASCEND_SERVER_URL": "http://h:3"}},
     "$AFD_ASCEND_SERVER_URL='http://h:3' and --afd-ab-url"),
    ({"checkouts": [str(REPO), str(REPO)], "environ": {"AFD_ASCEND_DEPLOY_COMMAND": "x"}},
     "$AFD_ASCEND_DEPLOY_COMMAND='x' and --afd-ab-checkout"),
    ({"pythons": [sys.executable, "no-such-python3.99"]},
     "--afd-ab-python B 'no-such-python3.99': no such interpreter"),
    ({"checkouts": [str(REPO / "docs"), str(REPO)]},
     f"--afd-ab-checkout A '{REPO / 'docs'}': not a pytest-afd checkout"),
    ({"checkouts": [str(REPO), str(REPO)], "backend": "vllm-ascend"},
     "--afd-ab-checkout compares two code versions of the cpu backend"),
])  # fmt: skip
def test_bad_input_names_the_value_and_where_it_came_from(kwargs, named):
    with pytest.raises(ValueError) as error:
        _parse(**kwargs)
    assert named in str(error.value)


def test_an_unreachable_deployment_is_refused_naming_the_flag_and_side():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ValueError, match=rf"--afd-ab-url A '{url}': deployment unreachable"):
        _parse([url, url], backend="vllm-ascend", environ=SETTINGS_ENV, reach=True)


def test_a_checkout_whose_code_cannot_run_is_refused(tmp_path):
    (tmp_path / "pytest_afd").mkdir()
    (tmp_path / "pytest_afd" / "__init__.py").write_text("")  # no serving package
    # Run from the repository (and an editable install may fill in pytest_afd.serving):
    # neither may stand in for the checkout's own code.
    with pytest.raises(ValueError, match=r"--afd-ab-checkout B '.*': .* not the checkout's code"):
        _parse(checkouts=[str(REPO), str(tmp_path)])


def test_two_checkouts_record_what_each_side_imports_and_its_commit():
    sides = _parse(checkouts=[str(REPO), str(REPO)])
    assert sides.kind == ab_sides.KIND_CODE
    a, b = sides.sides
    assert (a.name, b.name) == ("ab-A", "ab-B")
    assert a.python == sys.executable and a.checkout == str(REPO)
    assert a.code["pytest_afd"] == str(REPO / "pytest_afd")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert a.code["git_commit"] == head
    assert b.declared()["code"] == dict(b.code) and b.declared()["side"] == "B"


def test_each_side_environment_picks_its_own_deployment():
    base = {"PATH": "/bin", "AFD_ASCEND_DEPLOYMENTS": "old.json", "PYTHONPATH": "/elsewhere"}
    url_side = ab_sides.Side("ab-B", "B", url="http://h:2")
    env = ab_sides.side_environ(url_side, base, 48)
    assert env["AFD_ASCEND_SERVER_URL"] == "http://h:2" and "AFD_ASCEND_DEPLOYMENTS" not in env
    code_side = ab_sides.Side("ab-B", "B", python="/py b", checkout="/c b")
    env = ab_sides.side_environ(code_side, base, 48, Path("/r/ab-B/evidence"))
    assert shlex.split(env["AFD_ASCEND_DEPLOY_COMMAND"]) == [
        "env", "PYTHONSAFEPATH=1", "PYTHONPATH=/c b", "AFD_EVIDENCE_DIR=/r/ab-B/evidence", "/py b",
        "-m", "pytest_afd.cli", "deploy-cpu"]  # the server writes its steps where B reads them
    assert env["AFD_EVIDENCE_DIR"] == "/r/ab-B/evidence"
    assert env["AFD_DEVICES_PER_NODE"] == "48" and env["PATH"] == "/bin"


def test_checkout_commit_and_its_absence(tmp_path):
    missing = checkout_commit(tmp_path)
    assert missing["git_commit"]["value"] is None
    assert str(tmp_path) in missing["git_commit"]["absent_reason"]
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("1")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    found = checkout_commit(tmp_path)
    assert len(found["git_commit"]) == 40 and found["git_dirty"] is False
    (tmp_path / "f").write_text("2")
    assert checkout_commit(tmp_path)["git_dirty"] is True
    assert running_code()["pytest_afd"] == str(REPO / "pytest_afd")


def test_served_facts_say_what_is_unknown():
    vllm = ab_sides.served_facts({"base_url": "http://h:2", "server_describe_error": "404",
                                  "deployments": [{"url": "http://h:2", "models": [{"id": "m"}],
                                                   "settings": {"chunk_size": 8}}]})
    assert vllm["url"] == "http://h:2" and vllm["models"] == [{"id": "m"}]
    assert vllm["settings"] == {"chunk_size": 8}
    assert vllm["stand_in_device"] is None and vllm["code"]["absent_reason"] == "404"
    older = ab_sides.served_facts({"base_url": "u", "server": {"backend": {"device": "cpu"}}})
    assert older["stand_in_device"] == "cpu" and "older pytest-afd" in older["code"]["absent_reason"]


def test_a_bad_value_stops_the_session_before_any_case(tmp_path):
    """A real session: usage error (exit 4) naming the value, nothing measured or written."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNRELATED_PLUGINS,
         "-m", "stage_a", "suites/stage_a", "--afd-results-dir", str(tmp_path / "r"),
         "--afd-ab-checkout", str(REPO), str(tmp_path / "nowhere")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"--afd-ab-checkout B '{tmp_path / 'nowhere'}': not a pytest-afd checkout" in done.stderr
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").rglob("*.json"))

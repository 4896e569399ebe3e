"""Goldens shared between writers and manifests (issue 23 rows 7 and 12).

Row 7: two processes recording one golden at once never leave a torn pair
(data of one, sidecar of the other), and a concurrent check reads one pair.
Row 12: a golden is checked under the profile it was recorded with, and one
recorded under another manifest is named field by field (warned, or refused
with ``strict_manifest``).
"""

from __future__ import annotations

import multiprocessing
import re

import numpy as np
import pytest

from pytest_afd.golden.store import (
    GoldenManifestError,
    GoldenManifestWarning,
    GoldenMismatchError,
    GoldenProfileError,
    GoldenStore,
)
from pytest_afd.results.manifest import manifest_differences, manifest_digest

pytest_plugins = ["pytester"]

ROUNDS = 30
NAME = "gate/shared"


def _writer_value(writer: int) -> np.ndarray:
    """Each writer's golden differs in shape and dtype, so a torn pair cannot look whole."""
    if writer == 0:
        return np.arange(64, dtype=np.float32).reshape(8, 8)
    return np.full((4, 3), 7, dtype=np.int64)


def _record_rounds(directory: str, writer: int, start, failures) -> None:
    start.wait(timeout=60)
    store = GoldenStore(directory, update=True)
    reader = GoldenStore(directory)
    for _ in range(ROUNDS):
        store.save(NAME, _writer_value(writer), "exact")
        try:
            reader.load(NAME)  # a read between the other writer's two renames would be torn
        except Exception as error:
            failures.put(f"writer {writer}: {error}")


def test_two_processes_recording_one_golden_never_tear_the_pair(tmp_path):
    context = multiprocessing.get_context("fork")
    start, failures = context.Event(), context.Queue()
    writers = [context.Process(target=_record_rounds, args=(str(tmp_path), w, start, failures))
               for w in (0, 1)]
    for writer in writers:
        writer.start()
    start.set()
    checker = GoldenStore(tmp_path)
    torn = []
    while any(writer.is_alive() for writer in writers):
        try:
            checker.load(NAME)
        except FileNotFoundError:
            continue
        except Exception as error:
            if "not found" not in str(error):
                torn.append(str(error))
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    reported = []
    while not failures.empty():
        reported.append(failures.get())
    assert torn == [] and reported == []
    array, _sidecar = checker.load(NAME)
    assert any(np.array_equal(array, _writer_value(w)) and array.dtype == _writer_value(w).dtype
               for w in (0, 1))


def _manifest(model: str, topology: str = "dp1tp1-ep1") -> dict:
    manifest = {"model": {"name": model, "num_layers": 4}, "topology": {"name": topology},
                "protocol": {"seed": 0}}
    manifest["digest"] = manifest_digest(manifest)
    return manifest


def test_a_golden_is_checked_under_its_recorded_profile(tmp_path):
    GoldenStore(tmp_path, update=True).save("logits", np.ones(4, dtype=np.float32), "exact")
    nudged = np.ones(4, dtype=np.float32) + 1e-7  # inside float32 tolerance, not exact
    with pytest.raises(GoldenProfileError,
                       match="recorded with profile 'exact' but is checked with 'float32'"):
        GoldenStore(tmp_path).check("logits", nudged, profile="float32")
    with pytest.raises(GoldenMismatchError, match=r"elements differ \(exact\)"):
        GoldenStore(tmp_path).check("logits", nudged)  # no profile: the recorded one
    assert GoldenStore(tmp_path).check("logits", np.ones(4, dtype=np.float32)).profile == "exact"
    assert GoldenStore(tmp_path).check("logits", np.ones(4, dtype=np.float32),
                                       profile="exact").ok


def test_a_golden_from_another_manifest_names_the_fields_that_differ(tmp_path):
    recorded, current = _manifest("reduced"), _manifest("full", topology="dp2tp1-ep2")
    GoldenStore(tmp_path, update=True, manifest=recorded).save("tokens", [3, 1, 4], "exact")
    checking = GoldenStore(tmp_path, manifest=current)
    with pytest.warns(GoldenManifestWarning) as caught:
        result = checking.check("tokens", [3, 1, 4])
    message = str(caught[0].message)
    assert result.ok and "2 manifest field(s) differ" in message
    assert "/model/name (recorded 'reduced', this run 'full')" in message
    assert "/topology/name (recorded 'dp1tp1-ep1', this run 'dp2tp1-ep2')" in message
    assert "sha256:" not in message and result.details["manifest_mismatch"] == message
    with pytest.raises(GoldenManifestError, match=re.escape("/model/name (recorded 'reduced'")):
        GoldenStore(tmp_path, manifest=current, strict_manifest=True).check("tokens", [3, 1, 4])
    same = GoldenStore(tmp_path, manifest=_manifest("reduced"), strict_manifest=True)
    assert same.check("tokens", [3, 1, 4]).details == {}


def test_a_shape_mismatch_under_another_manifest_names_fields_not_digests(tmp_path):
    GoldenStore(tmp_path, update=True, manifest=_manifest("reduced")).save("t", [1, 2], "exact")
    with pytest.warns(GoldenManifestWarning), pytest.raises(GoldenMismatchError) as raised:
        GoldenStore(tmp_path, manifest=_manifest("full")).check("t", [1, 2, 3])
    assert "shape (3,) != expected shape (2,)" in str(raised.value)
    assert "/model/name (recorded 'reduced', this run 'full')" in str(raised.value)
    assert "sha256:" not in str(raised.value)


def test_a_golden_with_only_a_digest_still_says_it_came_from_another_manifest(tmp_path):
    GoldenStore(tmp_path, update=True, manifest_digest="sha256:aaa").save("t", [1], "exact")
    with pytest.warns(GoldenManifestWarning, match="its fields were not recorded"):
        GoldenStore(tmp_path, manifest_digest="sha256:bbb").check("t", [1])


def test_manifest_differences_walks_to_the_leaves():
    assert manifest_differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": 4}}) == [
        ("/a/c", 2, 3), ("/a/d", "<missing>", 4)]
    assert manifest_differences({"a": [1, 2]}, {"a": [1, 2]}) == []


PLUGIN_GOLDEN_USER = """
import numpy as np

def test_tokens(golden):
    golden.check("gate/tokens", np.array([3, 1, 4]))
"""


def test_the_golden_fixture_names_the_manifest_fields_of_another_run(pytester, monkeypatch):
    """Through the plugin: recorded under one --afd-model, checked under another."""
    from tests.support.plugin_pytester import AFD_ENV, FAKE_CONFTEST, FAST

    for name in AFD_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_UNAVAILABLE", "1")
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(pytester.path / "closed.txt"))
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_golden=PLUGIN_GOLDEN_USER.replace(
        "np.array([3, 1, 4]))", "np.array([3, 1, 4]), profile='exact')"))
    pytester.runpytest(*FAST, "--afd-update-golden").assert_outcomes(passed=1)
    pytester.makepyfile(test_golden=PLUGIN_GOLDEN_USER)
    same = pytester.runpytest(*FAST)
    same.assert_outcomes(passed=1)
    assert "GoldenManifestWarning" not in same.stdout.str()
    other = pytester.runpytest(*FAST, "--afd-model", "full")
    other.assert_outcomes(passed=1, warnings=1)
    other.stdout.fnmatch_lines(["*GoldenManifestWarning*/model/name (recorded 'reduced', "
                                "this run 'full')*"])

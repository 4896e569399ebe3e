"""--afd-ab-url / --afd-ab-python / --afd-ab-checkout: every stage case measured on side A's
backend and on side B's, alternating repetition by repetition; each result says its side.

The end-to-end run with two real checkouts (each side's own CPU server) is
tests/cli/test_ab_code_versions_e2e.py (slow); here the two sides are two scripted backends.
"""

from __future__ import annotations

from scripted_backend import ScriptedBackend, measure_ab_alternating

from pytest_afd.core.backend import CAP_PREFIX_CACHE, CAP_SPLIT
from pytest_afd.run import ab, ab_sides
from pytest_afd.stats import conclusions

SERVED_CODE = {"python": "/py-b", "python_version": "3.12.0", "pytest_afd": "/checkout-b/pytest_afd"}


class ServedBackend(ScriptedBackend):
    """A scripted backend that describes itself as the harness's server at ``url`` does."""

    def __init__(self, capabilities, url, code):
        super().__init__(capabilities)
        self.url, self.code = url, code

    def describe(self):
        return {"base_url": self.url, "server": {"backend": {"device": "cpu"}, "code": self.code}}


class SidePool:
    """The stage pool's ``side``: side A is the runner's handle, side B another backend."""

    def __init__(self, handle_b):
        self.handle_b, self.asked = handle_b, []

    def side(self, side, handle):
        self.asked.append((side, handle))
        return handle if side == ab.SIDES[0] else self.handle_b


def _sides():
    return ab_sides.AbSides(ab_sides.KIND_CODE, (
        ab_sides.Side("ab-A", "A", python="/py-a", checkout="/checkout-a",
                      code={"git_commit": "a" * 40}),
        ab_sides.Side("ab-B", "B", python="/py-b", checkout="/checkout-b",
                      code={"git_commit": "b" * 40})))


def test_each_side_runs_on_its_own_backend_alternately_and_says_so(make_runner, stage_helpers):
    runner, backend_a = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE})
    backend_b = ServedBackend({CAP_SPLIT, CAP_PREFIX_CACHE}, "http://127.0.0.1:2", SERVED_CODE)
    handle_b = stage_helpers.BackendHandle(backend_b, runner.handle.manifest, runner.topology,
                                           "reduced")
    runner.pool, runner.ab, runner.ab_sides = SidePool(handle_b), ab.SAME_SETTINGS, _sides()
    measured = measure_ab_alternating(runner)  # A, B, A, B ... per repetition
    # Each backend ran only its own side: 2 cases x (1 warmup + 3 repetitions) each.
    assert [name for name, _ in backend_a.calls].count("run") == 2 * 4
    assert [name for name, _ in backend_b.calls].count("run") == 2 * 4
    assert measured["x/ab-A"].case.handle is runner.handle
    assert measured["x/ab-B"].case.handle is handle_b
    assert measured["x/ab-B"].case.settings == measured["x/ab-A"].case.settings  # same settings
    docs = {doc["case_id"].rpartition("/")[2] + doc["case_id"].split("/")[-2]: doc
            for doc in runner.writer.docs}
    side_b = docs["ab-Bx"]["evidence"]["ab_side"]
    assert side_b["side"] == "B" and side_b["kind"] == "code"
    assert side_b["checkout"] == "/checkout-b" and side_b["code"]["git_commit"] == "b" * 40
    assert side_b["served"]["code"] == SERVED_CODE  # what B's server imported
    assert side_b["served"]["url"] == "http://127.0.0.1:2"
    assert side_b["served"]["stand_in_device"] == "cpu"
    side_a = docs["ab-Ax"]["evidence"]["ab_side"]
    assert side_a["side"] == "A" and side_a["code"]["git_commit"] == "a" * 40
    # Side A's backend reports no deployment: said, never invented.
    assert side_a["served"]["url"]["absent_reason"]
    assert side_a["served"]["code"]["absent_reason"]
    text = conclusions.ab_text(runner.writer.docs)
    assert text.startswith("interleaved A/B: B / A geometric mean x1 over 2 case(s)")


def test_without_sides_every_case_keeps_its_handle(make_runner):
    runner, _ = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE})
    runner.ab = ab.SAME_SETTINGS
    workload = runner.workload("uniform")
    measured = runner.measure([runner.case(name="x", workload=workload, settings=runner.settings())])
    assert measured["x/ab-B"].case.handle is measured["x/ab-A"].case.handle is runner.handle
    assert all("ab_side" not in doc["evidence"] for doc in runner.writer.docs)

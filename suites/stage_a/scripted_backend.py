"""A scripted backend, a collecting result writer and the A/B alternation check for the
stage protocol's own tests (test_stage_a_runner.py, test_stage_ab_*.py; their
``make_runner`` fixture is in this directory's conftest)."""

from __future__ import annotations

from pytest_afd.core.backend import RequestOutput, RunOutputs
from pytest_afd.results.documents import build_result, validate_result
from pytest_afd.run import ab

INSTRUMENTED_WALL_S = 4.0
MEASURED_WALL_S = 2.0
AB_CASES = ("x", "y")
REPETITIONS = 3


def ab_case_sides() -> list[str]:
    """Every case's A and B result names, in the order the protocol runs them."""
    return [f"{name}/{side}" for name in AB_CASES for side in ab.SIDES]


def measure_ab_alternating(runner) -> dict:
    """Measure cases x and y under the runner's A/B sides and assert the executed order
    alternates A, B within every repetition; returns what ``runner.measure`` returned."""
    workload = runner.workload("uniform")
    cases = [runner.case(name=name, workload=workload, settings=runner.settings())
             for name in AB_CASES]
    measured = runner.measure(cases)
    assert measured["x/ab-A"].result["protocol"]["executed_order"] == [
        f"{side}#{r}" for r in range(REPETITIONS) for side in ab_case_sides()]
    return measured


class ScriptedBackend:
    """Records every call; one forward step per run, split in two equal ubatches."""

    name = "scripted"

    def __init__(self, capabilities, report_steps=True):
        self.capabilities = frozenset(capabilities)
        self.report_steps = report_steps
        self.calls: list[tuple[str, object]] = []

    def run(self, prompts, settings):
        self.calls.append(("run", (len(prompts), settings.instrument)))
        total = sum(p.num_prompt_tokens for p in prompts)
        half = total // 2
        return RunOutputs(
            requests=[
                RequestOutput(p.request_id, p.num_prompt_tokens, 0, next_token=0, ttft_s=0.5)
                for p in prompts
            ],
            steps=[
                {
                    "policy": settings.split_policy,
                    "split_token": half,
                    "ubatches": [
                        {"num_real_tokens": half, "num_padded_tokens": 0},
                        {"num_real_tokens": total - half, "num_padded_tokens": 0},
                    ],
                    "imbalance": abs(total - 2 * half) / total,
                }
            ]
            if self.report_steps
            else [],
            expert_load=[],
            timings={"layers": [{"attention": 0.1}]} if settings.instrument else {},
            wall_time_s=INSTRUMENTED_WALL_S if settings.instrument else MEASURED_WALL_S,
        )

    def reset_prefix_cache(self):
        self.calls.append(("reset", None))

    def describe(self):
        return {}

    def close(self):
        pass


class CollectingWriter:
    """A result writer that validates and keeps documents instead of writing files."""

    def __init__(self):
        self.docs = []

    def build(self, *, case_suffix, **fields):
        # Like the plugin's writer: the session protocol unless the case gives its own.
        fields.setdefault(
            "protocol", {"seed": 0, "warmups": 1, "repetitions": 3, "run_order": "interleaved"}
        )
        return build_result(
            case_id=f"runner-test/{case_suffix}", case_kind="stage_a", backend="scripted", **fields
        )

    def write(self, doc):
        validate_result(doc)
        self.docs.append(doc)
        return None

"""A scripted backend and a collecting result writer for the stage protocol's own tests
(test_stage_a_runner.py, test_stage_ab_interleaved.py; their ``make_runner`` fixture is in
this directory's conftest)."""

from __future__ import annotations

from pytest_afd.core.backend import RequestOutput, RunOutputs
from pytest_afd.results.documents import build_result, validate_result

INSTRUMENTED_WALL_S = 4.0
MEASURED_WALL_S = 2.0


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

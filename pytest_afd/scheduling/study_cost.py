"""What a selection costs on the devices, before it runs (``--afd-list-deployments``, issue 43).

Every redeploy costs minutes of the recipe's two nodes and every repetition is
NPU time, so the listing says what the selected cases will spend:

    device time = deploys x deploy time
                + runs x modelled step time

* ``deploys``: how many times configurations are deployed when the cases run in
  :func:`configuration_order` and a deployment is stopped once no later case
  declares it (``deployment_plan``'s rule), counted by replaying that rule
  (:func:`deploys_needed`); the same count with each stage in its own session is
  given beside it, which is what running the stages together saves.
* ``deploy time``: the median of the deploy times recorded by earlier sessions
  (``<results dir>/deployments/*/deploy-times.json``), else ``--afd-deploy-time-s``,
  else :data:`DEFAULT_DEPLOY_TIME_S`, a stated default, never a measurement.
  A given flag wins over a recording (the user knows their cluster).
* ``runs``: per declared configuration, its cases x (warmups + repetitions); a
  declaration may say how many measured cases use the configuration (``cases``,
  default 1). Under ``--afd-sequential`` the repetitions are a range: the first
  look to ``--afd-max-repeats``.
* ``step time``: :data:`afd_split.plan.npu_step.RECIPE_NPU_STEP` (CloudMatrix-Infer's
  6,688 prefill tokens/s per 910C NPU on the recipe's 32 NPUs), one step of the
  recipe's 140,000 tokens per run: an upper bound for the stage workloads
  (65,536 logical tokens at scale 1).

Pure functions; the listing (``pytest_afd.run.deployment_plan``) calls :func:`estimate`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from afd_split.plan.npu_step import RECIPE_NPU_STEP, RECIPE_STEP_TOKENS, NpuStepModel

DEFAULT_DEPLOY_TIME_S = 600.0
"""Ten minutes per two-node deployment (weights load, graph warmup, health): a stated
default for a listing without a recording or ``--afd-deploy-time-s``."""
DEPLOY_TIMES_FILE = "deploy-times.json"
"""Written by the deploy pool next to its plans: ``{settings key: [seconds, ...]}``."""
DEPLOYMENTS_SUBDIR = "deployments"


def configuration_order(nodeids: Sequence[str], keys: Mapping[str, Sequence[str]]) -> list[str]:
    """Cases ordered so that cases sharing a configuration run together.

    Each configuration gets the rank of its first declaration; a case sorts by
    the sorted ranks of its configurations (stable), so cases with the same
    first configuration are adjacent, identical sets stay together, and
    undeclared cases (gates: they deploy on first use) run first.
    """
    rank: dict[str, int] = {}
    for nodeid in nodeids:
        for key in keys.get(nodeid, ()):
            rank.setdefault(key, len(rank))
    return sorted(nodeids, key=lambda nodeid: sorted(rank[k] for k in keys.get(nodeid, ())))


def deploys_needed(order: Sequence[str], keys: Mapping[str, Sequence[str]]) -> int:
    """Deploys when cases run in ``order``: a configuration is deployed when a case needs
    it and is not up, and stopped after the last case (from here on) that declares it."""
    up: set[str] = set()
    deploys = 0
    for index, nodeid in enumerate(order):
        for key in keys.get(nodeid, ()):
            if key not in up:
                up.add(key)
                deploys += 1
        later = {key for other in order[index + 1:] for key in keys.get(other, ())}
        up &= later
    return deploys


def deploys_by_session(sessions: Mapping[str, Sequence[str]],
                       keys: Mapping[str, Sequence[str]]) -> int:
    """Deploys when every session (a stage) runs on its own: each deploys its own set."""
    return sum(len({k for nodeid in nodeids for k in keys.get(nodeid, ())})
               for nodeids in sessions.values())


def recorded_deploy_times(results_dir: Path) -> list[float]:
    """Every deploy time earlier sessions recorded under ``results_dir`` (may be empty)."""
    found: list[float] = []
    for path in sorted((results_dir / DEPLOYMENTS_SUBDIR).glob(f"*/{DEPLOY_TIMES_FILE}")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a deploy-times JSON ({error})") from None
        for key, seconds in document.items():
            if not isinstance(seconds, list) or not all(
                    isinstance(s, int | float) and s > 0 for s in seconds):
                raise ValueError(f"{path}: {key!r} must list deploy seconds > 0, got {seconds!r}")
            found.extend(float(s) for s in seconds)
    return found


def deploy_time(given_s: float | None, results_dir: Path) -> tuple[float, str]:
    """(seconds, where they came from): the flag, else the recordings' median, else the default."""
    if given_s is not None:
        return given_s, "--afd-deploy-time-s"
    recorded = recorded_deploy_times(results_dir)
    if recorded:
        return (statistics.median(recorded),
                f"median of {len(recorded)} deploy times recorded under "
                f"{results_dir / DEPLOYMENTS_SUBDIR}")
    return DEFAULT_DEPLOY_TIME_S, (f"stated default ({DEFAULT_DEPLOY_TIME_S:g} s): no recorded "
                                   "deploy times and no --afd-deploy-time-s")


def estimate(*, runs_per_repetition: int, cases: int, deploys: int, deploys_separately: int,
             deploy_s: float, deploy_source: str, warmups: int, repetitions: tuple[int, int],
             model: NpuStepModel = RECIPE_NPU_STEP,
             run_tokens: int = RECIPE_STEP_TOKENS) -> dict[str, Any]:
    """The listing's ``estimated_device_time``: low/high device seconds and NPU hours.

    ``runs_per_repetition``: measured cases (summed over the declared configurations);
    ``repetitions``: (fewest, most) measured repetitions per case (equal when fixed).
    """
    step_s = model.step_s(run_tokens)
    low_runs, high_runs = (runs_per_repetition * (warmups + n) for n in repetitions)
    deploy_total = deploys * deploy_s
    low, high = deploy_total + low_runs * step_s, deploy_total + high_runs * step_s
    return {
        "device_s": {"low": low, "high": high},
        "npu_hours": {"low": low * model.npus / 3600, "high": high * model.npus / 3600},
        "deploys": deploys,
        "deploys_if_each_stage_ran_alone": deploys_separately,
        "deploy_time_s": deploy_s,
        "deploy_time_source": deploy_source,
        "deploy_s_total": deploy_total,
        "declared_cases": cases,
        "measured_cases": runs_per_repetition,
        "runs": {"low": low_runs, "high": high_runs},
        "warmups": warmups,
        "repetitions": {"low": repetitions[0], "high": repetitions[1]},
        "modelled_step_s": step_s,
        "run_tokens": run_tokens,
        "npu_step_model": model.to_evidence(),
        "assumptions": [
            f"one run = one prefill step of {run_tokens} tokens on the deployment "
            f"({step_s:.3f} s): an upper bound for the stage workloads",
            f"step time from {model.source} on {model.npus} NPUs; no host or HTTP overhead",
            "a declared configuration is used by its `cases` count of measured cases "
            "(default 1 per test)",
            "each deployment is stopped once no later case declares it (deployment order)",
            "instrumented runs and prefix-cache seed runs are not counted",
        ],
        "summary": (f"estimated device time {low / 60:.1f}" + (
            f"-{high / 60:.1f}" if high != low else "") + f" min ({deploys} deploys x "
            f"{deploy_s:g} s + {low_runs}" + (f"-{high_runs}" if high_runs != low_runs else "")
            + f" runs x {step_s:.3f} s); {deploys_separately} deploys if each stage ran alone"),
    }

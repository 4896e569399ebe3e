"""Result documents with a planted truth for the publication tests (tests/study/).

Each condition is a pair of cases (request_boundary, token_balanced) on a
workload whose request-boundary split leaves a planted realized imbalance;
token_balanced's throughput is ``ratio`` times the control's, with seeded
log-normal repetition noise of ``cv``. Documents are built by
pytest_afd.results.documents and validated against schemas/result.schema.json by
``write``.
"""

from __future__ import annotations

import copy
import functools
import math

import numpy as np

from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.topology.spec import parse_topology

TOPOLOGY = "dp3pcp8-ep8"
STACK_COMMIT = "0123abc"
REQUESTS = 4
PROMPT_TOKENS = 1000
BASE_WALL_S = 1.0
SESSION = "session-1"


def make_manifest(*, num_layers=10, emulated=True, vllm_ascend=STACK_COMMIT, repetitions=5,
                  routing="natural", topology=TOPOLOGY):
    """A manifest for these arguments: probed once per process, a deep copy each call.

    Why cached: the probe runs ``git describe`` and reads package metadata (about
    25 ms a call) and its answer cannot change within a test session; the copy keeps
    one test's edits out of another's documents.
    """
    return copy.deepcopy(_probed_manifest(num_layers, emulated, vllm_ascend, repetitions,
                                          routing, topology))


@functools.cache
def _probed_manifest(num_layers, emulated, vllm_ascend, repetitions, routing, topology):
    protocol = {"seed": 0, "warmups": 1, "repetitions": repetitions, "run_order": "interleaved",
                "instrumented": False, "routing": routing}
    description = {"model": {"num_layers": num_layers, "quantization": "none"},
                   "software": {"vllm_ascend_revision": vllm_ascend}}
    return collect_manifest(topology=parse_topology(topology), backend_name="cpu" if emulated
                            else "vllm_ascend", backend_description=description,
                            model_name="reduced" if num_layers < 61 else "full",
                            protocol=protocol, emulated=emulated, environ={})


def _steps(policy, imbalance):
    """One split step; request_boundary carries the planted imbalance, token_balanced none."""
    planted = imbalance if policy == "request_boundary" else 0.0
    total = REQUESTS * PROMPT_TOKENS
    first = round(total / 2 * (1 + planted))
    return [{"policy": policy, "split_token": first, "imbalance": planted,
             "ubatches": [{"num_real_tokens": first, "num_padded_tokens": 0},
                          {"num_real_tokens": total - first, "num_padded_tokens": 0}]}]


def _runs(policy, *, imbalance, ratio, cv, repetitions, rng, hit=0.0):
    speed = ratio if policy == "token_balanced" else 1.0
    cached = round(PROMPT_TOKENS * hit)
    runs = []
    for _ in range(repetitions):
        wall = BASE_WALL_S / speed * math.exp(rng.normal(0.0, cv))
        requests = [RequestOutput(f"r{i}", PROMPT_TOKENS, cached, 1, ttft_s=wall * (i + 1) / REQUESTS)
                    for i in range(REQUESTS)]
        runs.append(RunOutputs(requests=requests, steps=_steps(policy, imbalance),
                               expert_load=[[10] * 8], wall_time_s=wall))
    return runs


def make_case(condition, policy, *, imbalance, ratio=1.0, cv=0.02, repetitions=5, seed=0,
              manifest=None, kind="stage_c", routing="natural", instrument=False,
              session=SESSION, hit=0.0, status="passed", chunk_size=None):
    """One case ``<condition>/<policy>`` whose control split leaves ``imbalance``."""
    rng = np.random.default_rng([seed, ("request_boundary", "token_balanced").index(policy), round(imbalance * 1000)])
    runs = _runs(policy, imbalance=imbalance, ratio=ratio, cv=cv, repetitions=repetitions,
                 rng=rng, hit=hit)
    settings = RunSettings(split_policy=policy, routing=routing, instrument=instrument,
                           prefix_caching=hit > 0, chunk_size=chunk_size)
    evidence = results.evidence_from_outputs(runs[0], routing=routing, num_ep_ranks=4,
                                             requested_hit_ratio=hit or None)
    manifest = manifest or make_manifest()
    doc = results.build_result(
        case_id=f"{condition}/{policy}", case_kind=kind, backend=manifest["backend"]["name"],
        settings=settings, manifest=manifest, protocol={
            "seed": 0, "warmups": 1, "repetitions": repetitions, "run_order": "interleaved"},
        workload=results.workload_json(dataset_name=condition.rsplit("/", 1)[-1],
                                       prompt_lengths=[PROMPT_TOKENS] * REQUESTS, seed=0),
        metrics=results.metrics_from_runs(runs), evidence=evidence,
        created_at="2026-12-07T12:00:00+00:00")
    doc["session_id"] = session
    doc["outcome"] = {"status": status, "reason": None}
    return doc


PLANTED_IMBALANCES = (0.0, 0.1, 0.2, 0.4, 0.5, 0.6)
PLANTED_THRESHOLD = 0.3
PLANTED_RATIO = 1.2


def planted_pairs(*, imbalances=PLANTED_IMBALANCES, threshold=PLANTED_THRESHOLD,
                  ratio=PLANTED_RATIO, seed=0, **kwargs):
    """token_balanced ahead by ``ratio`` only above ``threshold``; no difference below."""
    docs = []
    for imbalance in imbalances:
        condition = f"stage_c/imbalance-{imbalance:.2f}"
        truth = ratio if imbalance > threshold else 1.0
        for policy in ("request_boundary", "token_balanced"):
            docs.append(make_case(condition, policy, imbalance=imbalance, ratio=truth, seed=seed,
                                  **kwargs))
    return docs


def write(directory, doc):
    """Validated against schemas/result.schema.json before it is written."""
    return results.write_result(results.result_path(directory, doc["case_id"]), doc)


def freeze_study(directory, manifest, *, name="planted", reduced_layers=10):
    """A study frozen from ``manifest`` (what ``study freeze --from-manifest`` writes)."""
    import argparse
    import json

    from pytest_afd.study import freeze

    source = directory / "frozen-from.json"
    source.write_text(json.dumps(manifest))
    output = directory / f"{name}.study.json"
    parser = argparse.ArgumentParser()
    freeze.add_arguments(parser)
    args = parser.parse_args(["--name", name, "--output", str(output), "--from-manifest",
                              str(source), "--checkpoint", "full", "--layers", "61",
                              "--reduced-checkpoint", "reduced",
                              "--reduced-layers", str(reduced_layers)])
    study = freeze.build_study(args)
    output.write_text(json.dumps(study, indent=2))
    return output


def with_profile(doc, *, ratio, schedule):
    """``doc`` carrying one instrumented run's profile (schema-valid, empty trace tables)."""
    profile = {
        "source": "torch_trace", "analyzer": {"name": "torch.profiler", "version": "test"},
        "roles": {}, "per_layer": [], "unclassified": [], "per_step": [], "collectives": [],
        "straggler": results.absent("no FFN role traced"), "schedule": dict(schedule),
        "profiler_overhead": {"instrumented_wall_s": ratio * BASE_WALL_S,
                              "non_instrumented_wall_s": BASE_WALL_S, "ratio": ratio},
    }
    profiled = {**doc, "evidence": {**doc["evidence"], "profile": profile}}
    results.validate_result(profiled)
    return profiled

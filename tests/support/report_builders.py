"""Result documents for report tests, built and validated by pytest_afd.results.documents.

Imported by the tests of this directory (pytest puts it on sys.path).
"""

import copy
import functools

import numpy as np

from afd_split import SplitConstraints, SplitPolicy, plan_split
from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.stats.host import HostSample, host_json
from pytest_afd.stats.repetitions import execution_order
from pytest_afd.topology.spec import parse_topology

SMALL = {"target_total_tokens": 16384, "scale": 1 / 32, "block_size": 16, "vocab_size": 128}
REPS = 3
NUM_EXPERTS = 8
NUM_LAYERS = 3
EP_RANKS = 4
HOST_CPUS = 2


def make_manifest(num_layers=NUM_LAYERS, topology="dp3pcp8-ep8", model_name="reduced"):
    """A manifest for these arguments: probed once per process, a deep copy each call.

    Why cached: the probe runs ``git describe`` and reads package metadata (about
    25 ms a call, most of a synthetic result's build time) and its answer cannot change
    within a test session; the copy keeps one test's edits out of another's documents.
    """
    return copy.deepcopy(_probed_manifest(num_layers, topology, model_name))


@functools.cache
def _probed_manifest(num_layers, topology, model_name):
    protocol = {
        "seed": 0,
        "warmups": 1,
        "repetitions": REPS,
        "run_order": "interleaved",
        "instrumented": False,
        "routing": "natural",
    }
    return collect_manifest(
        topology=parse_topology(topology),
        backend_name="cpu",
        backend_description={"model": {"num_layers": num_layers}},
        model_name=model_name,
        protocol=protocol,
        emulated=True,
        environ={},
    )


def _protocol(case_id):
    order = execution_order([case_id], REPS, "interleaved", 0)
    return {
        "seed": 0,
        "warmups": 1,
        "repetitions": REPS,
        "run_order": "interleaved",
        "executed_order": [f"{name}#{rep}" for name, rep in order],
    }


def _expert_load(skewed):
    base = np.full((NUM_LAYERS, NUM_EXPERTS), 10)
    if skewed:
        base[:, 0] = 50  # expert 0 is hot: rank 0 holds 60 of 120 tokens per layer
    return base.tolist()


def host_sample(wall, cpu, load):
    """What host.measured_run records for one repetition, at a steady 1-minute ``load``."""
    loads = (load, load, load)
    return HostSample(wall_time_s=wall, cpu_time_s=cpu, process_cpu_time_s=cpu,
                      load_before=loads, load_after=loads)


def _runs(workload, policy, *, wall_s, chunk_size=None, timings=None, skewed=False,
          spread=0.1, host=None):
    """REPS synthetic backend runs; wall time grows ``spread`` (10 %) per repetition.

    ``host`` = (CPU seconds, 1-minute load): each run carries a host sample
    whose CPU time grows 1 % per repetition.
    """
    lengths = list(workload.prompt_lengths)
    plan = plan_split(lengths, policy=SplitPolicy(policy), constraints=SplitConstraints())
    runs = []
    for rep in range(REPS):
        wall = wall_s * (1 + spread * rep)
        requests = [
            RequestOutput(
                request_id=p.request_id,
                num_prompt_tokens=p.num_prompt_tokens,
                num_cached_tokens=workload.cached_prefix_tokens[i],
                next_token=1,
                ttft_s=wall * (i + 1) / len(lengths),
            )
            for i, p in enumerate(workload.prompts())
        ]
        runs.append(
            RunOutputs(
                requests=requests,
                steps=[plan.to_evidence()],
                expert_load=_expert_load(skewed),
                timings=timings or {},
                wall_time_s=wall,
            )
        )
        if host is not None:
            cpu_s, load = host
            runs[-1].host = host_sample(wall, cpu_s * (1 + 0.01 * rep), load)
    return runs


def make_result(
    case_id,
    kind,
    workload,
    policy,
    *,
    wall_s=1.0,
    manifest=None,
    chunk_size=None,
    chunk_plan=None,
    timings=None,
    routing="natural",
    skewed=False,
    spread=0.1,
    host=None,
    fault=None,
):
    """``host`` = (CPU seconds, load) records host conditions; ``fault`` (a
    perf_fault.Slowdown) is applied to every run as the live fault would."""
    runs = _runs(workload, policy, wall_s=wall_s, timings=timings, skewed=skewed,
                 spread=spread, host=host)
    if fault is not None:
        runs = [fault.slowed(run) for run in runs]
    settings = RunSettings(
        split_policy=policy,
        chunk_size=chunk_size,
        routing=routing,
        prefix_caching=workload.shared_prefix_tokens > 0,
    )
    extra = {} if chunk_plan is None else {"chunk_plan": chunk_plan}
    doc = results.build_result(
        case_id=case_id,
        case_kind=kind,
        backend="cpu",
        settings=settings,
        manifest=manifest or make_manifest(),
        workload=results.workload_json(
            dataset_name=workload.name,
            prompt_lengths=workload.prompt_lengths,
            seed=workload.spec.seed,
            dataset_digest=workload.content_hash,
        ),
        protocol=_protocol(case_id),
        metrics=results.metrics_from_runs(runs),
        host=None if host is None else host_json([r.host for r in runs], cpus=HOST_CPUS),
        evidence=results.evidence_from_outputs(
            runs[0],
            routing=routing,
            num_ep_ranks=EP_RANKS,
            requested_hit_ratio=workload.spec.requested_hit_ratio or None,
            **extra,
        ),
    )
    return doc


def write(directory, doc):
    """write_result validates against the schema first (an invalid doc raises)."""
    return results.write_result(results.result_path(directory, doc["case_id"]), doc)


def stamped(doc, status, *, session, created_at, reason=None):
    """``doc`` as the plugin writes it since outcomes: a session id and the test's outcome."""
    return {
        **doc,
        "session_id": session,
        "outcome": {"status": status, "reason": reason},
        "created_at": created_at,
    }

"""Stage F (optional): PP comparison (RFC "Experiment matrix", Stage F).

The best stable AFD configuration (token-balanced, the session's AFD layout)
against a pipeline-parallel layout with the same total device count, on the
full model with natural routing, the same workload, cold prefix cache, no
chunking, and the same warmup/repetition rules; both sides are measured in
one interleaved schedule. :func:`stage_f_parity.parity_check` labels both
results ``comparable`` or ``exploratory`` and names every failed condition:
a backend that does not declare a validated pipeline-parallel configuration
can only produce an exploratory comparison.
"""

from __future__ import annotations

import pytest
from stage_f_parity import COMPARABLE, ParityFacts, parity_check, pp_layout_for

from pytest_afd.core.backend import CAP_PIPELINE_PARALLEL, CAP_SPLIT

pytestmark = [pytest.mark.stage_f, pytest.mark.slow]

MODEL = "full"
WORKLOAD = "trace_conv"
AFD_POLICY = "token_balanced"
PP_POLICY = "none"  # a PP layout runs no async-MoE dual batching
SIZE = 0.5  # multiplier on the stage scale (the full model is the expensive one)


def _validation(backend, capability, layout) -> tuple[bool, str]:
    if capability in backend.capabilities:
        return True, ""
    return False, (
        f"backend {backend.name!r} does not declare {capability!r}: the {layout} layout is not a "
        "validated configuration there"
    )


def _next_tokens(run) -> dict[str, int]:
    return {request.request_id: request.next_token for request in run.requests}


def _deployments(context):
    if not context.topology.is_afd:
        return []
    return [
        {"split_policy": AFD_POLICY, "routing": "natural", "model": MODEL},
        {"split_policy": PP_POLICY, "routing": "natural", "model": MODEL,
         "npu_topology": pp_layout_for(context.topology)},
    ]


@pytest.mark.afd_deployments.with_args(_deployments)
def test_stage_f_afd_vs_pp(stage_runner):
    if not stage_runner.topology.is_afd:
        pytest.skip(
            f"--npu-topology {stage_runner.topology} is not an AFD layout: nothing to compare"
        )
    afd = stage_runner.on(model_name=MODEL)
    pp_spec = pp_layout_for(afd.topology)
    pp = stage_runner.on(model_name=MODEL, topology_spec=pp_spec)
    workload = afd.workload(WORKLOAD, scale=afd.sizes.scale * SIZE)
    cases = [
        afd.case(
            name=f"afd/{afd.topology.canonical}",
            workload=workload,
            settings=afd.settings(split_policy=AFD_POLICY, routing="natural"),
        ),
        pp.case(
            name=f"pp/{pp_spec}",
            workload=workload,
            settings=pp.settings(split_policy=PP_POLICY, routing="natural"),
        ),
    ]
    measured = afd.measure(cases, write=False)
    afd_item, pp_item = (measured[case.name] for case in cases)
    facts = [
        ParityFacts.from_result(
            item.result,
            layout=layout,
            validated=validated,
            validation_note=note,
            next_tokens=_next_tokens(item.representative),
        )
        for item, layout, (validated, note) in (
            (afd_item, "afd", _validation(afd.backend, CAP_SPLIT, afd.topology.canonical)),
            (pp_item, "pp", _validation(pp.backend, CAP_PIPELINE_PARALLEL, pp_spec)),
        )
    ]
    verdict = parity_check(*facts)
    reference = {
        "afd_layout": afd.topology.canonical,
        "pp_layout": pp_spec,
        "terminology": "PP = pipeline parallelism over layers; dynamic CPP is not offered "
        "by this backend's protocol",
        "pp_capabilities": sorted(pp.backend.capabilities),
        "upstream_revision": pp_item.result["manifest"]["software"]["vllm_revision"],
    }
    for item in (afd_item, pp_item):
        item.result["labels"].update(verdict.labels())
        item.result["evidence"]["parity"] = {
            **verdict.to_json(),
            "facts": [side.to_json() for side in facts],
            "reference": reference,
        }
    afd.write(measured)
    assert facts[0].device_count == facts[1].device_count, (
        "the PP layout must keep the device count"
    )
    assert facts[0].workload_digest == facts[1].workload_digest
    for item in (afd_item, pp_item):
        assert item.result["labels"]["comparability"] == verdict.comparability
        assert item.result["metrics"]["failed_requests"] == 0
    assert (verdict.comparability == COMPARABLE) == (not verdict.reasons)

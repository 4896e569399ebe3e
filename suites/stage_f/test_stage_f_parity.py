"""Unit tests of the Stage F parity check (no backend)."""

from __future__ import annotations

import dataclasses

import pytest
from stage_f_parity import (
    COMPARABLE,
    EXPLORATORY,
    PARITY_FIELDS,
    ParityFacts,
    parity_check,
    pp_layout_for,
)

from pytest_afd.topology.spec import parse_topology


def _facts(layout="afd", **changes):
    base = ParityFacts(
        layout=layout,
        device_count=32,
        device_type="Ascend 910C",
        model=(("name", "'full'"), ("num_layers", "61")),
        routing="natural",
        workload_digest="abc",
        prefix_caching=False,
        cache_phase="cold",
        chunk_size=None,
        warmups=1,
        repetitions=3,
        run_order="interleaved",
        validated=True,
        validation_note="",
        next_tokens=(("req-0", 5), ("req-1", 7)),
    )
    return dataclasses.replace(base, **changes)


def test_stage_f_full_parity_is_comparable():
    verdict = parity_check(_facts("afd"), _facts("pp"))
    assert verdict.comparability == COMPARABLE and verdict.reasons == ()
    assert verdict.labels() == {
        "comparability": COMPARABLE,
        "comparability_reason": "parity established",
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("device_count", 24),
        ("device_type", "Ascend 910B"),
        ("model", (("name", "'reduced'"), ("num_layers", "10"))),
        ("workload_digest", "def"),
        ("prefix_caching", True),
        ("cache_phase", "steady"),
        ("chunk_size", 8192),
        ("warmups", 0),
        ("repetitions", 5),
        ("run_order", "random"),
    ],
)
def test_stage_f_each_mismatch_makes_it_exploratory(field, value):
    verdict = parity_check(_facts("afd"), _facts("pp", **{field: value}))
    assert verdict.comparability == EXPLORATORY
    what = dict(PARITY_FIELDS)[field]
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith(f"{what} differs")
    assert verdict.labels()["comparability_reason"] == verdict.reasons[0]


def test_stage_f_forced_routing_is_never_comparable():
    verdict = parity_check(
        _facts("afd", routing="forced_balanced"), _facts("pp", routing="forced_balanced")
    )
    assert verdict.comparability == EXPLORATORY
    assert "afd uses 'forced_balanced' routing, not natural" in verdict.reasons


def test_stage_f_unvalidated_pp_layout_is_exploratory():
    note = "backend 'cpu' does not declare 'pipeline_parallel'"
    verdict = parity_check(_facts("afd"), _facts("pp", validated=False, validation_note=note))
    assert verdict.comparability == EXPLORATORY and verdict.reasons == (note,)


def test_stage_f_different_outputs_are_exploratory():
    verdict = parity_check(_facts("afd"), _facts("pp", next_tokens=(("req-0", 5), ("req-1", 8))))
    assert verdict.comparability == EXPLORATORY
    assert "correctness parity not established" in verdict.reasons[0]


def test_stage_f_pp_layout_keeps_the_device_count():
    for spec, expected in (("dp3pcp8-ep8", "pp4pcp8"), ("dp4pcp8", "pp4pcp8"), ("dp3-ep5", "pp8")):
        topology = parse_topology(spec)
        layout = pp_layout_for(topology)
        assert layout == expected
        assert parse_topology(layout).devices_needed == topology.devices_needed

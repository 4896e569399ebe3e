"""Gate 2: prefix-hit output matches the equivalent uncached execution.

A seed run puts prompts' prefixes in the cache; the measured (warm) run of the
same prompts with prefix caching must produce the same last-token logits,
within tolerance, as a cold run with prefix caching off. Both use the
token-balanced split. That the warm run really hit the cache is read from the
run's own per-request ``num_cached_tokens``, never from how prompts were built.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from gate_lib import (
    SPLIT_POLICY,
    UNSPLIT_POLICY,
    PageScale,
    gate_settings,
    make_prompts,
)

from pytest_afd.core.backend import PromptRequest

# The seed prompt is the prefix plus one token (its own request, so nothing else is cached).
SEED_SUFFIX_TOKENS = 1


@dataclass(frozen=True)
class PrefixWorkload:
    """Measured prompts; those in ``prefixed`` start with a shared ``shared_prefix``-token prefix."""

    name: str
    lengths: tuple[int, ...]
    shared_prefix: int
    prefixed: tuple[int, ...]
    # True: the seed run is the measured prompts themselves (a repeated prompt).
    repeat_prompts: bool = False

    def prompts(
        self, seed: int, pages: PageScale
    ) -> tuple[list[PromptRequest], list[list[PromptRequest]]]:
        prefix_tokens = pages.tokens(self.shared_prefix)
        prefix = make_prompts([prefix_tokens], seed, tag="p")[0].prompt_token_ids
        own = make_prompts(pages.lengths(self.lengths), seed + 1)
        prompts = [
            replace(p, prompt_token_ids=prefix + p.prompt_token_ids) if i in self.prefixed else p
            for i, p in enumerate(own)
        ]
        if self.repeat_prompts:
            return prompts, [prompts]
        seed_suffix = make_prompts([SEED_SUFFIX_TOKENS], seed + 2, prefix=prefix, tag="seed")
        return prompts, [seed_suffix]

    def expected_hits(self) -> tuple[int, ...]:
        """Requests that must realize a hit (every prompt when the prompts repeat)."""
        return tuple(range(len(self.lengths))) if self.repeat_prompts else self.prefixed


WORKLOADS = (
    # Two requests share a five-page prefix with the seed; one is new.
    PrefixWorkload("shared_prefix", (60, 120, 50), shared_prefix=80, prefixed=(0, 1)),
    # A 40-token prefix is 2.5 pages: only whole pages hit.
    PrefixWorkload("partial_page_prefix", (90, 70), shared_prefix=40, prefixed=(0, 1)),
    # The same prompts again: everything but the last token(s) may hit.
    PrefixWorkload(
        "repeated_prompts", (100, 64, 37), shared_prefix=0, prefixed=(), repeat_prompts=True
    ),
)


@pytest.mark.gate
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_gate_2_prefix_hit_matches_uncached(
    gate_topology_obj, gate_quantization, gate_backend, gate_manifest, gate_pages, workload,
    gate_case, afd_options,
):
    settings = gate_settings(
        gate_topology_obj,
        gate_pages,
        split_policy=SPLIT_POLICY,
        quantization=gate_quantization,
        prefix_caching=True,
    )
    prompts, seeds = workload.prompts(afd_options.seed, gate_pages)
    run = gate_case.run(
        gate=2, case=workload.name, name=f"gate2/{workload.name}",
        dataset=f"gate2/{workload.name}", backend=gate_backend, manifest=gate_manifest,
        topology=gate_topology_obj, quantization=gate_quantization, prompts=prompts,
        settings=settings, seed_prompts=seeds,
        # The reference is cold AND unsplit: a direct whole-batch forward per step.
        reference_settings=replace(settings, prefix_caching=False, split_policy=UNSPLIT_POLICY),
        live_reference="same prompts, cold (prefix caching off), unsplit direct forward",
    )  # fmt: skip
    if run is None:  # the reference phase
        return
    warm, uncached = run.candidate, run.reference
    hits = [r.num_cached_tokens for r in warm.requests]
    missing = [prompts[i].request_id for i in workload.expected_hits() if hits[i] <= 0]
    gate_case.record(
        run,
        realized_hit_tokens=hits,
        reference_hit_tokens=[r.num_cached_tokens for r in uncached.requests],
        requests_without_expected_hit=missing,
    )
    assert sum(hits) > 0 and not missing, (
        f"the warm run realized hits {hits}; {missing} should have hit the seeded prefix"
    )
    assert all(r.num_cached_tokens == 0 for r in uncached.requests), "the reference was not cold"
    run.verdict.raise_if_rejected()

"""What gates 1-3 compare, and references recorded in one phase and checked in another.

``comparable_outputs`` picks the comparison a backend allows: last-token
logits under the case's profile, or, from a backend that returns top-k
logprobs instead (``--afd-backend vllm-ascend`` over HTTP), the top-k under
the ``topk_logprob`` profile. A backend that returns neither fails the gate.

``GateReferences`` implements ``--afd-reference-phase`` (docs/gates.md): in the
reference phase a gate runs only its reference, unsplit, uncached and
unchunked, and stores it in the golden store with what it was recorded for;
in the check phase a gate runs only its candidate and compares it with the
stored reference, which must have been recorded for the same prompts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pytest_afd.core.backend import PromptRequest, RequestOutput, RunOutputs, RunSettings
from pytest_afd.golden.reference_phase import PHASE_CHECK, PHASE_LIVE, PHASE_RECORD
from pytest_afd.golden.store import GoldenStore, check_metadata
from pytest_afd.serving.logprobs import dense_rows, shared_logprob_error

TOPK_PROFILE = "topk_logprob"
KIND_LOGITS = "logits"
KIND_TOPK = "topk_logprobs"
REFERENCE_PREFIX = "reference"
# A stored top-k reference row: (token id, logprob) pairs, most likely first.
TOPK_PAIR = 2


@dataclass(frozen=True)
class ComparableOutputs:
    """Candidate and reference as two arrays one tolerance profile compares."""

    kind: str
    profile: str
    actual: np.ndarray
    expected: np.ndarray
    # topk: the largest |logprob difference| over tokens both top-k lists hold (evidence).
    shared_logprob_error: float | None = None


def output_kind(outputs: RunOutputs) -> str | None:
    """``logits`` / ``topk_logprobs`` when every request returned them, else None."""
    if outputs.requests and all(r.logits is not None for r in outputs.requests):
        return KIND_LOGITS
    if outputs.requests and all(r.top_logprobs for r in outputs.requests):
        return KIND_TOPK
    return None


def comparable_outputs(candidate: RunOutputs, reference: RunOutputs, profile: str
                       ) -> ComparableOutputs:
    """Logits under ``profile`` when both sides have them, else top-k logprobs under topk_logprob."""
    kinds = {output_kind(candidate), output_kind(reference)}
    if kinds == {KIND_LOGITS}:
        stack = [np.stack([np.asarray(r.logits, dtype=np.float32) for r in side.requests])
                 for side in (candidate, reference)]
        return ComparableOutputs(KIND_LOGITS, profile, stack[0], stack[1])
    if kinds <= {KIND_LOGITS, KIND_TOPK} and None not in kinds:
        rows = [[r.top_logprobs or _top_from_logits(r) for r in side.requests]
                for side in (candidate, reference)]
        actual, expected, _ = dense_rows(rows[0], rows[1])
        return ComparableOutputs(KIND_TOPK, TOPK_PROFILE, actual, expected,
                                 shared_logprob_error(rows[0], rows[1]))
    lacking = [f"{side}: {r.request_id}" for side, run in (("candidate", candidate),
                                                          ("reference", reference))
               for r in run.requests if r.logits is None and not r.top_logprobs]
    raise AssertionError(
        f"requests {lacking} returned neither logits nor top-k logprobs; the gate compares "
        "one of them (a backend without logits must declare topk_logprobs)"
    )


def _top_from_logits(request: RequestOutput) -> dict[int, float]:
    from pytest_afd.serving.logprobs import DEFAULT_NUM_LOGPROBS, top_logprobs_from_logits

    return top_logprobs_from_logits(request.logits, DEFAULT_NUM_LOGPROBS)


# ---- references across deployments ---------------------------------------------


def reference_settings(settings: RunSettings) -> RunSettings:
    """The reference every gate records: unsplit, uncached, unchunked, same everything else."""
    return replace(settings, split_policy="none", prefix_caching=False, chunk_size=None)


def prompts_digest(prompts: Sequence[PromptRequest]) -> str:
    text = json.dumps([[p.request_id, list(p.prompt_token_ids)] for p in prompts])
    return hashlib.sha256(text.encode()).hexdigest()


def to_array(outputs: RunOutputs) -> tuple[str, np.ndarray]:
    """(kind, array): [R, vocab] logits, or [R, k, 2] (token id, logprob) most likely first."""
    kind = output_kind(outputs)
    if kind == KIND_LOGITS:
        return kind, np.stack([np.asarray(r.logits, dtype=np.float32) for r in outputs.requests])
    if kind == KIND_TOPK:
        rows = [sorted(r.top_logprobs.items(), key=lambda item: (-item[1], item[0]))
                for r in outputs.requests]
        width = min(len(row) for row in rows)
        return kind, np.array([[pair for pair in row[:width]] for row in rows], dtype=np.float64)
    raise AssertionError("the reference run returned neither logits nor top-k logprobs for "
                         f"every request: {[r.request_id for r in outputs.requests]}")


def from_array(kind: str, array: np.ndarray, prompts: Sequence[PromptRequest]) -> RunOutputs:
    """The stored reference as the backend protocol's outputs (uncached, as recorded)."""
    if len(array) != len(prompts):
        raise AssertionError(f"stored reference has {len(array)} rows for {len(prompts)} prompts")
    requests = []
    for prompt, row in zip(prompts, array, strict=True):
        if kind == KIND_LOGITS:
            logits, top = np.asarray(row, dtype=np.float32), None
            next_token = int(np.argmax(logits))
        else:
            logits = None
            top = {int(token): float(value) for token, value in np.asarray(row).reshape(-1, TOPK_PAIR)}
            next_token = max(top, key=top.get)
        requests.append(RequestOutput(request_id=prompt.request_id,
                                      num_prompt_tokens=prompt.num_prompt_tokens,
                                      num_cached_tokens=0, next_token=next_token, logits=logits,
                                      top_logprobs=top))
    return RunOutputs(requests=requests)


@dataclass(frozen=True)
class GateReferences:
    """The session's ``--afd-reference-phase`` bound to the golden store and the model."""

    phase: str
    golden: GoldenStore
    model: str
    backend: str

    @property
    def recording(self) -> bool:
        return self.phase == PHASE_RECORD

    @property
    def checking(self) -> bool:
        return self.phase == PHASE_CHECK

    @property
    def live(self) -> bool:
        return self.phase == PHASE_LIVE

    def seed_split(self, settings: RunSettings) -> str:
        """Split of the prefix-seeding runs: unsplit live, the deployment's own when checking."""
        return settings.split_policy if self.checking else reference_settings(settings).split_policy

    @staticmethod
    def name(case: str, topology: str, quantization: str) -> str:
        return f"{REFERENCE_PREFIX}/{case}/{topology}-{quantization}"

    def metadata(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> dict[str, Any]:
        ref = reference_settings(settings)
        return {"prompts_sha256": prompts_digest(prompts), "model": self.model,
                "split_policy": ref.split_policy, "prefix_caching": ref.prefix_caching,
                "chunk_size": ref.chunk_size, "quantization": ref.quantization,
                "routing": ref.routing, "block_size": ref.block_size}

    def record(self, name: str, backend: Any, prompts: Sequence[PromptRequest],
               settings: RunSettings) -> RunOutputs:
        """Run the reference cold and store it (with what it was recorded for)."""
        backend.reset_prefix_cache()
        outputs = backend.run(prompts, reference_settings(settings))
        errors = {r.request_id: r.error for r in outputs.requests if r.error is not None}
        if errors:
            raise AssertionError(f"reference run failed for {errors}; nothing recorded")
        kind, array = to_array(outputs)
        self.golden.save(name, array, TOPK_PROFILE if kind == KIND_TOPK else "float32",
                         metadata={**self.metadata(prompts, settings), "kind": kind,
                                   "recorded_by_backend": self.backend})
        return outputs

    def load(self, name: str, prompts: Sequence[PromptRequest], settings: RunSettings
             ) -> RunOutputs:
        """The stored reference for exactly these prompts and settings (else a named error)."""
        array, sidecar = self.golden.load(name)
        check_metadata(name, sidecar, self.metadata(prompts, settings))
        return from_array(sidecar["metadata"]["kind"], array, prompts)

    def describe(self, name: str) -> dict[str, Any]:
        return {"phase": self.phase, "golden": name,
                "reference": "unsplit, uncached, unchunked (reference_settings)"}

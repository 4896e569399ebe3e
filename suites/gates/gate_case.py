"""The gates' one protocol: candidate, reference (live, recorded or stored), verdict, result.

Modelled on pytest-benchmark's ``BenchmarkFixture``: the ``gate_case`` fixture is an
object that owns the protocol every comparison gate repeats, so a gate module says only
what is its own (workload, settings, the shape it asserts, its evidence):

1. ``--afd-reference-phase record``: run only the reference, store it, write its result
   and stop (``run`` returns None);
2. run the candidate under the split checker (seed runs first);
3. the reference: the stored one when checking, else a live run of the reference
   settings (or outputs the caller already holds);
4. judge both under the case's tolerance profile and the split checker's findings;
5. ``record``: the result JSON with ``gate``, ``case``, ``reference`` first and the
   ``verdict`` last, the gate's own evidence between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate_evidence import record_gate_result, record_reference_case
from gate_setup import TOLERANCE_PROFILES
from gate_verdict import ExecutedSplits, GateVerdict, judge, run_measured

from pytest_afd.core.backend import Backend, PromptRequest, RunOutputs, RunSettings
from pytest_afd.topology.spec import Topology


@dataclass(frozen=True)
class GateRun:
    """One case's candidate, reference and verdict, and what to record about them."""

    gate: int
    case: str
    name: str
    dataset: str
    seed: int | None
    backend: Backend
    manifest: dict[str, Any]
    topology: Topology
    prompts: Sequence[PromptRequest]
    settings: RunSettings
    candidate: RunOutputs
    reference: RunOutputs
    splits: ExecutedSplits
    verdict: GateVerdict
    reference_text: Any


class LiveReferences:
    """The session's live reference runs, by exactly what they ran (the ``gate_live_references``
    fixture).

    A live reference is a cold, unsplit, direct whole-batch forward: the same backend,
    prompts, seed runs and settings give the same outputs (the prefix cache is reset
    first and the CPU kernels are batch-invariant). Several cases compare against the
    same one: gate 3's three chunk sizes (the reference is unchunked) and gate 1's
    in-process and AFD-process cases of a workload on an AFD topology (the reference
    is the in-process forward). Each is run once, with its checks (``run_measured``:
    it must not touch the split path), and shared; a run that failed is not kept.
    """

    def __init__(self) -> None:
        self._runs: dict[tuple, tuple[Backend, RunOutputs]] = {}
        self.runs = 0
        self.reused = 0

    @staticmethod
    def _key(backend: Backend, prompts: Sequence[PromptRequest], settings: RunSettings,
             seed_prompts: Sequence[Sequence[PromptRequest]]) -> tuple:
        return (id(backend), settings, tuple(prompts), tuple(tuple(s) for s in seed_prompts))

    def get(self, backend: Backend, prompts: Sequence[PromptRequest], settings: RunSettings,
            seed_prompts: Sequence[Sequence[PromptRequest]]) -> RunOutputs:
        key = self._key(backend, prompts, settings, seed_prompts)
        kept = self._runs.get(key)
        if kept is not None and kept[0] is backend:
            self.reused += 1
            return kept[1]
        outputs, _ = run_measured(backend, prompts, settings, seed_prompts=seed_prompts)
        self._runs[key] = (backend, outputs)
        self.runs += 1
        return outputs


class GateCase:
    """What a comparison gate case does; one per test (the ``gate_case`` fixture)."""

    def __init__(self, results: Any, references: Any, golden: Any, seed: int,
                 live_references: LiveReferences | None = None) -> None:
        self._results = results
        self._references = references
        self._golden = golden
        self.seed = seed
        self._live = LiveReferences() if live_references is None else live_references

    def run(
        self,
        *,
        gate: int,
        case: str,
        name: str,
        dataset: str,
        backend: Backend,
        manifest: dict[str, Any],
        topology: Topology,
        quantization: str,
        prompts: Sequence[PromptRequest],
        settings: RunSettings,
        live_reference: str,
        reference_settings: RunSettings | None = None,
        reference_source: Callable[[], RunOutputs] | None = None,
        seed_prompts: Sequence[Sequence[PromptRequest]] = (),
        reference_seed_prompts: Sequence[Sequence[PromptRequest]] = (),
        stored: bool = True,
        profile: str | None = None,
        seed: int | None = None,
    ) -> GateRun | None:
        """The case's candidate against its reference, judged; None in the record phase.

        ``stored=False``: a case with no stored reference (its reference is another
        deployment or model), which runs live in every phase. ``reference_source``: where
        the caller keeps its reference (a module-scoped one, computed once); otherwise
        ``reference_settings`` run live, after ``reference_seed_prompts``.
        """
        references = self._references
        seed = self.seed if seed is None else seed
        profile = profile or TOLERANCE_PROFILES[quantization]
        stored_name = references.name(name, topology.canonical, quantization) if stored else None
        if stored and references.recording:
            record_reference_case(
                self._results, references, stored_name, backend, prompts, settings,
                manifest=manifest, topology=topology, gate={"gate": gate, "case": case},
                dataset=dataset, seed=seed,
            )  # fmt: skip
            return None
        checking = stored and references.checking
        seed_split = {"seed_split": references.seed_split(settings)} if stored else {}
        candidate, splits = run_measured(backend, prompts, settings, seed_prompts=seed_prompts,
                                         **seed_split)
        if checking:
            reference = references.load(stored_name, prompts, settings)
        elif reference_source is not None:
            reference = reference_source()
        else:
            reference = self._live.get(backend, prompts, reference_settings,
                                       reference_seed_prompts)
        verdict = judge(self._golden, name, candidate, reference, profile, splits)
        return GateRun(
            gate=gate, case=case, name=name, dataset=dataset, seed=seed, backend=backend,
            manifest=manifest, topology=topology, prompts=prompts, settings=settings,
            candidate=candidate, reference=reference, splits=splits, verdict=verdict,
            reference_text=references.describe(stored_name) if checking else live_reference,
        )  # fmt: skip

    @property
    def live(self) -> bool:
        """True when references run live (neither recorded nor loaded from the store)."""
        return self._references.live

    def record(self, run: GateRun, lead: Mapping[str, Any] | None = None,
               **evidence: Any) -> None:
        """Write the case's result: gate, case, ``lead`` (identity fields), reference, the
        gate's ``evidence`` in order, and the verdict."""
        record_gate_result(
            self._results,
            manifest=run.manifest,
            settings=run.settings,
            topology=run.topology,
            prompts=run.prompts,
            outputs=run.candidate,
            dataset=run.dataset,
            seed=run.seed,
            gate={"gate": run.gate, "case": run.case, **(lead or {}),
                  "reference": run.reference_text, **evidence,
                  "verdict": run.verdict.to_json()},
        )

"""Helpers shared by the gate modules: topologies, settings, prompts, split check, verdict, evidence.

Every gate compares a candidate run with a reference run of the same backend
and judges it with the ``golden`` fixture's tolerance profile (``w8a8`` for
W8A8 runs, ``float32`` otherwise). Where the backend
declares ``split_observer`` (the CPU backend) the judgement also includes the
split invariant checker (``afd_split.checks.metadata.validate_split`` and parent-unchanged)
applied, through the backend protocol, to exactly the split metadata the
executor consumed, so a broken split is caught even where it happens not to
move the outputs. The reference (``split_policy="none"``) is a direct
whole-batch forward that must not touch the split path. See docs/gates.md.

Modules by job: ``gate_setup`` (topologies, backends, settings, prompts),
``gate_verdict`` (the split check and the verdict), ``gate_evidence`` (result
JSON and what the run's own evidence says). Gate modules import from here.
"""

from gate_evidence import (
    NO_STEP_EVIDENCE,
    SCHEDULE_KEYS,
    STEP_KEYS,
    SplitStep,
    final_chunk_tokens,
    record_gate_result,
    record_reference_case,
    shape_unverified,
    split_steps,
    step_derived,
)
from gate_setup import (
    BACKEND_ATTENTION_BUILDERS,
    CPU_BACKEND,
    GATE_BLOCK_SIZE,
    NPU_ATTENTION_BUILDER,
    PROMPT_VOCAB,
    QUANT_NONE,
    QUANT_W8A8,
    SPLIT_POLICY,
    SUPPORTED_CPU_TOPOLOGIES,
    TOLERANCE_PROFILES,
    UNSPLIT_POLICY,
    GateBackends,
    ManifestMaker,
    PageScale,
    afd_topology_specs,
    deployment_mismatch,
    gate_quantization_cases,
    gate_settings,
    gate_topology_specs,
    make_prompts,
    page_scale,
    support_config_for,
)
from gate_verdict import (
    PARENT_FIELDS,
    ExecutedSplits,
    GateRejected,
    GateVerdict,
    checked_splits,
    judge,
    run_measured,
    stacked_logits,
)

__all__ = [
    "BACKEND_ATTENTION_BUILDERS",
    "CPU_BACKEND",
    "GATE_BLOCK_SIZE",
    "NO_STEP_EVIDENCE",
    "NPU_ATTENTION_BUILDER",
    "PARENT_FIELDS",
    "PROMPT_VOCAB",
    "QUANT_NONE",
    "QUANT_W8A8",
    "SCHEDULE_KEYS",
    "SPLIT_POLICY",
    "STEP_KEYS",
    "SUPPORTED_CPU_TOPOLOGIES",
    "TOLERANCE_PROFILES",
    "UNSPLIT_POLICY",
    "ExecutedSplits",
    "GateBackends",
    "GateRejected",
    "GateVerdict",
    "ManifestMaker",
    "PageScale",
    "SplitStep",
    "afd_topology_specs",
    "checked_splits",
    "deployment_mismatch",
    "final_chunk_tokens",
    "gate_quantization_cases",
    "gate_settings",
    "gate_topology_specs",
    "judge",
    "make_prompts",
    "page_scale",
    "record_gate_result",
    "record_reference_case",
    "run_measured",
    "shape_unverified",
    "split_steps",
    "stacked_logits",
    "step_derived",
    "support_config_for",
]

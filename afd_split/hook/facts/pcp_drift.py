"""Drift checks of the release branch's per-stage PCP rebuild (the facts ``pcp_seam`` relies on).

afd-plugin release/v0.19.1rc1 (2f4f462) builds each stage's PCP metadata in the
inner ``_build_stage_local_pcp_metadata`` of ``_build_attention_metadata_with_ubatches``;
main has no such seam. ``pcp_seam.StageLocalInputBatches`` sets up, per stage,
exactly what that closure reads, so its header, its ``generate_pcp_metadata`` call,
the loop it runs in and those reads are checked with ``ast`` at install: on drift
PCP is refused naming it, before anything runs.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from afd_split.hook.facts.pinned import normalize_header

PCP_SEAM_BRANCH = "release/v0.19.1rc1"
"""The one pinned afd-plugin branch with a per-stage PCP rebuild."""

STAGE_PCP_REBUILD = "_build_stage_local_pcp_metadata"
STAGE_BUILD_METHOD = "_build_attention_metadata_with_ubatches"
STAGE_PCP_REBUILD_HEADER = (
    "def _build_stage_local_pcp_metadata(common_attn_metadata: AscendCommonAttentionMetadata, "
    "ubatch_slice: UBatchSlice, ubid: int, kv_cache_gid: int, attn_gid: int) -> None: ..."
)
"""The inner seam's header at afd-plugin release/v0.19.1rc1 2f4f462 (pinned, drift-checked)."""

STAGE_REBUILD_READS = (
    "self.pcp_manager.query_lens_pcp_full.cpu",
    "ubatch_slice.request_slice",
    "ubatch_slice.request_slice.start",
    "ubatch_slice.request_slice.stop",
    "self.input_batch.block_table[kv_cache_gid].slot_mapping.gpu",
    "common_attn_metadata.num_actual_tokens",
)
"""What the inner rebuild reads at 2f4f462 that ``StageLocalInputBatches`` sets up per stage:
the stage's counts, its token range (sums before the request slice's start / stop), its
slot rows, and its rank rows (the stage metadata's ``num_actual_tokens``)."""


def _calls(node, name: str) -> list[ast.Call]:
    return [call for call in ast.walk(node) if isinstance(call, ast.Call) and (
        (isinstance(call.func, ast.Name) and call.func.id == name)
        or (isinstance(call.func, ast.Attribute) and call.func.attr == name))]


def _is_self_input_batch(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "input_batch"
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def stage_pcp_rebuild_drift(stage_build) -> str | None:
    """Why the installed stage build (a function) no longer reads as pinned (None: it does)."""
    return stage_pcp_rebuild_drift_in(inspect.getsource(stage_build))


def stage_pcp_rebuild_drift_in(source: str) -> str | None:
    """Why ``source`` of the stage build no longer reads as pinned (None: it does).

    Checks the facts the AFD-only delta relies on: the inner rebuild's exact
    header; that it hands ``generate_pcp_metadata`` ``self.input_batch``; and that
    it runs inside ``for ... in enumerate(stages)`` over a ``split_attn_metadata``
    result, where ``StageLocalInputBatches`` swaps the batch per stage.
    """
    tree = ast.parse(textwrap.dedent(source))
    inner = [node for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef) and node.name == STAGE_PCP_REBUILD]
    if not inner:
        return f"{STAGE_BUILD_METHOD} has no inner {STAGE_PCP_REBUILD}"
    header = normalize_header(ast.unparse(inner[0]))
    if header != normalize_header(STAGE_PCP_REBUILD_HEADER):
        return f"{STAGE_PCP_REBUILD} header is {header!r}, pinned {STAGE_PCP_REBUILD_HEADER!r}"
    if not any(_is_self_input_batch(arg) for call in _calls(inner[0], "generate_pcp_metadata")
               for arg in call.args):
        return f"{STAGE_PCP_REBUILD} no longer passes self.input_batch to generate_pcp_metadata"
    read = {ast.unparse(node) for node in ast.walk(inner[0]) if isinstance(node, ast.Attribute)}
    missing = [name for name in STAGE_REBUILD_READS if name not in read]
    if missing:
        return (f"{STAGE_PCP_REBUILD} no longer reads {missing} (the stage counts, token range "
                "and slot rows the relaid stages set up)")
    sliced = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and _calls(node.value, "split_attn_metadata")
              for target in node.targets if isinstance(target, ast.Name)}
    for loop in ast.walk(tree):
        if (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)
                and _calls(loop.iter, "enumerate") and loop.iter.args
                and isinstance(loop.iter.args[0], ast.Name) and loop.iter.args[0].id in sliced
                and any(_calls(statement, STAGE_PCP_REBUILD) for statement in loop.body)):
            return None
    return (f"{STAGE_PCP_REBUILD} is not called while iterating a split_attn_metadata result "
            "with enumerate")


def pcp_seam_unavailable(runner_class: type, branch: str) -> str | None:
    """Why this plugin cannot run PCP stages (None: the pinned release seam is there)."""
    if branch != PCP_SEAM_BRANCH:
        return f"afd-plugin {branch} has no per-stage PCP rebuild (only {PCP_SEAM_BRANCH} has)"
    stage_build = vars(runner_class).get(STAGE_BUILD_METHOD)
    if stage_build is None:
        return f"{runner_class.__name__} defines no {STAGE_BUILD_METHOD}"
    drift = stage_pcp_rebuild_drift(stage_build)
    return None if drift is None else f"the per-stage PCP rebuild drifted: {drift}"

"""``token_balanced`` under PCP on afd-plugin release/v0.19.1rc1: the per-stage PCP seam.

Facts (afd-plugin release/v0.19.1rc1 2f4f462, ``v1/worker/npu/attention_model_runner.py``;
vllm-ascend v0.19.1rc1 da421afad719, ``worker/pcp_utils.py`` and ``model_runner_v1.py``):

* ``_build_attention_metadata_with_ubatches`` slices each attention group with the
  runner module's ``split_attn_metadata`` and, for every stage in that list, calls
  its inner ``_build_stage_local_pcp_metadata(common_attn_metadata, ubatch_slice,
  ubid, kv_cache_gid, attn_gid)``, which re-runs the PCP manager's
  ``init_batch_info``, ``update_tokens_for_pcp``, ``generate_pcp_metadata`` and
  ``get_padded_slot_mapping`` from ``query_lens_pcp_full`` of the stage's request
  slice. main has no PCP path.
* Upstream bug: that call hands ``generate_pcp_metadata`` the whole batch's
  ``self.input_batch``, which reads ``num_computed_tokens_cpu`` from index 0: stage
  1's cached-context lengths are those of the batch's first requests.
* Under PCP the runner overwrites ``num_scheduled_tokens_np`` with its rank-local
  counts; ``query_lens_pcp_full`` keeps the global ones (``init_batch_info``), the
  same on every PCP rank.
* Dense layers run the whole batch on the parent's per-rank rows (one zigzag per
  whole request, laid out by ``_prepare_inputs`` before any planner seam); the
  MoE stages slice those rows by ``UBatchSlice.token_slice``. A stage of whole
  requests is a contiguous range of every rank's rows; a cut inside a request is
  not (``afd_split.pcp_stage.stage_rows`` measures what re-laying it would move).

So under PCP the hook plans whole-request stages on the global counts,
balanced on them, hands the plugin its rank-local row slices, lets the
plugin's own slicer and stage-PCP rebuild run, and fixes the rebuild's input
(AFD-only delta: each stage's rebuild reads a stage-local input batch). A cut
inside a request stays with the CPU emulation until the runner lays out
pieces before ``_prepare_inputs`` (docs/split-path.md).
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from collections.abc import Sequence

import numpy as np

from afd_split.constraints import MIN_PCP_FOR_ZIGZAG, SplitConstraints, SplitPolicy
from afd_split.engine_alignment import EngineAlignment
from afd_split.errors import UnsupportedSplitError
from afd_split.integrations.afd_plugin.pinned import normalize_header
from afd_split.integrations.engine_step import plan_engine_step
from afd_split.pcp_stage import zigzag_layout
from afd_split.plan import SplitPlan

PCP_STAGE_RULE = (
    "request_boundary stages under PCP: the runner lays out one zigzag per whole request "
    "before the planner seam, so a cut inside a request is not a contiguous range of a "
    "rank's rows (docs/split-path.md)"
)
"""Recorded in every PCP step's evidence line (``pcp_stage_rule``)."""

PCP_SEAM_BRANCH = "release/v0.19.1rc1"
"""The one pinned afd-plugin branch with a per-stage PCP rebuild."""


def global_scheduled_counts(pcp_manager, num_reqs: int) -> np.ndarray:
    """The step's global per-request scheduled tokens (``query_lens_pcp_full``): identical on
    every PCP rank, unlike the rank-local ``num_scheduled_tokens_np``."""
    return pcp_manager.query_lens_pcp_full.cpu[:num_reqs].numpy().astype(np.int64)


def check_pcp_alignment(alignment: EngineAlignment) -> None:
    """Whole-request PCP stages meet no SP unit by construction: PCP with SP fails closed."""
    if alignment.rank_local_unit > 1:
        raise UnsupportedSplitError(
            f"PCP stages with sequence parallelism ({alignment.describe()}): whole-request "
            "stages' rank-local rows are not TP multiples by construction; not supported")


def plan_pcp_step(num_scheduled_tokens, num_computed_tokens, pcp_size: int) -> SplitPlan:
    """Whole-request stages balanced on the global counts (each padded to 2 * pcp)."""
    return plan_engine_step(num_scheduled_tokens, policy=SplitPolicy.REQUEST_BOUNDARY,
                            constraints=SplitConstraints(pcp_size=pcp_size),
                            num_computed_tokens=num_computed_tokens)


def rank_local_slices(plan: SplitPlan, pcp_size: int, slice_type) -> list:
    """The plugin's ``UBatchSlice`` per stage: its requests, and its rows on every PCP rank."""
    rank_rows = zigzag_layout(np.asarray(plan.token_counts, dtype=np.int64), pcp_size).rank_tokens
    starts = np.concatenate([[0], np.cumsum(rank_rows)])
    slices = []
    for ubatch in plan.ubatches:
        if ubatch.num_real_tokens != int(plan.token_counts[ubatch.request_slice].sum()):
            raise ValueError(f"ubatch {ubatch.index} cuts a request; under PCP only whole-request "
                             "stages map to contiguous rank rows")
        requests = ubatch.request_slice
        slices.append(slice_type(requests, slice(int(starts[requests.start]),
                                                 int(starts[requests.stop]))))
    return slices


def stage_input_batch(input_batch, computed: np.ndarray):
    """``input_batch`` as one stage's PCP rebuild must read it: its requests from index 0.

    A shallow copy sharing every buffer (block tables, token ids) except the host
    ``num_computed_tokens_cpu`` that ``generate_pcp_metadata`` indexes from 0.
    """
    view = copy.copy(input_batch)
    view.num_computed_tokens_cpu = computed
    return view


class StageLocalInputBatches(list):
    """The plugin's per-stage metadata; iterating it gives each stage's rebuild its own batch.

    ``_build_attention_metadata_with_ubatches`` runs the inner stage-PCP rebuild for
    stage ``ubid`` while it iterates this list: ``runner.input_batch`` is the
    stage's view for exactly that step and the runner's own again when the loop
    ends (the planner patch also restores it around the whole stage build).
    """

    def __init__(self, stages: Sequence, runner, views: Sequence) -> None:
        super().__init__(stages)
        if len(views) != len(stages):
            raise ValueError(f"{len(views)} stage input batches for {len(stages)} stages")
        self._runner = runner
        self._views = tuple(views)

    def __iter__(self):
        runner_batch = self._runner.input_batch
        try:
            for stage, view in zip(list.__iter__(self), self._views, strict=True):
                self._runner.input_batch = view
                yield stage
        finally:
            self._runner.input_batch = runner_batch


def stage_views(plan: SplitPlan, input_batch, num_computed_tokens: np.ndarray) -> list:
    """One stage-local input batch per ubatch (whole requests: their own computed tokens)."""
    return [stage_input_batch(input_batch, num_computed_tokens[ubatch.request_slice].copy())
            for ubatch in plan.ubatches]


def pcp_enabled(pcp_size: int) -> bool:
    return pcp_size >= MIN_PCP_FOR_ZIGZAG


STAGE_PCP_REBUILD = "_build_stage_local_pcp_metadata"
STAGE_BUILD_METHOD = "_build_attention_metadata_with_ubatches"
STAGE_PCP_REBUILD_HEADER = (
    "def _build_stage_local_pcp_metadata(common_attn_metadata: AscendCommonAttentionMetadata, "
    "ubatch_slice: UBatchSlice, ubid: int, kv_cache_gid: int, attn_gid: int) -> None: ..."
)
"""The inner seam's header at afd-plugin release/v0.19.1rc1 2f4f462 (pinned, drift-checked)."""


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

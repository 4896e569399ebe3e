"""The AFD plugin seams the hook patches, pinned as data with the branch and commit read.

Each seam's ``header`` is the upstream ``def`` line as source text (read with
the repository tools, normalised by ``ast.unparse``). The hook's patch
functions must carry exactly this header (AGENTS.md: "the patched function
signature, including return type, must match the upstream function exactly"),
tests build structural stand-ins from it, and the drift check compares it with
the installed afd_plugin's source. A seam whose installed header matches none
of its pinned variants makes registration fail closed, naming the seam.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

AFD_PLUGIN_REPO = "vllm-project/afd-plugin"

MAIN = ("main", "2e4378f2d478313992e9a1b850c61b1e888a1145")
"""afd-plugin main as read (merge of PR #213, 2026-08-08)."""

RELEASE_V0_19_1RC1 = ("release/v0.19.1rc1", "2f4f4627d6606dc8b6b11b406d3bc5b31e363090")
"""afd-plugin release/v0.19.1rc1 as read (merge of PR #200, 2026-08-05)."""

PR_203 = ("pull/203/head", "22d29dc7a1a9e85f7b8f153e66485b16d7331a83")
"""PR #203 (its own "token" split); read for the collision check, not patched."""

VALIDATION_MODULE = "afd_plugin.compat.npu.feature_validation"
RUNNER_MODULE = "afd_plugin.v1.worker.npu.attention_model_runner"
RUNNER_CLASS = "AFDNPUAttentionModelRunner"
EXTRA_INFO_MODULE = "afd_plugin.connectors.npu.async_cam"
FORWARD_MODULE = "afd_plugin.model_executor.models.npu.deepseek_v2_async_cam_forward"


@dataclass(frozen=True)
class PinnedSeam:
    """One upstream function the hook patches, as it reads at one branch and commit."""

    key: str
    module: str
    qualname: str
    branch: str
    commit: str
    header: str

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def normalized_header(self) -> str:
        return normalize_header(self.header)


def normalize_header(source: str) -> str:
    """``def`` header of the first function in ``source``: decorators and body dropped."""
    tree = ast.parse(textwrap.dedent(source))
    function = next(
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )
    function.decorator_list = []
    function.body = [ast.Expr(ast.Constant(...))]
    return ast.unparse(function)


def function_header(function) -> str:
    """The normalised ``def`` header of a live function (or classmethod), from its source."""
    return normalize_header(inspect.getsource(getattr(function, "__func__", function)))


VALIDATOR = "validator"
PLANNER = "planner"
SLICER = "slicer"
DISPATCH = "dispatch"
FORWARD = "forward"
ROUTER = "router"
EXTRA_INFO = "extra_info"
CONNECTOR_CLASS = "CAMAsyncAFDConnector"

VALIDATOR_NAME = "_fail_if_unsupported_npu_async_moe_ubatching_features"
PLANNER_NAME = "_build_attention_metadata_with_async_moe_ubatches"
SLICER_NAME = "split_attn_metadata"
DISPATCH_NAME = "send_attn_output"
EXTRA_INFO_NAME = "parse_extra_config"
FORWARD_NAME = "run_async_moe_ubatch_afd_forward"
ROUTER_NAME = "_build_attention_metadata"

_VALIDATOR_HEADER = (
    "def _fail_if_unsupported_npu_async_moe_ubatching_features(vllm_config: VllmConfig, "
    "afd_config: AFDConfig, *, num_ubatches: int, split: str) -> None: ..."
)

_PLANNER_HEADER_MAIN = (
    "def _build_attention_metadata_with_async_moe_ubatches(self, num_tokens: int, "
    "num_reqs: int, max_query_len: int, num_tokens_padded: int | None, "
    "num_reqs_padded: int | None, ubatch_slices: UBatchSlices | None, "
    "logits_indices: torch.Tensor | None, use_spec_decode: bool, "
    "for_cudagraph_capture: bool, num_scheduled_tokens: dict[str, int] | None, "
    "num_scheduled_tokens_np: np.ndarray | None, "
    "cascade_attn_prefix_lens: list[list[int]] | None) "
    "-> tuple[PerLayerAttnMetadata, CommonAttentionMetadata | None]: ..."
)

_PLANNER_HEADER_RELEASE = (
    "def _build_attention_metadata_with_async_moe_ubatches(self, args: tuple[Any, ...], "
    "kwargs: dict[str, Any], values: dict[str, Any]) -> Any: ..."
)

_SLICER_HEADER = (
    "def split_attn_metadata(ubatch_slices: UBatchSlices, "
    "common_attn_metadata: AscendCommonAttentionMetadata, max_num_tokens: int = 0) "
    "-> list[AscendCommonAttentionMetadata]: ..."
)

_DISPATCH_HEADER = (
    "def send_attn_output(self, hidden_states: Tensor, context: AFDTransferContext, "
    "**kwargs: Any) -> None: ..."
)

_FORWARD_HEADER = (
    "def run_async_moe_ubatch_afd_forward(model: AFDDeepseekV2Model, "
    "hidden_states: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, "
    "afd_metadata: AFDForwardContextMetadata, "
    "async_moe_ubatch_metadata: AsyncMoeUbatchMetadata, "
    "llama_4_scaling: torch.Tensor | None = None) "
    "-> tuple[torch.Tensor, torch.Tensor | None]: ..."
)

_EXTRA_INFO_HEADER = (
    "def parse_extra_config(cls, raw: Mapping[str, Any] | None) -> AFDAsyncExtraInfo: ..."
)

_ROUTER_HEADER_MAIN = (
    "def _build_attention_metadata(self, num_tokens: int, num_reqs: int, max_query_len: int, "
    "num_tokens_padded: int | None = None, num_reqs_padded: int | None = None, "
    "ubatch_slices: UBatchSlices | None = None, logits_indices: torch.Tensor | None = None, "
    "use_spec_decode: bool = False, for_cudagraph_capture: bool = False, "
    "num_scheduled_tokens: dict[str, int] | None = None, "
    "num_scheduled_tokens_np: np.ndarray | None = None, "
    "cascade_attn_prefix_lens: list[list[int]] | None = None) "
    "-> tuple[PerLayerAttnMetadata, CommonAttentionMetadata | None]: ..."
)

_ROUTER_HEADER_RELEASE = "def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> Any: ..."

PINNED_SEAMS: tuple[PinnedSeam, ...] = (
    PinnedSeam(VALIDATOR, VALIDATION_MODULE,
               "_fail_if_unsupported_npu_async_moe_ubatching_features", *MAIN, _VALIDATOR_HEADER),
    PinnedSeam(VALIDATOR, VALIDATION_MODULE,
               "_fail_if_unsupported_npu_async_moe_ubatching_features", *RELEASE_V0_19_1RC1,
               _VALIDATOR_HEADER),
    PinnedSeam(PLANNER, RUNNER_MODULE,
               f"{RUNNER_CLASS}._build_attention_metadata_with_async_moe_ubatches", *MAIN,
               _PLANNER_HEADER_MAIN),
    PinnedSeam(PLANNER, RUNNER_MODULE,
               f"{RUNNER_CLASS}._build_attention_metadata_with_async_moe_ubatches",
               *RELEASE_V0_19_1RC1, _PLANNER_HEADER_RELEASE),
    # The runner module's own binding of ubatch_utils.split_attn_metadata (a
    # module global looked up at call time by _build_attention_metadata_with_ubatches).
    PinnedSeam(SLICER, RUNNER_MODULE, "split_attn_metadata", *MAIN, _SLICER_HEADER),
    PinnedSeam(SLICER, RUNNER_MODULE, "split_attn_metadata", *RELEASE_V0_19_1RC1,
               _SLICER_HEADER),
    # Where each stage's routed top-k ids meet its layer and stage, right before the CAM
    # dispatch (the expert-load counts; afd_split.hook.planning.expert_load).
    PinnedSeam(DISPATCH, EXTRA_INFO_MODULE, f"{CONNECTOR_CLASS}.send_attn_output", *MAIN,
               _DISPATCH_HEADER),
    PinnedSeam(DISPATCH, EXTRA_INFO_MODULE, f"{CONNECTOR_CLASS}.send_attn_output",
               *RELEASE_V0_19_1RC1, _DISPATCH_HEADER),
    # Where afd-plugin parses the connector's extra config (async_moe_split among it), before
    # its validator judges the value (fail_if_unsupported_npu_afd_features); a classmethod.
    PinnedSeam(EXTRA_INFO, EXTRA_INFO_MODULE, f"{CONNECTOR_CLASS}.parse_extra_config", *MAIN,
               _EXTRA_INFO_HEADER),
    PinnedSeam(EXTRA_INFO, EXTRA_INFO_MODULE, f"{CONNECTOR_CLASS}.parse_extra_config",
               *RELEASE_V0_19_1RC1, _EXTRA_INFO_HEADER),
    # The async-MoE stage pipeline: dense layers on the whole batch, then the stages sliced by
    # UBatchSlice.token_slice (looked up as a module attribute by AFDDeepseekV2Model).
    PinnedSeam(FORWARD, FORWARD_MODULE, "run_async_moe_ubatch_afd_forward", *MAIN,
               _FORWARD_HEADER),
    PinnedSeam(FORWARD, FORWARD_MODULE, "run_async_moe_ubatch_afd_forward",
               *RELEASE_V0_19_1RC1, _FORWARD_HEADER),
    # The runner's metadata router: every step's attention metadata, async-MoE (the planner
    # above) or not (split none). The evidence-only hook records after it (evidence_only.py).
    PinnedSeam(ROUTER, RUNNER_MODULE, f"{RUNNER_CLASS}._build_attention_metadata", *MAIN,
               _ROUTER_HEADER_MAIN),
    PinnedSeam(ROUTER, RUNNER_MODULE, f"{RUNNER_CLASS}._build_attention_metadata",
               *RELEASE_V0_19_1RC1, _ROUTER_HEADER_RELEASE),
)
"""Every pinned (seam, branch) pair; a seam may have one variant per branch."""

BRANCHES = (MAIN[0], RELEASE_V0_19_1RC1[0])

ASYNC_MOE_EXTRA_CONFIG_KEYS = frozenset(
    {"dynamicQuant", "attn_ranks_per_dp", "async_moe_ubatching", "async_moe_num_ubatches",
     "async_moe_split"}
)
"""``_AFD_ASYNC_EXTRA_CONFIG_FIELDS`` at both pinned commits (and PR #203): the
``async_moe_split`` key is allowed and its value is a free string
(``coerce_extra_str``), so the allow-list already accepts ``token_balanced``;
the value is judged only by the validator seam."""

PR_203_SPLIT_VALUES = ("request", "token")
"""PR #203's accepted ``async_moe_split`` values; ``token_balanced`` must not be one."""


def seams_for(key: str) -> tuple[PinnedSeam, ...]:
    """The pinned variants of one seam."""
    return tuple(seam for seam in PINNED_SEAMS if seam.key == key)


def variant_for_branch(key: str, branch: str) -> PinnedSeam:
    """The pinned variant of ``key`` at ``branch``."""
    for seam in seams_for(key):
        if seam.branch == branch:
            return seam
    raise KeyError(f"no pinned {key!r} seam for branch {branch!r}")

"""A stand-in of the AFD plugin's Attention runner that decides ``request`` / ``none`` steps
itself, for the evidence-only tests (tests/integrations/test_evidence_only.py).

Written from the facts of afd-plugin main 2e4378f and release/v0.19.1rc1 2f4f462
(``v1/worker/npu/attention_model_runner.py``, ``v1/worker/npu/ubatch_utils.py``),
not copied: the router ``_build_attention_metadata`` (pinned header) sends an
async-MoE deployment to ``_build_attention_metadata_with_async_moe_ubatches``
(clearing ``ubatch_slices``) and otherwise builds the AFD metadata and the plain
full-batch metadata; the async planner builds the full batch through the base
runner, clears ``_afd_async_moe_ubatch_metadata``, and when the request-boundary
search finds a split builds the stages with ``_build_attention_metadata_with_ubatches``
(which slices with the module's ``split_attn_metadata``) and stores
``{"attn_metadata", "ubatch_slices"}``. The search: no split under two requests or
two tokens; else the request boundary whose head has the tokens closest to T/2,
ties to the boundary closest to the middle request. On release/v0.19.1rc1 the router
and planner take ``(*args, **kwargs)`` / ``(args, kwargs, values)`` named by the
module's ``_attention_metadata_values`` and rebound by
``_replace_attention_metadata_ubatch_slices``.

The metadata objects are plain dicts of numpy rows, so a test can compare every
object the plugin builds with and without the hook, bit for bit.
"""

from __future__ import annotations

from afd_split.hook.facts.pinned import (
    PLANNER,
    ROUTER,
    SLICER,
    normalize_header,
    variant_for_branch,
)
from tests.support.hook_standins import _body, _indent

ARG_NAMES = ("num_tokens", "num_reqs", "max_query_len", "num_tokens_padded", "num_reqs_padded",
             "ubatch_slices", "logits_indices", "use_spec_decode", "for_cudagraph_capture",
             "num_scheduled_tokens", "num_scheduled_tokens_np", "cascade_attn_prefix_lens")

_COMMON = '''
from __future__ import annotations

import dataclasses

import numpy as np

CALLS = []


@dataclasses.dataclass(frozen=True)
class UBatchSlice:
    request_slice: slice
    token_slice: slice

    @property
    def num_tokens(self):
        return self.token_slice.stop - self.token_slice.start


def create_request_boundary_ubatch_slices(num_scheduled_tokens, *, num_ubatches=2):
    num_reqs = len(num_scheduled_tokens)
    if num_reqs < num_ubatches:
        return None
    cu = np.concatenate([[0], np.cumsum(num_scheduled_tokens)])
    total = int(cu[-1])
    if total < num_ubatches:
        return None
    split_req = min(range(1, num_reqs),
                    key=lambda r: (abs(2 * int(cu[r]) - total), abs(r * num_ubatches - num_reqs)))
    split_token = int(cu[split_req])
    return [UBatchSlice(slice(0, split_req), slice(0, split_token)),
            UBatchSlice(slice(split_req, num_reqs), slice(split_token, total))]


class NPUModelRunner:
    def _build_attention_metadata(self, *args, **kwargs):
        values = _values(args, kwargs)
        rows = values["num_tokens_padded"] or values["num_tokens"]
        CALLS.append(("full_build", values["num_tokens"]))
        return {"rows": self.common["rows"][:rows].copy(),
                "requests": self.common["requests"][:values["num_reqs"]].copy()}, None


def _build_afd_metadata_of(ubatch_slices, num_tokens):
    if ubatch_slices and len(ubatch_slices) > 1:
        return ("stages", tuple(u.token_slice.start for u in ubatch_slices),
                tuple(u.request_slice.start for u in ubatch_slices),
                tuple(u.num_tokens for u in ubatch_slices), num_tokens)
    return ("single", num_tokens)
'''


def _slicer(branch: str) -> str:
    header = normalize_header(variant_for_branch(SLICER, branch).header)
    return _body(header, [
        "CALLS.append(('plugin_slicer', tuple(ubatch_slices)))",
        "return [{'rows': common_attn_metadata['rows'][s.token_slice].copy(),",
        "         'requests': common_attn_metadata['requests'][s.request_slice].copy()}",
        "        for s in ubatch_slices]",
    ])


def _main_runner() -> str:
    router = normalize_header(variant_for_branch(ROUTER, "main").header)
    planner = normalize_header(variant_for_branch(PLANNER, "main").header)
    keywords = ", ".join(f"{name}={name}" for name in ARG_NAMES)
    stage_keywords = keywords.replace("ubatch_slices=ubatch_slices", "ubatch_slices=slices")
    router_body = _body(router, [
        "if self.afd_async_extra_info.async_moe_ubatching:",
        "    self.ubatch_slices = None",
        f"    return self._build_attention_metadata_with_async_moe_ubatches({keywords})",
        "self._afd_pending_metadata = self._build_afd_metadata(ubatch_slices, num_tokens)",
        "self.ubatch_slices = ubatch_slices",
        f"return super()._build_attention_metadata({keywords})",
    ])
    planner_body = _body(planner, [
        f"full = super()._build_attention_metadata({keywords})",
        "self._afd_async_moe_ubatch_metadata = None",
        "self._afd_pending_metadata = self._build_afd_metadata(None, num_tokens)",
        "if num_scheduled_tokens_np is None:",
        "    return full",
        "slices = create_request_boundary_ubatch_slices(",
        "    num_scheduled_tokens_np,",
        "    num_ubatches=self.afd_async_extra_info.async_moe_num_ubatches)",
        "if slices is None:",
        "    return full",
        f"stage, _ = self._build_attention_metadata_with_ubatches({stage_keywords})",
        "self._afd_pending_metadata = self._build_afd_metadata(slices, num_tokens)",
        "self._afd_async_moe_ubatch_metadata = {'attn_metadata': stage, 'ubatch_slices': slices}",
        "return full",
    ])
    return (
        "def _values(args, kwargs):\n    return dict(kwargs)\n\n\n"
        "class AFDNPUAttentionModelRunner(NPUModelRunner):\n"
        + _indent(router_body) + "\n" + _indent(planner_body) + "\n"
        "    def _build_attention_metadata_with_ubatches(self, **kwargs):\n"
        "        CALLS.append(('stage_build', tuple(kwargs['ubatch_slices'])))\n"
        "        return split_attn_metadata(kwargs['ubatch_slices'], self.common, "
        "kwargs['num_tokens_padded']), None\n\n"
        "    def _build_afd_metadata(self, ubatch_slices, num_tokens):\n"
        "        return _build_afd_metadata_of(ubatch_slices, num_tokens)\n"
    )


def _release_runner() -> str:
    router = normalize_header(variant_for_branch(ROUTER, "release/v0.19.1rc1").header)
    planner = normalize_header(variant_for_branch(PLANNER, "release/v0.19.1rc1").header)
    router_body = _body(router, [
        "values = _attention_metadata_values(args, kwargs)",
        "if self.afd_async_extra_info.async_moe_ubatching:",
        "    self.ubatch_slices = None",
        "    return self._build_attention_metadata_with_async_moe_ubatches(args, kwargs, values)",
        "self._afd_pending_metadata = self._build_afd_metadata(",
        "    values.get('ubatch_slices'), int(values.get('num_tokens', 0)))",
        "self.ubatch_slices = values.get('ubatch_slices')",
        "return super()._build_attention_metadata(*args, **kwargs)",
    ])
    planner_body = _body(planner, [
        "full = super()._build_attention_metadata(*args, **kwargs)",
        "self._afd_async_moe_ubatch_metadata = None",
        "num_tokens = int(values.get('num_tokens', 0))",
        "self._afd_pending_metadata = self._build_afd_metadata(None, num_tokens)",
        "scheduled = values.get('num_scheduled_tokens_np')",
        "if scheduled is None:",
        "    return full",
        "slices = create_request_boundary_ubatch_slices(",
        "    scheduled, num_ubatches=self.afd_async_extra_info.async_moe_num_ubatches)",
        "if slices is None:",
        "    return full",
        "stage_args, stage_kwargs = _replace_attention_metadata_ubatch_slices(args, kwargs, slices)",
        "stage, _ = self._build_attention_metadata_with_ubatches(*stage_args, **stage_kwargs)",
        "self._afd_pending_metadata = self._build_afd_metadata(slices, num_tokens)",
        "self._afd_async_moe_ubatch_metadata = {'attn_metadata': stage, 'ubatch_slices': slices}",
        "return full",
    ])
    return (
        f"_ATTENTION_METADATA_ARG_NAMES = {list(ARG_NAMES)!r}\n\n\n"
        "def _attention_metadata_values(args, kwargs):\n"
        "    values = dict(zip(_ATTENTION_METADATA_ARG_NAMES, args, strict=False))\n"
        "    values.update(kwargs)\n"
        "    return values\n\n\n"
        "_values = _attention_metadata_values\n\n\n"
        "def _replace_attention_metadata_ubatch_slices(args, kwargs, ubatch_slices):\n"
        "    index = _ATTENTION_METADATA_ARG_NAMES.index('ubatch_slices')\n"
        "    if len(args) > index:\n"
        "        new_args = list(args)\n"
        "        new_args[index] = ubatch_slices\n"
        "        return tuple(new_args), kwargs\n"
        "    return args, {**kwargs, 'ubatch_slices': ubatch_slices}\n\n\n"
        "class AFDNPUAttentionModelRunner(NPUModelRunner):\n"
        + _indent(router_body) + "\n" + _indent(planner_body) + "\n"
        "    def _build_attention_metadata_with_ubatches(self, *args, **kwargs):\n"
        "        values = _attention_metadata_values(args, kwargs)\n"
        "        CALLS.append(('stage_build', tuple(values['ubatch_slices'])))\n"
        "        return split_attn_metadata(values['ubatch_slices'], self.common, 0), None\n\n"
        "    def _build_afd_metadata(self, ubatch_slices, num_tokens):\n"
        "        return _build_afd_metadata_of(ubatch_slices, num_tokens)\n"
    )


def deciding_runner_source(branch: str) -> str:
    """Runner module source of ``branch`` whose request / none paths decide like upstream."""
    runner = _main_runner() if branch == "main" else _release_runner()
    return _COMMON + "\n\n" + _slicer(branch) + "\n\n" + runner

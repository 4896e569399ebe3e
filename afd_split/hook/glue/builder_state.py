"""Keep the full batch as upstream built it while the stages are built: builder-owned buffers.

Facts (vllm-ascend v0.19.1rc1 da421afad719; afd-plugin release/v0.19.1rc1 2f4f462 and
main 2e4378f, ``v1/worker/npu/attention_model_runner.py``; docs/ascend.md lists every
view with its owner):

* The full batch is built by ``NPUModelRunner._build_attention_metadata`` with
  ``attn_group.get_metadata_builder(0)``; the plugin's
  ``_build_attention_metadata_with_ubatches`` builds stage ``ubid`` with
  ``get_metadata_builder(ubid or 0)`` (``_ensure_two_metadata_builders``): stage 0
  shares builder 0 with the full batch.
* ``AscendSFACPMetadataBuilder.build`` (``attention/context_parallel/sfa_cp.py``) copies
  the slots into its persistent ``slot_mapping_buf`` and returns a view of it; under
  ``enable_dsa_cp`` ``AscendSFAMetadataBuilder.build`` (``attention/sfa_v1.py``) returns
  views of its ``actual_seq_lengths_query`` / ``_key`` buffers.
* ``PCPManager.get_padded_slot_mapping`` (``worker/pcp_utils.py``) fills
  ``pcp_padded_slot_mapping_list[gid]`` and returns a view of it: the full batch's
  common ``slot_mapping``, which ``AscendMlaCPMetadataBuilder`` /
  ``AscendAttentionCPMetadataBuilder`` keep as their metadata's ``slot_mapping``. The
  plugin's stage rebuild calls it again per stage (and clones the result); its
  ``restore_pcp_manager_state`` does not restore that buffer.
* MLA builders keep per-build attribute bindings (``self.slot_mapping``, counts).

The fix (one rule for every such buffer): the stage build runs inside
``preserved_state`` over the runner state, every builder's attribute bindings and
the contents of every buffer above (restored in place after success and failure,
so every view the full batch holds reads what upstream built); before the restore,
each stage's metadata gets its own copy of any field that views one of those
buffers (``own_stage_views``), since a stage is the one reader that must keep the
stage's contents.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from afd_split.engine.state import AllBindings, BufferContents

STAGE_WRITTEN_BUILDER_BUFFERS = ("slot_mapping_buf", "actual_seq_lengths_query",
                                 "actual_seq_lengths_key")
"""Persistent builder tensors a build writes and returns views of (see the module doc)."""

PCP_PADDED_SLOT_BUFFERS = "pcp_padded_slot_mapping_list"
"""``PCPManager``'s per-KV-cache-group padded-slot buffers (``get_padded_slot_mapping``)."""

PCP_STAGE_COUNTS = "query_lens_pcp_full"
"""``PCPManager.query_lens_pcp_full`` (a ``CpuGpuBuffer``): the global counts per request."""

VIEW_SEARCH_DEPTH = 3
"""How deep ``own_stage_views`` follows a metadata object's attributes (e.g.
``metadata.sfa_cp_metadata``; the pinned builders nest one level)."""


def metadata_builders(runner) -> list:
    """Every attention metadata builder of the runner, each once."""
    builders, seen = [], set()
    for groups in getattr(runner, "attn_groups", None) or ():
        for group in groups:
            for builder in getattr(group, "metadata_builders", None) or ():
                if id(builder) not in seen:
                    seen.add(id(builder))
                    builders.append(builder)
    return builders


def _is_tensor(value) -> bool:
    return hasattr(value, "untyped_storage") and hasattr(value, "copy_")


def builder_owned_buffers(builders: Iterable) -> list:
    """The persistent tensors of ``builders`` a stage build writes through."""
    return [buffer for builder in builders
            for name in STAGE_WRITTEN_BUILDER_BUFFERS
            if _is_tensor(buffer := getattr(builder, name, None))]


def manager_owned_buffers(pcp_manager) -> list:
    """``PCPManager``'s padded-slot buffers and ``query_lens_pcp_full`` (whose ``.cpu`` the
    full batch's ``query_lens_pcp_full_cpu`` views and ``pcp_seam`` swaps per stage); none
    without a PCP manager. ``pcp_allgather_restore_idx`` and the unpad mask are restored
    in place by the plugin's own ``restore_pcp_manager_state`` after every stage."""
    if pcp_manager is None:
        return []
    buffers = list(getattr(pcp_manager, PCP_PADDED_SLOT_BUFFERS, None) or ())
    counts = getattr(pcp_manager, PCP_STAGE_COUNTS, None)
    buffers += [getattr(counts, side, None) for side in ("cpu", "gpu")]
    return [buffer for buffer in buffers if _is_tensor(buffer)]


def stage_written_buffers(builders: Iterable, pcp_manager) -> list:
    """Every buffer the stage build may write through that the full batch may view."""
    return builder_owned_buffers(builders) + manager_owned_buffers(pcp_manager)


def builder_state_targets(builders: Iterable, buffers: Iterable, limit: int | None = None) -> list:
    """``preserved_state`` targets: each builder's attribute bindings and each buffer's
    contents (its first ``limit`` entries: :func:`stage_write_bound`; None: all)."""
    return ([AllBindings(builder) for builder in builders]
            + [BufferContents(buffer, limit) for buffer in buffers])


PCP_PAD_PER_REQUEST = 2
"""Upstream pads each request to a multiple of ``2 * pcp`` tokens (``PCPManager``; the
builders' ``slot_mapping_buf`` holds ``max_num_batched_tokens + 2 * pcp * max_num_seqs``)."""


def stage_write_bound(num_scheduled_tokens, num_tokens: int, num_tokens_padded: int | None,
                      pcp_size: int) -> int:
    """How many leading entries of a guarded buffer any build of this step can write.

    Every buffer above is written from its start: slots (global, PCP-padded: at most
    the step's tokens plus ``2 * pcp`` per request, one more request for a stage's cut
    piece; or the padded rows per rank times ``pcp``) or per-request counts (fewer). A
    stage's requests are pieces of the full batch's, so no stage writes further than
    this bound: the guard copies that prefix, not the deployment-sized buffer.
    """
    pcp = max(1, int(pcp_size))
    requests = len(num_scheduled_tokens)
    padded_slots = int(sum(int(n) for n in num_scheduled_tokens)) + (
        PCP_PAD_PER_REQUEST * pcp * (requests + 1))
    rows = max(int(num_tokens), int(num_tokens_padded or 0)) * pcp
    return max(padded_slots, rows)


def _storage_key(tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _objects(metadata) -> Iterator[Any]:
    """Each distinct metadata object of a stage build's result (list of per-layer dicts,
    a dict, a list of objects or one object)."""
    items = metadata if isinstance(metadata, list | tuple) else [metadata]
    for item in items:
        yield from (item.values() if isinstance(item, dict) else (item,))


def own_stage_views(stage_metadata, buffers: Iterable) -> int:
    """Give every stage metadata field that views one of ``buffers`` its own copy.

    Returns how many fields were copied (zero when no stage field views them).
    """
    keys = {_storage_key(buffer) for buffer in buffers}
    if not keys:
        return 0
    seen: set[int] = set()
    copied = 0

    def visit(obj, depth: int) -> None:
        nonlocal copied
        if depth > VIEW_SEARCH_DEPTH or id(obj) in seen or not hasattr(obj, "__dict__"):
            return
        seen.add(id(obj))
        for name, value in list(vars(obj).items()):
            if _is_tensor(value):
                if _storage_key(value) in keys:
                    setattr(obj, name, value.clone())
                    copied += 1
            elif value is not None and not isinstance(value, int | float | str | bool):
                visit(value, depth + 1)

    for obj in _objects(stage_metadata):
        visit(obj, 0)
    return copied


def fields_viewing(metadata, buffers: Iterable) -> list[str]:
    """Names (``Class.field``) of the metadata fields that view one of ``buffers``, each once.

    Why: the plugin's own ``request`` stage build (release/v0.19.1rc1 2f4f462) leaves
    ``PCPManager.pcp_padded_slot_mapping_list[gid]`` holding its last stage's slots, and
    a full batch whose slots view that buffer (MLA-CP / attention-CP) has lost its own;
    reading the views is host-only and changes nothing the plugin reads.
    """
    keys = {_storage_key(buffer) for buffer in buffers}
    found: list[str] = []
    seen: set[int] = set()

    def visit(obj, depth: int) -> None:
        if depth > VIEW_SEARCH_DEPTH or id(obj) in seen or not hasattr(obj, "__dict__"):
            return
        seen.add(id(obj))
        for name, value in vars(obj).items():
            if _is_tensor(value):
                label = f"{type(obj).__name__}.{name}"
                if _storage_key(value) in keys and label not in found:
                    found.append(label)
            elif value is not None and not isinstance(value, int | float | str | bool):
                visit(value, depth + 1)

    if keys:
        for obj in _objects(metadata):
            visit(obj, 0)
    return found

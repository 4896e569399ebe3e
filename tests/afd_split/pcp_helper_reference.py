"""Independent reference of vLLM-Ascend's PCP helper maths (what it computes, not its code).

Facts read at vllm-project/vllm-ascend tag v0.19.1rc1, commit
da421afad719 (``vllm_ascend/worker/pcp_utils.py``, class ``PCPManager``):

* ``init_batch_info``: leading requests with at most ``decode_threshold`` (1 without
  speculation) scheduled tokens are decodes; ``query_lens_pcp_full`` holds the
  global scheduled counts.
* ``update_tokens_for_pcp``: a prefill is padded to a multiple of 2 * pcp and cut
  into 2 * pcp chunks; rank r takes chunk r then chunk 2 * pcp - 1 - r. A decode
  is copied onto every rank (padded length n * pcp, only the first copy real).
  The all-gather restore index sorts the ranks' concatenated padded positions;
  the docstring's example ([1, 5, 8], pcp 2) is checked in the tests.
* ``generate_pcp_metadata`` (pcp > 1, dcp 1, non-hybrid): context lengths are
  computed + scheduled for decodes and computed for prefills, read from
  ``input_batch.num_computed_tokens_cpu`` from index 0; each rank holds the
  cached tokens dealt out in blocks of ``cp_kv_cache_interleave_size``
  round-robin (``_get_cp_local_seq_lens``); per prefill request with c = its
  rank-local length // 2: q head / tail rows, kv rows before and inside the
  head chunk (id = rank) and the tail chunk (id = 2 * pcp - 1 - rank), the tail
  projection rows [0, c * (tail id + 1)) of the request's all-gathered kv, and
  the running lengths of the head / tail attention index lists. The q and kv
  offsets count prefill requests only: the loop skips the leading decodes without
  advancing them (the attention backends index the prefill part, after the decode
  tokens). Checked once against the real ``PCPManager`` at that commit (imports
  stubbed, CPU torch): rank rows, positions and every metadata field agree on 150
  random split batches at pcp 2/4/8, every rank, decodes included.

Written per request and per rank with Python lists so it shares no code with
``afd_split.pcp.stage``.
"""

from __future__ import annotations

VLLM_ASCEND_TAG = "v0.19.1rc1"
VLLM_ASCEND_COMMIT = "da421afad719"
HELPER_FILE = "vllm_ascend/worker/pcp_utils.py"


def _decodes(scheduled):
    count = 0
    for n in scheduled:
        if n > 1:
            break
        count += 1
    return count


def helper_layout(scheduled, pcp):
    """{'rank_rows': [[padded offset per row] per rank], 'sources': [[token or -1]],
    'pads', 'unpad_mask', 'restore_idx', 'rank_tokens'} of one batch."""
    decodes = _decodes(scheduled)
    rank_offsets = [[] for _ in range(pcp)]
    rank_sources = [[] for _ in range(pcp)]
    pads, unpad, rank_tokens = [], [], []
    padded_start = logical_start = 0
    for index, n in enumerate(scheduled):
        if index < decodes:
            padded = n * pcp
            for rank in range(pcp):
                for j in range(n):
                    rank_offsets[rank].append(padded_start + rank * n + j)
                    rank_sources[rank].append(logical_start + j)
            unpad.extend([True] + [False] * (pcp - 1))
        else:
            padded = -(-n // (2 * pcp)) * 2 * pcp
            chunk = padded // (2 * pcp)
            for rank in range(pcp):
                for chunk_id in (rank, 2 * pcp - 1 - rank):
                    for j in range(chunk_id * chunk, (chunk_id + 1) * chunk):
                        rank_offsets[rank].append(padded_start + j)
                        rank_sources[rank].append(logical_start + j if j < n else -1)
            unpad.extend([j < n for j in range(padded)])
        pads.append(padded - n)
        rank_tokens.append(padded // pcp)
        padded_start += padded
        logical_start += n
    gathered = [offset for rows in rank_offsets for offset in rows]
    restore = sorted(range(len(gathered)), key=lambda i: gathered[i])
    return {"rank_rows": rank_offsets, "sources": rank_sources, "pads": pads,
            "unpad_mask": unpad, "restore_idx": restore, "rank_tokens": rank_tokens}


def rank_context(context, pcp, interleave):
    """Cached tokens of one request on each rank: blocks of ``interleave`` dealt round-robin."""
    held = [0] * pcp
    for token in range(context):
        held[(token // interleave) % pcp] += 1
    return held


def helper_metadata(scheduled, computed_from_index_0, pcp, rank, interleave=1):
    """What ``generate_pcp_metadata`` returns for a batch of ``scheduled`` tokens whose
    input batch's ``num_computed_tokens_cpu`` is ``computed_from_index_0`` (read from 0)."""
    layout = helper_layout(scheduled, pcp)
    decodes = _decodes(scheduled)
    contexts = []
    for index, n in enumerate(scheduled):
        cached = computed_from_index_0[index]
        contexts.append(cached + n if index < decodes else cached)
    out = {
        "num_actual_tokens_pcp_padded": sum(layout["rank_tokens"]) * pcp,
        "num_computed_tokens_of_pcp_dcp": [rank_context(c, pcp, interleave) for c in contexts],
        "pcp_unpad_mask": layout["unpad_mask"],
        "query_lens_pcp_full_cpu": list(scheduled),
        "max_query_len_pcp_full": max(scheduled),
        "pcp_allgather_restore_idx": layout["restore_idx"],
    }
    names = ("q_head", "q_tail", "head_nomask", "head_mask", "tail_nomask", "tail_mask",
             "tail_proj", "head_in_tail", "tail_in_tail")
    lists = {name: [] for name in names}
    chunks, head_nomask_lens, tail_nomask_lens, head_kv, tail_kv = [], [], [], [], []
    head_id, tail_id = rank, 2 * pcp - 1 - rank
    q_offset = kv_offset = 0
    for index, local in enumerate(layout["rank_tokens"]):
        if index < decodes:  # decodes are skipped, offsets not advanced: the prefill rows
            continue  # are indexed from the first prefill request (after the decode tokens)
        c = local // 2
        chunks.append(c)
        lists["q_head"] += [q_offset + j for j in range(c)]
        lists["q_tail"] += [q_offset + c + j for j in range(c)]
        lists["head_nomask"] += [kv_offset + j for j in range(c * head_id)]
        lists["head_mask"] += [kv_offset + c * head_id + j for j in range(c)]
        lists["tail_nomask"] += [kv_offset + j for j in range(c * tail_id)]
        lists["tail_mask"] += [kv_offset + c * tail_id + j for j in range(c)]
        base = len(lists["tail_proj"])
        lists["tail_proj"] += [kv_offset + j for j in range(c * (tail_id + 1))]
        lists["head_in_tail"] += [base + j for j in range(c * (head_id + 1))]
        lists["tail_in_tail"] += [base + j for j in range(c * (tail_id + 1))]
        head_nomask_lens.append(c * head_id)
        tail_nomask_lens.append(c * tail_id)
        head_kv.append(len(lists["head_in_tail"]))
        tail_kv.append(len(lists["tail_in_tail"]))
        q_offset += local
        kv_offset += local * pcp

    def running(values):
        total, sums = 0, []
        for value in values:
            total += value
            sums.append(total)
        return sums

    both = lists["q_head"] + lists["q_tail"]
    out.update({
        "q_head_idx": lists["q_head"],
        "q_tail_idx": lists["q_tail"],
        "q_full_idx": sorted(range(len(both)), key=lambda i: both[i]),
        "kv_idx": {
            "kv_with_q_head_nomask_idx_tensor": lists["head_nomask"],
            "kv_with_q_head_mask_idx_tensor": lists["head_mask"],
            "kv_with_q_tail_nomask_idx_tensor": lists["tail_nomask"],
            "kv_with_q_tail_mask_idx_tensor": lists["tail_mask"],
            "kv_tail_proj_idx_tensor": lists["tail_proj"],
            "kv_with_q_head_attn_idx_in_tail_tensor": lists["head_in_tail"],
            "kv_with_q_tail_attn_idx_in_tail_tensor": lists["tail_in_tail"],
        },
        "attn_chunk_seqlens": chunks,
        "attn_mask_seqlens": running(chunks),
        "head_attn_nomask_seqlens": running(head_nomask_lens),
        "tail_attn_nomask_seqlens": running(tail_nomask_lens),
        "head_actual_seq_lengths_kv": head_kv,
        "tail_actual_seq_lengths_kv": tail_kv,
    })
    return out


def helper_padded_slots(scheduled, pcp, slots):
    """``get_padded_slot_mapping``: real tokens' slots at the unpad mask, -1 elsewhere."""
    mask = helper_layout(scheduled, pcp)["unpad_mask"]
    real = iter(slots)
    return [next(real) if keep else -1 for keep in mask]

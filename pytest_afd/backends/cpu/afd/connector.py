"""The a2e / e2a connector: MoE-layer payloads between Attention and FFN ranks over gloo.

Wire format of one a2e message (all point-to-point, ordered per (peer, tag)):
a fixed-size int64 header, then ONE float32 tensor [rows, hidden + 2k + 1]
packing the post-attention-norm rows, their top-k weights, their top-k expert
ids and a per-row flag saying whether the receiving FFN rank applies its
routed experts, its share of the shared experts, or both (ids and flags are
small integers, exact in float32). One payload message instead of four
matters: every gloo transfer is a rendezvous that both processes' transport
threads must serve. The e2a reply is one tensor of expert outputs for the same
rows. Headers use their own tag so an FFN rank can take the next message from
any Attention rank (arrival order) and then read that sender's payload.

Every wait is bounded: a peer that died or hangs surfaces as an error naming it.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pytest_afd.backends.cpu.afd.protocol import PeerWaitError

HEADER_WORDS = 6
HEADER_KIND, HEADER_LAYER, HEADER_UBATCH, HEADER_ROWS, HEADER_TOPK, HEADER_STEP = range(
    HEADER_WORDS
)
KIND_WORK = 1
KIND_END = 2  # the sender has no more MoE work for this step

TAG_HEADER = 1
TAG_PAYLOAD = 2
TAG_RESULT = 3
MAX_EXACT_FLOAT32_INT = 2**24

FLAG_ROUTED = 1
FLAG_SHARED = 2
FLAG_BOTH = FLAG_ROUTED | FLAG_SHARED


class PeerTimeoutError(PeerWaitError):
    """A bounded wait on named peer rank(s) expired or failed; ``peers`` are blamed."""


def _wait(work: dist.Work, timeout_s: float, what: str, peers: Sequence[str]) -> None:
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        kind = "timed out" if "Timed out" in str(exc) else "failed"
        raise PeerTimeoutError(f"{kind} after <= {timeout_s:.1f}s {what}: {exc}",
                               peers=peers) from exc


@dataclass
class A2EPayload:
    """What one FFN rank receives for one (layer, ubatch)."""

    layer: int
    ubatch: int
    step: int
    normed: torch.Tensor  # [rows, hidden]
    topk_ids: torch.Tensor  # [rows, k] int64
    topk_weights: torch.Tensor  # [rows, k]
    flags: torch.Tensor  # [rows] int64, FLAG_* bits


@dataclass
class PendingResult:
    """An a2e dispatch in flight and the posted e2a receive of its result."""

    peer: int
    peer_name: str
    layer: int
    ubatch: int
    rows: torch.Tensor | None  # which ubatch rows the result covers (None: all, in order)
    result: torch.Tensor
    receive: dist.Work
    sends: list[dist.Work]
    keep_alive: tuple[torch.Tensor, ...]  # send buffers must outlive their sends

    def wait(self, timeout_s: float) -> torch.Tensor:
        what = (
            f"waiting for the e2a result of layer {self.layer} ubatch {self.ubatch} "
            f"from {self.peer_name}"
        )
        _wait(self.receive, timeout_s, what, [self.peer_name])
        for send in self.sends:
            _wait(send, timeout_s, f"completing the a2e send to {self.peer_name}",
                  [self.peer_name])
        return self.result


def _header(kind: int, step: int, layer: int = 0, ubatch: int = 0, rows: int = 0, topk: int = 0):
    header = torch.zeros(HEADER_WORDS, dtype=torch.int64)
    header[HEADER_KIND] = kind
    header[HEADER_LAYER] = layer
    header[HEADER_UBATCH] = ubatch
    header[HEADER_ROWS] = rows
    header[HEADER_TOPK] = topk
    header[HEADER_STEP] = step
    return header


def pack(payload: A2EPayload) -> torch.Tensor:
    """One float32 tensor [rows, hidden + 2k + 1]: normed | weights | ids | flags."""
    if payload.topk_ids.numel() and int(payload.topk_ids.max()) >= MAX_EXACT_FLOAT32_INT:
        raise ValueError(f"expert id {int(payload.topk_ids.max())} is not exact in float32")
    return torch.cat(
        [
            payload.normed.float(),
            payload.topk_weights.float(),
            payload.topk_ids.float(),
            payload.flags.float()[:, None],
        ],
        dim=1,
    )


def unpack(packed: torch.Tensor, incoming: Incoming, hidden_size: int) -> A2EPayload:
    """Inverse of ``pack`` for a payload announced by ``incoming``."""
    k = incoming.topk
    normed, weights, ids, flags = packed.split([hidden_size, k, k, 1], dim=1)
    return A2EPayload(
        incoming.layer,
        incoming.ubatch,
        incoming.step,
        normed.contiguous(),
        ids.long(),
        weights.contiguous(),
        flags.squeeze(1).long(),
    )


def dispatch(
    peer: int,
    peer_name: str,
    payload: A2EPayload,
    rows: torch.Tensor | None,
) -> PendingResult:
    """Post the a2e sends and the e2a receive; returns at once (the overlap happens here)."""
    num_rows, topk = payload.topk_ids.shape
    header = _header(KIND_WORK, payload.step, payload.layer, payload.ubatch, num_rows, topk)
    packed = pack(payload)
    sends = [dist.isend(header, peer, tag=TAG_HEADER), dist.isend(packed, peer, tag=TAG_PAYLOAD)]
    result = torch.empty_like(payload.normed, dtype=torch.float32)
    receive = dist.irecv(result, peer, tag=TAG_RESULT)
    return PendingResult(
        peer,
        peer_name,
        payload.layer,
        payload.ubatch,
        rows,
        result,
        receive,
        sends,
        (header, packed),
    )


def send_end(peer: int, peer_name: str, step: int, timeout_s: float) -> None:
    """Tell an FFN rank this Attention rank has no more MoE work in this step."""
    _wait(
        dist.isend(_header(KIND_END, step), peer, tag=TAG_HEADER),
        timeout_s,
        f"telling {peer_name} the step ended",
        [peer_name],
    )


@dataclass
class Incoming:
    """A header taken from any Attention rank."""

    source: int
    kind: int
    layer: int
    ubatch: int
    rows: int
    topk: int
    step: int


def receive_header(timeout_s: float, waiting_on: Sequence[str]) -> Incoming:
    """Next header from whichever Attention rank sent first (bounded).

    ``waiting_on``: the Attention ranks that have not ended the step yet; a
    timeout blames them (one of them stopped sending), not the waiting rank.
    """
    header = torch.empty(HEADER_WORDS, dtype=torch.int64)
    work = dist.irecv(header, tag=TAG_HEADER)
    _wait(work, timeout_s, f"waiting for the next a2e header from {', '.join(waiting_on)}",
          waiting_on)
    values = header.tolist()
    return Incoming(
        source=work.source_rank(),
        kind=values[HEADER_KIND],
        layer=values[HEADER_LAYER],
        ubatch=values[HEADER_UBATCH],
        rows=values[HEADER_ROWS],
        topk=values[HEADER_TOPK],
        step=values[HEADER_STEP],
    )


def receive_payload(
    incoming: Incoming, hidden_size: int, timeout_s: float, source_name: str
) -> A2EPayload:
    """The packed payload that follows a work header from ``incoming.source``."""
    packed = torch.empty((incoming.rows, hidden_size + 2 * incoming.topk + 1), dtype=torch.float32)
    work = dist.irecv(packed, incoming.source, tag=TAG_PAYLOAD)
    _wait(work, timeout_s, f"receiving the a2e payload from {source_name}", [source_name])
    return unpack(packed, incoming, hidden_size)


def send_result(peer: int, result: torch.Tensor) -> dist.Work:
    """Post the e2a reply; the caller waits on it before the step ends."""
    return dist.isend(result.contiguous(), peer, tag=TAG_RESULT)

"""What an FFN rank runs for one forward step.

The routed experts it owns and its share of the shared experts, serving (layer, ubatch)
messages in arrival order until every Attention rank said the step ended.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

from pytest_afd.backends.cpu.afd import connector
from pytest_afd.backends.cpu.afd.evidence import FFN_IDLE, RECV, SEND, Timeline
from pytest_afd.backends.cpu.afd.experts import compute_experts
from pytest_afd.backends.cpu.afd.rank import (
    COMMAND_COPY_KV,
    COMMAND_FORWARD,
    COMMAND_RESET_KV,
    FAULT_HANG,
    FAULT_KILL,
    FAULT_RAISE,
    HANG_SLEEP_S,
    Role,
    involuntary_switches,
)
from pytest_afd.backends.cpu.afd.tracing import traced


class FfnRole(Role):
    """One FFN rank: its expert shard and its share of the shared experts."""

    def handle(self, message: tuple) -> Any:
        command, body = message
        if command in (COMMAND_RESET_KV, COMMAND_COPY_KV):  # the KV cache lives on Attention ranks
            return {}
        if command != COMMAND_FORWARD:
            raise ValueError(f"unknown command {command!r}")
        with torch.inference_mode(), traced(self.spec, body) as trace:
            reply = self.serve(**body)
        return trace.annotate(reply)

    def serve(
        self,
        *,
        step: int,
        instrument: bool,
        quantization: str,
        routing: str,
        fault: dict | None = None,
        agreement_plans: list | None = None,
    ) -> dict:
        """Serve a2e messages until every Attention rank sent its end marker."""
        agreed = self.agree(agreement_plans)
        model = self.models.get(quantization, routing)
        timeline = Timeline(instrument)
        cpu_start = time.process_time()
        switches_start = involuntary_switches()
        # Attention ranks still to end this step: a header timeout blames them.
        running = {rank: self.topology.attention_name(rank)
                   for rank in range(self.topology.num_attention)}
        served = 0
        sends = []
        routed_rows = 0
        while running:
            idle_start = time.perf_counter()
            incoming = connector.receive_header(self.peer_timeout_s, list(running.values()))
            source_name = self.topology.attention_name(incoming.source)
            if incoming.step != step:
                raise RuntimeError(
                    f"{self.spec.name} got step {incoming.step} from {source_name} "
                    f"while serving step {step}"
                )
            if incoming.kind == connector.KIND_END:
                running.pop(incoming.source, None)
                continue
            timeline.add(
                FFN_IDLE,
                incoming.layer,
                incoming.ubatch,
                idle_start,
                time.perf_counter(),
                incoming.source,
            )
            _maybe_fault(fault, incoming.layer)
            with timeline.span(RECV, incoming.layer, incoming.ubatch, incoming.source):
                payload = connector.receive_payload(
                    incoming,
                    self.config.hidden_size,
                    self.peer_timeout_s,
                    source_name,
                )
            layer = model.layers[payload.layer]
            result, num_routed = compute_experts(layer, payload, timeline)
            routed_rows += num_routed
            with timeline.span(SEND, payload.layer, payload.ubatch, incoming.source):
                sends.append((connector.send_result(incoming.source, result), result))
            served += 1
        for work, _ in sends:
            work.wait()
        return {
            "spans": timeline.spans,
            "served": served,
            "routed_rows": routed_rows,
            "cpu_time_s": time.process_time() - cpu_start,
            "involuntary_switches": involuntary_switches() - switches_start,
            "agreed_fingerprints": agreed,
        }


def _maybe_fault(fault: dict | None, layer: int) -> None:
    """Test hook: fail this FFN rank in a chosen way when it reaches a chosen layer."""
    if fault is None or fault["layer"] != layer:
        return
    mode = fault["mode"]
    if mode == FAULT_KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == FAULT_HANG:
        time.sleep(HANG_SLEEP_S)
    if mode == FAULT_RAISE:
        raise RuntimeError(f"injected failure at layer {layer}")

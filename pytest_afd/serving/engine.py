"""The engine thread that owns a served backend: batching, admission and failure isolation.

Every backend call happens on this one thread. Waiting requests are admitted
first come, first served into a batch of at most ``max_num_seqs`` requests and
``max_batch_tokens`` prompt tokens; a batch the backend fails is rerun request
by request, so only the request that breaks it fails. See ``docs/serving.md``.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from pytest_afd.backends.base import Backend, PromptRequest, RequestOutput, RunSettings
from pytest_afd.serving.requests import DEFAULT_MAX_BATCH_TOKENS

ENGINE_IDLE_POLL_S = 0.2
# How long the engine keeps collecting after the first waiting request. A burst
# of concurrent clients reaches the server over a few milliseconds; without a
# window the first request of an all-at-once burst would be prefilled alone.
DEFAULT_BATCH_WINDOW_S = 0.02


@dataclass
class _Pending:
    prompt: PromptRequest
    future: Future[RequestOutput]


@dataclass
class _Counters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    request_success: int = 0
    request_failure: int = 0
    batches: int = 0
    submitted: int = 0
    running: int = 0  # requests in the batch the backend is running now


class PrefillEngine:
    """Owns the backend: every backend call happens on this one thread."""

    def __init__(self, backend: Backend, settings: RunSettings,
                 batch_window_s: float = DEFAULT_BATCH_WINDOW_S,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> None:
        self.backend = backend
        self.settings = settings
        self.batch_window_s = batch_window_s
        self.max_batch_tokens = max_batch_tokens
        self._deferred: Callable[[], None] | None = None
        # A request that did not fit the last batch's token budget: it opens the next one.
        self._carried: _Pending | None = None
        self._queue: queue.Queue[_Pending | Callable[[], None]] = queue.Queue()
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prefill-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt: PromptRequest) -> Future[RequestOutput]:
        future: Future[RequestOutput] = Future()
        with self._lock:
            self._counters.submitted += 1
        self._queue.put(_Pending(prompt, future))
        return future

    def reset_prefix_cache(self) -> None:
        """Runs between batches so a reset never races a forward."""
        done: Future[None] = Future()

        def reset() -> None:
            try:
                self.backend.reset_prefix_cache()
            except Exception as error:  # reported to the caller; the engine keeps running
                done.set_exception(error)
                return
            done.set_result(None)

        self._queue.put(reset)
        done.result()

    def counters(self) -> _Counters:
        with self._lock:
            return dataclasses.replace(self._counters)

    def _next_batch(self) -> list[_Pending] | Callable[[], None] | None:
        """The next control item, or the requests that arrive within the batch window.

        Admission is first come, first served within ``max_num_seqs`` requests and
        ``max_batch_tokens`` prompt tokens; the request that does not fit opens the
        next batch (a prompt longer than the budget runs alone).
        """
        if self._deferred is not None:
            control, self._deferred = self._deferred, None
            return control
        if self._carried is not None:
            first, self._carried = self._carried, None
        else:
            try:
                first = self._queue.get(timeout=ENGINE_IDLE_POLL_S)
            except queue.Empty:
                return None
        if not isinstance(first, _Pending):
            return first
        batch = [first]
        tokens = first.prompt.num_prompt_tokens
        deadline = time.monotonic() + self.batch_window_s
        while len(batch) < self.settings.max_num_seqs:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if not isinstance(item, _Pending):
                self._deferred = item  # runs right after this batch
                break
            if tokens + item.prompt.num_prompt_tokens > self.max_batch_tokens:
                self._carried = item
                break
            batch.append(item)
            tokens += item.prompt.num_prompt_tokens
        return batch

    def _loop(self) -> None:
        while not self._stopping.is_set():
            work = self._next_batch()
            if work is None:
                continue
            if callable(work):
                work()
                continue
            self._run_batch(work)

    def _run_batch(self, batch: list[_Pending]) -> None:
        with self._lock:
            self._counters.running = len(batch)
        try:
            outputs = self.backend.run([pending.prompt for pending in batch], self.settings)
        except Exception as error:  # one failing batch fails its requests, not the server
            if len(batch) > 1:
                # Rerun one by one: only the request that breaks the backend fails.
                for pending in batch:
                    self._run_batch([pending])
                return
            with self._lock:
                self._counters.running = 0
                self._counters.request_failure += len(batch)
            for pending in batch:
                pending.future.set_exception(error)
            return
        by_id = outputs.by_id()
        missing = RuntimeError("the backend returned no output for this request")
        with self._lock:
            self._counters.running = 0
            self._counters.batches += 1
            for pending in batch:
                output = by_id.get(pending.prompt.request_id)
                if output is not None and output.error is None:
                    self._counters.request_success += 1
                    self._counters.prompt_tokens += output.num_prompt_tokens
                    self._counters.cached_tokens += output.num_cached_tokens
                else:
                    self._counters.request_failure += 1
        for pending in batch:
            output = by_id.get(pending.prompt.request_id)
            if output is None:
                pending.future.set_exception(missing)
            else:
                pending.future.set_result(output)

    def metrics_text(self, model_name: str) -> str:
        """vLLM's counter names, so the same scraper reads this server and vLLM."""
        counters = self.counters()
        labels = f'model_name="{model_name}",engine="0"'
        rows = [
            ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in tokens.",
             f"{{{labels}}}", counters.prompt_tokens),
            ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in tokens.",
             f"{{{labels}}}", counters.cached_tokens),
            ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
             f"{{{labels}}}", counters.prompt_tokens),
            ("vllm:request_success", "counter", "Count of successfully processed requests.",
             f'{{{labels},finished_reason="length"}}', counters.request_success),
            ("afd:request_failure", "counter", "Requests whose prefill failed.",
             f"{{{labels}}}", counters.request_failure),
            ("afd:prefill_batches", "counter", "Backend prefill batches run.",
             f"{{{labels}}}", counters.batches),
        ]
        lines = []
        for name, kind, help_text, label_text, value in rows:
            lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total {kind}",
                      f"{name}_total{label_text} {float(value)}"]
        finished = counters.request_success + counters.request_failure
        waiting = counters.submitted - finished - counters.running
        for name, help_text, value in (
            ("vllm:num_requests_running", "Requests in the batch being prefilled.", counters.running),
            ("vllm:num_requests_waiting", "Requests queued for the next batch.", waiting),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                      f"{name}{{{labels}}} {float(value)}"]
        return "\n".join(lines) + "\n"

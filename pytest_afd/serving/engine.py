"""The engine thread that owns a served backend: batching, admission and failure isolation.

Every backend call happens on this one thread. Waiting requests are admitted
first come, first served into a batch of at most ``max_num_seqs`` requests and
``max_batch_tokens`` prompt tokens; a batch the backend fails is rerun request
by request, so only the request that breaks it fails. A request whose client
has gone is aborted before its prefill (vLLM checks the connection the same
way before running a queued request). On stop the running batch finishes and
every request still queued is refused (the server answers 503). See
``docs/serving.md``.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from pytest_afd.core.backend import Backend, PromptRequest, RequestOutput, RunSettings
from pytest_afd.serving.requests import DEFAULT_MAX_BATCH_TOKENS

ENGINE_IDLE_POLL_S = 0.2

# How long the engine keeps collecting after the first waiting request. A burst
# of concurrent clients reaches the server over a few milliseconds; without a
# window the first request of an all-at-once burst would be prefilled alone.
DEFAULT_BATCH_WINDOW_S = 0.02
# /health turns 503 when one batch has run this long: 4x the ~15 s the longest
# admitted prompt (4,096 tokens) takes on a loaded CPU host. A frozen AFD rank
# otherwise leaves /health at 200 until the peer timeout fails the batch.
DEFAULT_STALL_TIMEOUT_S = 60.0


def _wake_up() -> None:
    """A control item that does nothing: stop() queues it to wake an idle engine thread."""


class RequestAborted(RuntimeError):
    """The client went away while its request was queued: it was never prefilled."""


class EngineStopped(RuntimeError):
    """The engine is stopping (SIGTERM): a queued or newly submitted request is refused."""


@dataclass
class _Pending:
    prompt: PromptRequest
    future: Future[RequestOutput]
    # True once the client has gone (None: never checked, e.g. an in-process caller).
    abandoned: Callable[[], bool] | None = None
    # Arrival rank: (the connection's accept number, the submission number). A batch runs
    # its requests in this order, as a FCFS scheduler sees them, not in the order the
    # handler threads happened to submit them.
    arrival: tuple[int, int] = (0, 0)
    # The client's instrumented run (``INSTRUMENT_HEADER``): its batch is profiled.
    instrument: bool = False


@dataclass
class _Counters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    request_success: int = 0
    request_failure: int = 0
    request_aborted: int = 0  # client gone before its prefill, or refused while stopping
    batches: int = 0
    submitted: int = 0
    running: int = 0  # requests in the batch the backend is running now
    batch_started: float | None = None  # time.monotonic() the running batch started


class PrefillEngine:
    """Owns the backend: every backend call happens on this one thread."""

    def __init__(self, backend: Backend, settings: RunSettings,
                 batch_window_s: float = DEFAULT_BATCH_WINDOW_S,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> None:
        if not 0 < stall_timeout_s < float("inf"):
            raise ValueError(f"stall_timeout_s={stall_timeout_s!r}; expected seconds > 0")
        self.backend = backend
        self.stall_timeout_s = stall_timeout_s
        self.settings = settings
        self.batch_window_s = batch_window_s
        self.max_batch_tokens = max_batch_tokens
        self._deferred: Callable[[], None] | None = None
        # A request that did not fit the last batch's token budget: it opens the next one.
        self._carried: _Pending | None = None
        # A batch formed after stop() was asked for: refused, never run.
        self._unrun: list[_Pending] = []
        self._queue: queue.Queue[_Pending | Callable[[], None]] = queue.Queue()
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._stopping = threading.Event()
        self._closed = False  # set under the lock once stop() refused what was queued
        self._thread = threading.Thread(target=self._loop, name="prefill-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def begin_stop(self) -> None:
        """Take no new batch from now on (safe in a signal handler: it only sets an event).

        SIGTERM calls this at once, so a batch that ends before the HTTP loop has noticed
        the shutdown cannot pick up the queued requests that :meth:`stop` must refuse."""
        self._stopping.set()

    def stop(self) -> None:
        """Finish the running batch, then refuse (EngineStopped) every request still queued."""
        self.begin_stop()
        self._queue.put(_wake_up)  # an idle engine sees the stop now, not after its poll
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._closed = True
        leftovers: list[_Pending | Callable[[], None]] = [*self._unrun]
        leftovers += [item for item in (self._carried, self._deferred) if item is not None]
        self._unrun, self._carried, self._deferred = [], None, None
        while True:
            try:
                leftovers.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in leftovers:
            if isinstance(item, _Pending):
                self._finish_unrun(item, EngineStopped(
                    "the server is shutting down; this request was not run"))
            else:
                item()  # a control item (prefix-cache reset): its caller is waiting

    @property
    def healthy(self) -> bool:
        return self.unhealthy_reason() is None

    def unhealthy_reason(self, now: float | None = None) -> str | None:
        """Why ``/health`` should answer 503: the engine thread is gone, or one batch has run
        longer than ``stall_timeout_s`` (a frozen rank: the engine makes no progress)."""
        if not self._thread.is_alive():
            return "the engine thread is not running"
        with self._lock:
            started, running = self._counters.batch_started, self._counters.running
        if started is None:
            return None
        busy_s = (time.monotonic() if now is None else now) - started
        if busy_s <= self.stall_timeout_s:
            return None
        return (f"the engine has run one batch of {running} request(s) for {busy_s:.0f} s "
                f"without finishing (stall bound {self.stall_timeout_s:g} s)")

    def submit(self, prompt: PromptRequest,
               abandoned: Callable[[], bool] | None = None,
               accepted: int | None = None, instrument: bool = False) -> Future[RequestOutput]:
        """Queue one request; ``abandoned`` says whether its client has gone (checked
        before its prefill); ``accepted`` is its connection's accept number (a batch runs
        in accept order); ``instrument``: a batch holding it runs instrumented (this
        stand-in's profiler window). After stop() the future fails with EngineStopped."""
        with self._lock:
            self._counters.submitted += 1
            submitted = self._counters.submitted
            pending = _Pending(prompt, Future(), abandoned,
                               (submitted if accepted is None else accepted, submitted),
                               instrument)
            closed = self._closed
            if not closed:
                self._queue.put(pending)
        if closed:
            self._finish_unrun(pending, EngineStopped(
                "the server is shutting down; this request was not run"))
        return pending.future

    def _finish_unrun(self, pending: _Pending, error: Exception) -> None:
        with self._lock:
            self._counters.request_aborted += 1
        pending.future.set_exception(error)

    def _drop_abandoned(self, batch: list[_Pending]) -> list[_Pending]:
        """The batch without the requests whose clients have gone (aborted, never prefilled)."""
        kept = []
        for pending in batch:
            if pending.abandoned is not None and pending.abandoned():
                self._finish_unrun(pending, RequestAborted(
                    f"{pending.prompt.request_id}: the client disconnected before its prefill"))
            else:
                kept.append(pending)
        return kept

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
        return sorted(batch, key=lambda pending: pending.arrival)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            work = self._next_batch()
            if work is None:
                continue
            if callable(work):
                work()
                continue
            if self._stopping.is_set():
                self._unrun = work
                break
            batch = self._drop_abandoned(work)
            if batch:
                self._run_batch(batch)

    def _run_batch(self, batch: list[_Pending]) -> None:
        with self._lock:
            self._counters.running = len(batch)
            self._counters.batch_started = time.monotonic()
        try:
            settings = self.settings
            if any(pending.instrument for pending in batch):
                settings = dataclasses.replace(settings, instrument=True)
            outputs = self.backend.run([pending.prompt for pending in batch], settings)
        except Exception as error:  # one failing batch fails its requests, not the server
            if len(batch) > 1:
                # Rerun one by one: only the request that breaks the backend fails.
                for pending in batch:
                    self._run_batch([pending])
                return
            with self._lock:
                self._counters.running = 0
                self._counters.batch_started = None
                self._counters.request_failure += len(batch)
            for pending in batch:
                pending.future.set_exception(error)
            return
        by_id = outputs.by_id()
        missing = RuntimeError("the backend returned no output for this request")
        with self._lock:
            self._counters.running = 0
            self._counters.batch_started = None
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
            # vLLM V1 counts aborted requests under the same name (FinishReason.ABORT).
            ("vllm:request_success", "counter", "Count of successfully processed requests.",
             f'{{{labels},finished_reason="abort"}}', counters.request_aborted),
            ("afd:request_failure", "counter", "Requests whose prefill failed.",
             f"{{{labels}}}", counters.request_failure),
            ("afd:prefill_batches", "counter", "Backend prefill batches run.",
             f"{{{labels}}}", counters.batches),
        ]
        lines = []
        for name, kind, help_text, label_text, value in rows:
            if f"# TYPE {name}_total {kind}" not in lines:
                lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total {kind}"]
            lines.append(f"{name}_total{label_text} {float(value)}")
        finished = counters.request_success + counters.request_failure + counters.request_aborted
        waiting = counters.submitted - finished - counters.running
        for name, help_text, value in (
            ("vllm:num_requests_running", "Requests in the batch being prefilled.", counters.running),
            ("vllm:num_requests_waiting", "Requests queued for the next batch.", waiting),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                      f"{name}{{{labels}}} {float(value)}"]
        return "\n".join(lines) + "\n"

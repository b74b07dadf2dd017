"""AsyncEngine: one dedicated thread owns the (not thread-safe) LLMEngine; asyncio handlers
talk to it through a thread-safe command queue.

The same shape as vLLM's ``AsyncLLM`` / ``AsyncLLMEngine`` output handler: requests and aborts
travel to the engine thread through ``queue.Queue``; each step's :class:`RequestOutput`\\ s go
back to the event loop that submitted the request with ``loop.call_soon_threadsafe`` into that
request's ``asyncio.Queue``. The engine thread steps while any request is unfinished and blocks
on the command queue when idle (no polling).

Failure: a step whose forward raises fails only its own requests (``LLMEngine.step``); an
error escaping the engine thread itself ends it, and every request in flight (and every later
one) gets :class:`EngineDeadError` at once, never a hang. Nothing restarts the thread: one
engine thread is started once, and :meth:`AsyncEngine.stop` never lets a second one drive the
same engine (a thread that outlives its stop timeout stays the only driver).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine

logger = logging.getLogger("pagedattn.server")


class EngineDeadError(RuntimeError):
    """The engine thread is not running (stopped, died, or never started): a 503."""


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]
    last_token_time: float | None = None


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    sink: _Sink
    arrival_time: float | None = None


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Snapshot:
    future: concurrent.futures.Future[dict[str, Any]]


_STOP = object()


class AsyncEngine:
    """Run ``engine`` on its own thread and stream its outputs to asyncio callers.

    Args:
        engine: the engine; after :meth:`start` only the engine thread touches it.
        metrics: histograms to observe (TTFT, inter-token latency, e2e, per-step batch), or None.
        stall_timeout_s: :meth:`health` reports a stall when work is pending and the engine
            thread finished no loop iteration for this many seconds.
    """

    def __init__(
        self,
        engine: LLMEngine,
        metrics: ServerMetrics | None = None,
        stall_timeout_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.stall_timeout_s = stall_timeout_s
        self._commands: queue.Queue[Any] = queue.Queue()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._inflight: dict[str, _Sink] = {}  # under _lock: submitted, not yet finished
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False  # stop() was called, or the thread died
        self.death: str | None = None  # why the engine thread died
        self._after_exit: Callable[[], None] | None = None  # see stop(then=...)
        self._stats: dict[str, Any] = engine.get_stats()
        self._last_progress = time.monotonic()
        self.num_step_errors = 0

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, *, after_stop: bool = False) -> None:
        """Start the engine thread if it was never started. With ``after_stop`` (an app's
        lifespan starting again) also when a previous thread was stopped and has exited.
        A thread that died is never restarted (its engine state is unknown), and a thread
        still running blocks any second one.
        """
        with self._lock:
            old = self._thread
            restart = after_stop and old is not None and not old.is_alive() and self.death is None
            if (old is None and not self._closed) or restart:
                self._closed = False
                # this thread (which loaded and warmed up the engine) hands its kernels to the
                # engine thread: its OpenMP team would shorten the engine thread's spins
                # (imported here: a process that only relays requests loads no kernels)
                from pagedattn.kernels.gomp import release_thread_workers

                release_thread_workers()
                self._thread = threading.Thread(
                    target=self._run, name="pagedattn-engine", daemon=True
                )
                self._thread.start()

    def stop(self, timeout_s: float = 10.0, *, then: Callable[[], None] | None = None) -> None:
        """Abort every request, stop the engine thread and wait for it (at most ``timeout_s``;
        a thread still busy after that finishes its step and exits on its own, and no other
        thread is ever started for this engine). ``then`` (e.g. ``engine.close``) runs once
        the thread has stopped: now, or when the busy thread exits, never under a step."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._after_exit = then
        if thread is not None:
            self._commands.put(_STOP)
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("engine thread still busy %.1f s after stop()", timeout_s)
        with self._lock:
            if thread is not None and thread.is_alive():
                return  # the thread runs ``then`` as it exits
            after, self._after_exit = self._after_exit, None
        if after is not None:
            after()

    @property
    def is_running(self) -> bool:
        """True while the engine thread is alive and not stopping."""
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def health(self) -> str | None:
        """None when healthy, else why not: the engine thread is not running, or work is
        pending and it made no progress for ``stall_timeout_s`` seconds."""
        if not self.is_running:
            return self.death or "the engine loop is not running"
        with self._lock:
            pending = bool(self._inflight)
        idle_s = time.monotonic() - self._last_progress
        if pending and idle_s > self.stall_timeout_s:
            return f"the engine made no progress for {idle_s:.1f} s with requests pending"
        return None

    @property
    def stats(self) -> dict[str, Any]:
        """The engine's ``get_stats()`` as of the end of its latest loop iteration (read-only),
        with the persistent tier's counters read now: its writer thread goes on writing after
        the last step of an idle engine."""
        tier = self.engine.kv_tier
        if tier is None:
            return self._stats
        return {**self._stats, "kv_store": tier.stats()}

    # ---- requests (event-loop side) --------------------------------------------------------
    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its outputs until the finished one.

        Leaving the iteration early (the client went away, the task was cancelled) aborts the
        request, which frees its pages.

        Args:
            arrival_time: ``time.monotonic()`` when the server received the request.

        Raises:
            EngineDeadError: the engine thread is not running, or died while this request ran.
            ValueError: the engine refused the request (e.g. a request id already in use).
            RuntimeError: the engine loop failed while running this request.
        """
        sink = _Sink(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if not self.is_running:
                raise EngineDeadError(self.death or "the engine loop is not running")
            if not self._inflight:
                self._last_progress = time.monotonic()  # work starts now
            self._inflight[request_id] = sink
        add = _Add(request_id, list(prompt_token_ids), params, sink, arrival_time)
        self._commands.put(add)
        finished = False
        try:
            while True:
                item = await sink.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                self._inflight.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Ask the engine thread to abort a request (no-op when unknown or finished)."""
        self._commands.put(_Abort(request_id))

    def kv_snapshot(self) -> concurrent.futures.Future[dict[str, Any]]:
        """Ask the engine thread for ``LLMEngine.kv_snapshot()``, taken between two steps; the
        future fails with EngineDeadError when the engine is not running (a stop pending
        behind it leaves it unanswered: wait on it with a timeout)."""
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        if not self.is_running:
            future.set_exception(EngineDeadError(self.death or "the engine loop is not running"))
        else:
            self._commands.put(_Snapshot(future))
        return future

    # ---- engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            logger.exception("the engine thread died")
            self.death = f"the engine thread died: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._closed = True
                orphans = list(self._inflight.values())
            dead = EngineDeadError(self.death or "the engine loop stopped")
            for sink in orphans:  # nobody will answer them: fail them now
                self._deliver(sink, dead)
            with self._lock:
                after = self._after_exit if self._closed else None
                self._after_exit = None
            if after is not None:
                after()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            block = not engine.has_unfinished_requests()
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                command = None
            while command is not None:
                if command is _STOP:
                    self._shutdown()
                    return
                self._apply(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if engine.has_unfinished_requests():
                self._step()
            self._last_progress = time.monotonic()

    def _apply(self, command: _Add | _Abort | _Snapshot) -> None:
        if isinstance(command, _Abort):
            self.engine.abort(command.request_id)
            return
        if isinstance(command, _Snapshot):
            if command.future.set_running_or_notify_cancel():
                try:
                    snapshot = self.engine.kv_snapshot()
                except Exception as exc:
                    command.future.set_exception(exc)
                else:  # /metrics reads the same counters (the tier's move between steps)
                    self._stats = snapshot["stats"]
                    command.future.set_result(snapshot)
            return
        try:
            self.engine.add_request(
                command.prompt_token_ids,
                command.params,
                command.request_id,
                arrival_time=command.arrival_time,
            )
        except ValueError as exc:
            self._deliver(command.sink, exc)
            return
        self._sinks[command.request_id] = command.sink

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # outside the forward (scheduling, bookkeeping): keep
            # serving, fail the requests in flight
            logger.exception("engine step failed; aborting %d request(s)", len(self._sinks))
            self.num_step_errors += 1
            error = RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}")
            for request_id, failed in list(self._sinks.items()):
                self._safe_abort(request_id)
                self._deliver(failed, error)
            self._sinks.clear()
            return
        self._stats = self.engine.get_stats()
        if self.metrics is not None:
            self.metrics.observe_step(outputs.report)
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            sink = self._sinks.get(out.request_id)
            if sink is None:
                continue
            if self.metrics is not None:
                sink.last_token_time = self.metrics.observe_output(out, sink.last_token_time)
            if out.finished:
                del self._sinks[out.request_id]
            self._deliver(sink, out)

    def _safe_abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:
            logger.exception("abort of %s failed", request_id)

    def _deliver(self, sink: _Sink, item: RequestOutput | BaseException) -> None:
        try:
            sink.loop.call_soon_threadsafe(sink.queue.put_nowait, item)
        except RuntimeError:  # the submitting event loop is closed: nobody is listening
            if isinstance(item, RequestOutput) and not item.finished:
                self._safe_abort(item.request_id)

    def _shutdown(self) -> None:
        for request_id in list(self._sinks):
            self._safe_abort(request_id)
        while self.engine.has_unfinished_requests():  # return the aborts' final outputs
            self._dispatch(self.engine.step())
        self._stats = self.engine.get_stats()

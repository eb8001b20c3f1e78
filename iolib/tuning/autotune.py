"""Adapts the loader's telemetry to a tuner and applies its decisions to the engine.

``DataLoader(prefetch="auto", target_utilization=0.9, memory_budget="2GiB")`` runs the
learned tuner (predictors.tuner.QueueingTuner); ``prefetch=<any object with decide()>``
runs that tuner instead (the baselines in predictors.baselines, for comparisons).
A decision changes the worker count and the prefetch depth only: pace and memory,
never which samples come in which order.

Tuners decide on a thread of their own (`background=False`: inside `__next__`). A
learned re-plan asks the model about every candidate (about 50 ms on 2 cores); inside
`__next__` that was a 50 ms stall per decision, 12 steps of 4 ms each, which cost more
utilization than the decisions gained. The loader hands each batch's numbers over and
applies a decision at the next batch after it is made.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

from iolib.base.resources import cpu_count
from iolib.errors import ConfigError
from iolib.fetcher import BatchMeta

# The documented logger name (docs/tuning.md), kept when the module was renamed.
log = logging.getLogger("iolib.tuning")


def _predictor_error(exc: Exception) -> ConfigError:
    return ConfigError(str(exc))


class AutoPrefetch:
    """Feeds one TunerState per batch to a tuner and applies what it decides."""

    def __init__(
        self,
        tuner: Any,
        *,
        batch_size: int,
        rows_per_read: int,
        max_workers: int,
        memory_budget: int | None,
        target: float | None,
        background: bool = True,
        cpus: int | None = None,
        recorder: Any = None,
    ) -> None:
        self.tuner = tuner
        # The run history (iolib.tuning.run_history.Recorder): what this run measured, recorded.
        self.recorder = recorder
        self._set_aside_said = False
        self.background = background
        self.batch_size = batch_size
        self.rows_per_read = max(1, rows_per_read)
        self.max_workers = max_workers
        self.memory_budget = memory_budget
        self.target = target
        self.cpu_count = cpu_count() if cpus is None else cpus
        self.applied: list[dict[str, Any]] = []
        self._batch = 0
        self.last = None
        self._requested: tuple[int, int] | None = None  # the last configuration asked for
        # Background deciding: states in, at most one change out, errors carried over.
        self._states: queue.Queue[Any] = queue.Queue(maxsize=1024)
        self._change: tuple[int, int] | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.states_dropped = 0  # batches the tuner never saw (it fell 1024 behind)
        # The current configuration's recent batches as the loader measured them, every
        # one and without epoch starts: what stats() sets beside the tuner's prediction.
        self._measured: tuple[tuple[int, int], Any, Any] | None = None

    @classmethod
    def learned(
        cls,
        *,
        target: float,
        memory_budget: int | None,
        max_workers: int,
        batch_size: int,
        rows_per_read: int,
        cpus: int | None = None,
        recorder: Any = None,
    ) -> AutoPrefetch:
        """The learned tuner with the default model (the queueing model if none loads);
        with a `recorder` whose workload has history, a warm start from it."""
        try:
            from predictors.tuner import QueueingTuner, check_target

            check_target(target)
            warm = None
            if recorder is not None:
                warm = recorder.warm_start(target, memory_budget, max_workers)
                if warm is not None:
                    log.info("tuner: %s", warm.describe())
            tuner = QueueingTuner(
                target_utilization=target,
                memory_budget_bytes=memory_budget,
                max_workers=max_workers,
                warm=warm,
            )
        except ValueError as exc:  # predictors' own errors are ValueErrors
            raise _predictor_error(exc) from exc
        return cls(
            tuner,
            batch_size=batch_size,
            rows_per_read=rows_per_read,
            max_workers=max_workers,
            memory_budget=memory_budget,
            target=target,
            cpus=cpus,
            recorder=recorder,
        )

    def start(self) -> tuple[int, int]:
        """(workers, depth) to begin with: the tuner's safe start when it has one."""
        workers, depth = getattr(self.tuner, "start", (2, 2))
        self._requested = max(1, min(workers, self.max_workers)), max(1, depth)
        return self._requested

    def observe(
        self,
        meta: BatchMeta,
        *,
        waited_s: float,
        step_s: float,
        workers: int,
        depth: int,
        bytes_in_flight: int,
        epoch_start: bool = False,
    ) -> tuple[int, int] | None:
        """Report one batch; returns a new (workers, depth) when the tuner changes them.
        `epoch_start`: the first batch of an iteration (it waited for an empty pipeline)."""
        from predictors.state import TunerState

        stages = meta.stage_ms
        state = TunerState(
            batch_index=self._batch,
            workers=workers,
            depth=depth,
            batch_size=self.batch_size,
            step_ms=1e3 * step_s,
            stall_ms=1e3 * waited_s,
            read_ms=stages.get("read", 0.0),
            decode_ms=stages.get("decode", 0.0),
            transform_ms=stages.get("transform", 0.0) + stages.get("collate", 0.0),
            bytes_per_batch=float(meta.bytes_read or meta.nbytes),
            memory_bytes=float(bytes_in_flight),
            cpu_count=self.cpu_count,
            batch_memory_bytes=float(max(meta.nbytes, 1)),
            rows_per_read=self.rows_per_read,
            epoch_start=epoch_start,
            cpu_ms=sum(meta.cpu_ms.values()) if meta.cpu_ms else None,
            read_cpu_ms=meta.cpu_ms.get("read"),
        )
        self._batch += 1
        self._measure(state)
        if self._requested is None:
            self._requested = (workers, depth)
        if not self.background or state.batch_index == 0:
            # The first at once: a budget below one batch or a bad model raises here,
            # at the first batch, not one batch later on another thread.
            return self._decide(state)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        try:
            self._states.put_nowait(state)
        except queue.Full:
            self.states_dropped += 1
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name="iolib-tuner", daemon=True)
            self._thread.start()
        with self._lock:
            change, self._change = self._change, None
        return change

    def _measure(self, state: Any) -> None:
        """Count the batch toward its configuration's measured utilization (the run's
        first batch aside: no configuration shortens a cold start)."""
        key = (state.workers, state.depth)
        if self._measured is None or self._measured[0] != key:
            from predictors.measure import Measured  # here, not per batch

            self._measured = (key, Measured(), Measured())
        if state.batch_index > 0:
            self._measured[1].add(state)
            if not state.epoch_start:
                self._measured[2].add(state)

    def _serve(self, idle_s: float = 5.0) -> None:
        """Decide for each state in turn; exit after `idle_s` without one (observe()
        starts a new thread then), so a loader dropped without close() leaves none."""
        while True:
            try:
                state = self._states.get(timeout=idle_s)
            except queue.Empty:
                return
            try:
                if state is None:
                    return  # close()
                change = self._decide(state)
                if change is not None:
                    with self._lock:
                        self._change = change
            except BaseException as exc:  # handed to the training loop by observe()
                self._error = exc
            finally:
                self._states.task_done()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until every state handed over has been decided on (True), or `timeout`."""
        deadline = time.monotonic() + timeout
        while self._states.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.002)
        return not self._states.unfinished_tasks

    def close(self, timeout: float = 5.0) -> None:
        """Decide on what was handed over (stats then show every decision), then stop
        and record the run in the history. Never waits much longer than `timeout`."""
        self._close(timeout)
        if self.recorder is not None:
            self.recorder.flush(self._requested, wait=True)

    def epoch_end(self) -> None:
        """An epoch ended: record what the run measured so far (on a thread)."""
        if self.recorder is not None:
            self.recorder.flush(self._requested, wait=False)

    def _close(self, timeout: float) -> None:
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self.wait_idle(timeout)
            with contextlib.suppress(queue.Full):
                self._states.put(None, timeout=timeout)
            thread.join(timeout)
            return
        # The thread had already left on an idle timeout, possibly just as a state came.
        while True:
            try:
                state = self._states.get_nowait()
            except queue.Empty:
                return
            try:
                if state is not None:
                    self._decide(state)
            except Exception:  # closing: the training loop is done with the tuner
                log.debug("tuner error while closing", exc_info=True)
            finally:
                self._states.task_done()

    def _decide(self, state: Any) -> tuple[int, int] | None:
        """The tuner's decision for `state`; the (workers, depth) to apply if it changed."""
        if self.recorder is not None:
            self.recorder.add(state)
        try:
            decision = self.tuner.decide(state)
        except ValueError as exc:
            raise _predictor_error(exc) from exc
        self.last = decision
        aside = getattr(self.tuner, "warm_set_aside", None)
        if aside and not self._set_aside_said:
            self._set_aside_said = True
            log.info("tuner: the run history is set aside for this run: %s", aside)
        wanted = (max(1, min(decision.workers, self.max_workers)), max(1, decision.depth))
        if wanted == self._requested:
            return None
        self._requested = wanted
        self.applied.append(
            {
                "batch": state.batch_index,
                "workers": wanted[0],
                "depth": wanted[1],
                "reason": decision.reason,
                "feasible": getattr(decision, "feasible", True),
                "bottleneck": getattr(decision, "bottleneck", None),
                "predicted": dict(getattr(decision, "predicted", {}) or {}),
            }
        )
        predicted = self.applied[-1]["predicted"]
        if "prior_utilization" in predicted:  # the learned tuner: the model's part in numbers
            log.info(
                "tuner: %d workers, depth %d (prior %.3f, model %+.3f, sd %.3f): %s",
                *wanted,
                predicted["prior_utilization"],
                predicted.get("model_change", 0.0),
                predicted.get("model_sd", 0.0),
                decision.reason,
            )
        else:
            log.info("tuner: %d workers, depth %d: %s", *wanted, decision.reason)
        return wanted

    def report(self) -> dict[str, Any]:
        """What `loader.stats()["tuner"]` shows: decisions with reasons, feasibility,
        and the current configuration's measured utilization beside its prediction (a
        feasibility the measurement contradicts is reported as None, not True)."""
        from predictors.measure import against_measured

        last = self.last
        _, every, in_epoch = self._measured or (None, None, None)
        predicted = (getattr(last, "predicted", None) or {}).get("utilization")
        measured = against_measured(predicted, every, in_epoch, self.target)
        feasible = getattr(last, "feasible", True) if last else None
        if feasible and measured["disagreement"] and measured["target_met_as_measured"] is False:
            feasible = None  # predicted to meet it, measured not to: not known
        return {
            "tuner": type(self.tuner).__name__,
            # Which model moves the prior (each decision's `predicted` holds the prior's
            # utilization, the model's change and its sd).
            "model": getattr(self.tuner, "model_part", None),
            "target_utilization": self.target,
            "memory_budget": self.memory_budget,
            "decisions": list(self.applied),
            "feasible": feasible,
            "bottleneck": getattr(last, "bottleneck", None) if last else None,
            "reason": last.reason if last else "no batch yet",
            **measured,
            "states_dropped": self.states_dropped,
            # The run history's model (predictors.explore): its plan, weight and why.
            "history_model": getattr(self.tuner, "history_model", None),
            # How many earlier runs of this workload the history holds, where this run
            # started from, and why it stopped using them (None: it did not).
            "history": None
            if self.recorder is None
            else {
                **self.recorder.report(),
                "set_aside": getattr(self.tuner, "warm_set_aside", None),
                # What the next run of this workload will try (its start, or a probe
                # one step cheaper) and why, from the history with this run in it.
                "next_run": self._next_run(),
            },
        }

    def _next_run(self) -> dict[str, Any] | None:
        """`predictors.explore.next_run` on the history's records and this run's so far
        (the model's weight as this run earned it); None if it cannot be said."""
        from predictors.explore import next_run

        recorder = self.recorder
        assert recorder is not None
        try:
            earlier = list(recorder.warm.records) if recorder.warm is not None else []
            proposal = getattr(self.tuner, "proposal", None)
            return next_run(
                earlier + recorder.records(self._requested),
                self.target,
                budget=self.memory_budget,
                max_workers=self.max_workers,
                weight=None if proposal is None else proposal.weight,
            )
        except Exception as exc:  # a report never fails a run
            log.debug("tuner: no next-run plan (%s: %s)", type(exc).__name__, exc)
            return None

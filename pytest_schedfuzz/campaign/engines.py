"""The implementations under test in one session, and what is done before a run is judged.

``Engines`` starts each on first use: the graph engine (the built-in ggml, or a user's
``--schedfuzz-target``), llama.cpp, and the graph engine under ``GGML_SCHED_DEBUG_REALLOC=2``
(``debug_realloc``). Every trace it returns has the figures ggml does not tell derived
(``properties.derived``), and a crash or a timeout in it has come back on a fresh worker
(``confirmed``, ``llama_confirmed``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cases.corpus import Case
from ..engine import Target, load_target
from ..model.llama_trace import LlamaAbort, LlamaTrace
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario
from ..model.trace import Abort, Trace
from ..profiles import FuzzConfig
from ..properties import derived
from .stats import Stats

CONFIRM_TIMEOUT_FACTOR = 5  # a timeout's confirmation run waits this many times longer per step
# a workload Hypothesis mutates keeps its model, context and calls, and so its CPU-only run, about a
# third of the time (its devices change)
CPU_RUNS_KEPT = 128


class Deferred:
    """A computation run at most once, while an engine works: what it returns or raises is kept
    for ``result`` (an error of the reference must not leave the engine's worker unread)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._value = self.fn()
        except BaseException as e:  # Ctrl-C too: raised by ``result``, once the engine's reply is read
            self._error = e

    def result(self) -> Any:
        self()
        if self._error is not None:
            raise self._error
        return self._value


class Engines:
    """The graph engine, llama.cpp and the size oracle of one session (one pytest-xdist worker)."""

    def __init__(self, config: FuzzConfig, stats: Stats, seed: int) -> None:
        self.config = config
        self.stats = stats
        self.seed = seed
        self._target: Target | None = None
        self._llama: Any = None
        self._oracles: dict[int, Any] = {}  # GGML_SCHED_DEBUG_REALLOC level -> engine
        self._llama_oracle: Any = None
        self._lost_seen = 0  # the llama.cpp target's ``servers.lost`` counted so far
        self._cpu_runs: OrderedDict[str, LlamaTrace] = OrderedDict()  # CPU-only workload JSON -> its run (``cpu_run``)

    @property
    def target(self) -> Target:
        """The graph engine: ``--schedfuzz-target``, or the built-in ggml (``ggml.graph_target.GgmlTarget``)."""
        if self._target is None:
            if self.config.target:
                self._target = load_target(self.config.target)
            else:
                from ..ggml.graph_target import GgmlTarget

                self._target = GgmlTarget(lib=self.config.lib)
        return self._target

    @property
    def llama_target(self) -> Any:
        """The real llama.cpp (``llama.llama_target.LlamaTarget``)."""
        if self._llama is None:
            from ..llama.llama_target import LlamaTarget

            self._llama = LlamaTarget(lib_dir=self.config.llama_lib)
        return self._llama

    def debug_realloc(self, level: int) -> Any:
        """The built-in ggml under ``GGML_SCHED_DEBUG_REALLOC=level`` (1 or 2): it aborts at its
        first same-size (1) or first (2) re-reservation, printing its own figures (``observed``)."""
        if level not in self._oracles:
            from ..ggml.graph_target import GgmlTarget

            self._oracles[level] = GgmlTarget(lib=self.config.lib, debug_realloc=level)
        return self._oracles[level]

    def llama_debug_realloc(self) -> Any:
        """llama.cpp under ``GGML_SCHED_DEBUG_REALLOC=1``: it aborts at its first same-size
        re-reservation (``observed.confirm_llama_same_size``)."""
        if self._llama_oracle is None:
            from ..llama.llama_target import LlamaTarget

            self._llama_oracle = LlamaTarget(lib_dir=self.config.llama_lib, debug_realloc=1)
        return self._llama_oracle

    def fresh(self) -> None:
        """The next run of every engine started so far begins on a fresh worker and fresh RPC
        servers (``WorkerTarget.fresh``; a user's target is closed), and no CPU-only run is taken
        from the kept ones: what a confirmation replays (``confirm``)."""
        for engine in (self._target, self._llama, self._llama_oracle, *self._oracles.values()):
            if engine is not None:
                getattr(engine, "fresh", getattr(engine, "close", lambda: None))()
        self._cpu_runs.clear()

    def llama_build(self) -> str:
        """The name of the llama.cpp under test, as a case's ``known_on`` names builds."""
        return str(self.llama_target.build)

    def llama_started(self) -> bool:
        """Whether the llama.cpp target's worker has started (and described its build)."""
        return self._llama is not None and bool(getattr(self._llama, "engine", None))

    def started(self) -> bool:
        """Whether the graph engine runs (a user's target counts as started)."""
        return self._target is not None or bool(self.config.target)

    def info(self) -> dict[str, str]:
        """The graph engine's description (starting it if need be): for the built-in ggml its
        library path, ``ggml_version()`` and bindings check."""
        target = self.target
        start = getattr(target, "start", None)
        return dict(start() if callable(start) else getattr(target, "engine", None) or {"name": self.config.target or "ggml"})

    def ggml_version(self, llama: bool) -> str | None:
        """The ggml version of the engine that runs llama.cpp workloads or graph scenarios."""
        if llama:
            return self.llama_target.start().get("ggml_version")
        return self.info().get("ggml_version") if self.config.target is None else None

    def gpu_device(self) -> str:
        """``available``, or why the built-in engine's ggml cannot have GPU-like devices."""
        if self.config.target is not None:
            return "available"
        return self.info().get("gpu_device", "available")

    def run(self, scenario: Scenario, meanwhile: Deferred | None = None, values: bool = True) -> Trace:
        """The graph engine's trace, with the figures ggml does not tell derived. ``meanwhile``
        (the reference's prediction) runs while the built-in engine's worker, another process,
        runs the scenario; after the run on any other target. ``values=False``: no property
        compares this run's values (the built-in engine then skips its values oracle)."""
        from ..ggml.graph_target import GgmlTarget

        if isinstance(self.target, GgmlTarget):
            trace = derived.graph_trace(self.target.run(scenario, meanwhile, values))
        else:
            trace = derived.graph_trace(self.target.run(scenario))
            if meanwhile is not None:
                meanwhile()
        self.stats.add_trace(trace)
        return trace

    def run_llama(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile: Deferred | None = None,
                  on_graph: Callable[[dict[str, Any]], None] | None = None) -> LlamaTrace:
        """llama.cpp's trace of ``workload``, its graph sizes derived (with ``capture``, its graphs
        too); ``meanwhile`` runs while llama.cpp's worker, another process, runs the workload, and
        ``on_graph`` with each graph captured as it comes (``LlamaTarget.run``)."""
        target = self.llama_target
        trace = derived.llama_trace(target.run(workload, logits, capture, meanwhile, on_graph))
        # servers found dead that no workload was charged for: counted and listed, never silent
        lost = getattr(getattr(target, "servers", None), "lost", [])
        for death in lost[self._lost_seen:]:
            key = f"RPC server {death.status}; last client: {death.client or 'none'}"
            self.stats.rpc_servers_lost[key] = self.stats.rpc_servers_lost.get(key, 0) + 1
        self._lost_seen = len(lost)
        return trace

    def cpu_run(self, workload: LlamaWorkload, meanwhile: Deferred | None = None) -> LlamaTrace:
        """The run of a CPU-only workload (``properties.llama_logits.cpu_only``) with its logits, the
        oracle of llama-same-logits. ggml's CPU backend computes it alike every time (one thread,
        the same model file), so a run that ended without an abort is kept for the next workload
        that needs it (the last ``CPU_RUNS_KEPT``; counted in ``llama_cpu_runs_kept``)."""
        key = json.dumps(workload.to_json(), sort_keys=True)
        kept = self._cpu_runs.get(key)
        if kept is not None:
            self._cpu_runs.move_to_end(key)
            self.stats.llama_cpu_runs_kept += 1
            if meanwhile is not None:
                meanwhile()
            return kept
        trace = self.run_llama(workload, True, meanwhile=meanwhile)
        if trace.abort is None:
            self._cpu_runs[key] = trace
            if len(self._cpu_runs) > CPU_RUNS_KEPT:
                self._cpu_runs.popitem(last=False)
        return trace

    def confirmed(self, scenario: Scenario, trace: Trace, run: Callable[[Scenario], Trace] | None = None) -> Trace:
        """A crash (a signal, no assert) or a timeout counts only if it happens again on a fresh
        worker: a worker that ran many scenarios can die of what an earlier one left in its
        memory, and a machine loaded by other work (pytest-xdist) can stall a step past its
        timeout. One that does not come back is counted (``unconfirmed crashes``) and its
        scenario kept in ``.schedfuzz/unconfirmed/`` for a look, and the fresh run's trace is
        judged instead. A timeout is run again with five times the step timeout: a step that
        a loaded machine only slowed finishes then, a hang does not (one patient run decides). A
        crash that does not come back at once is run again, each time on a fresh worker, up to
        ``confirm_runs`` times in all (a crash that comes back only sometimes is still a crash).
        ``run``: how the trace was run (``Fuzzer.check``'s), ``self.run`` by default."""
        if trace.abort is None or trace.abort.kind not in ("crash", "timeout") or not hasattr(self.target, "close"):
            return trace
        patient = trace.abort.kind == "timeout" and hasattr(self.target, "step_timeout")
        if patient:
            usual = self.target.step_timeout  # type: ignore[attr-defined]
            self.target.step_timeout = usual * CONFIRM_TIMEOUT_FACTOR  # type: ignore[attr-defined]
        try:
            for _ in range(1 if trace.abort.kind == "timeout" else self.config.confirm_runs):
                getattr(self.target, "fresh", self.target.close)()  # the next run starts a fresh worker and fresh servers
                again = (run or self.run)(scenario)
                if again.abort is not None and again.abort.kind == trace.abort.kind:
                    return again
        finally:
            if patient:
                self.target.step_timeout = usual  # type: ignore[attr-defined]
        self._keep_unconfirmed(trace.abort, again.abort, scenario=scenario)
        return again

    def _keep_unconfirmed(self, abort: Abort | LlamaAbort, again: Abort | LlamaAbort | None, scenario: Scenario | None = None,
                          llama: LlamaWorkload | None = None) -> None:
        """A crash or timeout that did not come back, kept (``keep_unconfirmed``) with both runs'
        messages (``again``: the fresh run's abort, None where it ran through)."""
        first = abort.message.strip().splitlines()[0] if abort.message.strip() else abort.kind
        target = self._llama if llama is not None else self.target
        step = abort.step if isinstance(abort, Abort) else max(abort.call, 0)
        message = (f"{abort.message[-3000:]}\n\non fresh workers ({self.config.confirm_runs} replays), the last: "
                   + (f"{again.kind}: {again.message[-3000:]}" if again else "ran through"))
        self.keep_unconfirmed(Case("llama-no-abort" if llama is not None else "no-abort", f"unconfirmed {abort.kind}", scenario, message,
                                   step, self.seed, dict(getattr(target, "engine", {}) or {}),
                                   {"fail": f"did not come back on fresh workers ({self.config.confirm_runs} replays): {first}"}, llama=llama))

    def keep_unconfirmed(self, case: Case) -> Path | None:
        """A failure that did not come back on a fresh worker, counted and kept as a case in
        ``.schedfuzz/unconfirmed/`` (listed by the summary): not a finding, not lost either.
        Its file, or None where the run keeps no files."""
        self.stats.unconfirmed += 1
        if self.config.database is None:
            return None
        from ..cases.corpus import save_case

        try:
            path = save_case(Path(self.config.database).parent / "unconfirmed", case)
        except OSError:
            return None
        self.stats.unconfirmed_cases[str(path)] = 1
        return path

    def llama_confirmed(self, workload: LlamaWorkload, trace: LlamaTrace, logits: bool = False, capture: bool = False,
                        on_graph: Callable[[dict[str, Any]], None] | None = None) -> LlamaTrace:
        """As ``confirmed``, for llama.cpp: a crash or a timeout counts only if it comes back on
        a fresh worker (the target starts one after every abort), a timeout with five times the
        call timeout; one that does not is counted as unconfirmed, kept as a case, and the fresh
        run (captured as the first was) is judged. So does an abort because an RPC server was gone:
        unreachable at all (an earlier workload killed it) or killed by a signal during this one;
        fresh servers tell whether this workload is the cause. As for the graph engine, a crash
        that does not come back at once is run again up to ``confirm_runs`` times in all."""

        if trace.abort is None or (trace.abort.kind not in ("crash", "timeout") and not _server_gone(trace.abort)):
            return trace
        target = self.llama_target
        usual = target.call_timeout
        if trace.abort.kind == "timeout":
            target.call_timeout = usual * CONFIRM_TIMEOUT_FACTOR
        try:
            for k in range(1 if trace.abort.kind == "timeout" else self.config.confirm_runs):
                if _server_gone(trace.abort) or k:
                    target.fresh()  # new RPC servers (and worker), whatever killed the old ones
                again = self.run_llama(workload, logits, capture, on_graph=on_graph)
                if again.abort is not None and again.abort.kind == trace.abort.kind:
                    return again
        finally:
            target.call_timeout = usual
        self._keep_unconfirmed(trace.abort, again.abort, llama=workload)
        return again

    def close(self) -> None:
        for engine in self._oracles.values():
            engine.close()
        self._oracles.clear()
        for name in ("_target", "_llama", "_llama_oracle"):
            engine = getattr(self, name)
            if engine is not None:
                engine.close()
                setattr(self, name, None)


def _server_gone(abort: LlamaAbort) -> bool:
    """Whether an RPC server of the workload died (its exit status, read from the process:
    ``LlamaAbort.servers``), or ggml-rpc's client could not connect to one at all."""
    return bool(abort.servers) or ("ggml-rpc" in abort.message and "Failed to connect to" in abort.message)

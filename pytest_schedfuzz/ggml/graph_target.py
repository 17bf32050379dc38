"""``GgmlTarget``: runs scenarios on the real ggml, in a worker process, with local RPC servers.

The parent never loads ggml. It keeps one worker (``worker.py``) and a pool of RPC servers
(``rpc.RpcServers``, grown to the largest number of RPC backends asked so far), sends each
scenario to the worker and collects its step records. When ggml aborts, crashes or a step
runs past ``step_timeout``, the worker is killed, the trace ends with an ``Abort``, and the
next scenario gets a fresh worker.
"""

from __future__ import annotations

import os
import signal
import weakref
from collections.abc import Callable
from dataclasses import replace

from ..engine import TargetError, Unsupported
from ..model.scenario import Scenario
from ..model.shapes import SpecError
from ..model.trace import Abort, StepRecord, Trace
from ..process.children import KILLED_FROM_OUTSIDE
from ..process.rpc import RpcServers
from ..process.worker import Worker, WorkerGone, WorkerTarget, WorkerTimeout
from .kept import SentSpecs
from .lib import LIB_ENV, child_env, resolve_lib
from .rpc_program import RpcProgram

WORKER = "pytest_schedfuzz.ggml.graph_worker"


class _Unreachable(Exception):
    """The worker found no RPC server at this endpoint."""


class GgmlTarget(WorkerTarget):
    """The real ggml engine: ``lib`` is what ``--schedfuzz-lib`` takes (``ggml-0.25.3``,
    ``ggml-0.15.3`` or a build's folder, see ``lib.resolve_lib``); it defaults to
    ``$SCHEDFUZZ_GGML_LIB``, then to the newest built-in ggml. ``step_timeout`` bounds each step (and the
    setup of a scenario's backends); ``start_timeout`` bounds the worker's startup probe.
    ``engine`` describes the loaded ggml once the worker has started. ``debug_realloc`` runs
    ggml with ``GGML_SCHED_DEBUG_REALLOC=1``: ggml's own check, which aborts on a same-size
    realloc in ``ggml_backend_sched_alloc_splits`` (an independent oracle for that property).
    """

    module, what = WORKER, "ggml"

    def __init__(
        self,
        lib: str | None = None,
        step_timeout: float = 60.0,
        start_timeout: float = 120.0,
        bare: bool = False,
        debug_realloc: int = 0,
    ) -> None:
        self.lib_dir = resolve_lib(lib or os.environ.get(LIB_ENV))
        self.step_timeout = step_timeout
        self.bare = bare  # benchmarks: the scheduler without debug output, no splits recorded
        self.debug_realloc = debug_realloc
        self.start_timeout = start_timeout
        self.servers = RpcServers(RpcProgram(self.lib_dir))
        self._runs = 0  # scenarios run (each RPC server's last client is named by its number)
        self.engine: dict[str, str] = {}
        self._sent: weakref.WeakKeyDictionary[Worker, SentSpecs] = weakref.WeakKeyDictionary()  # what each worker keeps (``kept``)

    @property
    def worker_pid(self) -> int | None:
        return self._worker.proc.pid if self._worker is not None else None

    def _env(self) -> dict[str, str]:
        env = child_env(self.lib_dir, **({"SCHEDFUZZ_BARE": "1"} if self.bare else {"GGML_SCHED_DEBUG": "2"}))
        env.pop("GGML_SCHED_DEBUG_REALLOC", None)  # it turns same-size reallocations into aborts
        if self.debug_realloc:
            env["GGML_SCHED_DEBUG_REALLOC"] = str(int(self.debug_realloc))
        if self.bare:
            env.pop("GGML_SCHED_DEBUG", None)
        return env

    def run(self, scenario: Scenario, meanwhile: Callable[[], None] | None = None, values: bool = True) -> Trace:
        """Run ``scenario``; a worker or RPC server killed from outside (``SIGKILL``/``SIGTERM``:
        an infrastructure fault, not ggml) makes it run once more, on fresh processes, and a
        ``TargetError`` if that happens again. ``meanwhile`` is called once the worker has the
        scenario, while it runs (the caller makes it idempotent: a run may be sent again).
        ``values=False``: nobody compares the compute steps' values (``ggml.cpu_values``). The worker
        takes what it is sent as valid: the scenario is validated while it runs (``_sent``)."""
        for attempt in range(2):
            trace, infra = self._run_once(scenario, meanwhile, values)
            if infra is None:
                return trace
            if attempt:
                raise TargetError(f"infrastructure fault, twice in a row (not ggml): {infra}")
        raise AssertionError("unreachable")

    def _run_once(self, scenario: Scenario, meanwhile: Callable[[], None] | None, values: bool) -> tuple[Trace, str | None]:
        self._runs += 1
        n_rpc = scenario.layout.n_rpc
        for attempt in range(2):
            endpoints = self.servers.ensure(n_rpc)
            self.servers.assign(n_rpc, f"ggml scenario {self._runs} of this target ({len(scenario.steps)} steps, {n_rpc} RPC)")
            worker = self._live_worker()
            records: list[StepRecord] = []
            try:
                self._send(worker, scenario, endpoints, values)
                if meanwhile is not None:
                    meanwhile()
                abort = self._collect(worker, records)
                break
            except _Unreachable as e:
                if attempt:
                    raise TargetError(f"the RPC server at {e} does not answer, even after a restart") from None
                self.servers.restart(str(e))
            except (Unsupported, TargetError):
                raise  # the worker reported it and waits for the next scenario
            except OSError as e:  # the pipe to a worker that was just killed
                self._worker = None
                worker.close()
                return self._trace(records, None), f"the ggml worker's pipe closed ({e})"
            except BaseException:
                # an unexpected message, or interrupted: the worker is out of step with us
                self._worker = None
                worker.close()
                raise
        # a server's death is charged only to a scenario that used servers, and only its own servers'
        # (the worker's round trip after each compute made a crash abort the step that caused it)
        deaths = self.servers.deaths(n_rpc) if n_rpc else []
        outside = "; ".join(d.report() for d in deaths if d.from_outside)
        if abort is None:
            if not deaths:
                return self._trace(records, None), None
            if outside:  # killed from outside (the OOM killer, a user): an infrastructure fault, run again
                return self._trace(records, None), outside
            # a server that died without the worker noticing (its last reply was already in) died during this scenario
            abort = Abort(max(len(records) - 1, 0), "crash", "an RPC server died during this scenario:\n" + "\n".join(d.report() for d in deaths),
                          tuple(d.brief() for d in deaths))
        # ggml aborted, the worker crashed or hung: this worker is done, the next run starts another
        self._worker = None
        code = worker.proc.poll()
        worker.close()
        if abort.kind == "crash" and code is not None and -code in KILLED_FROM_OUTSIDE:
            return self._trace(records, None), f"the ggml worker was killed by {signal.Signals(-code).name}"
        if outside:
            return self._trace(records, None), outside
        if deaths and not abort.servers:  # an RPC server crash shows in the worker as an abort, with the server exiting already
            abort = Abort(abort.step, abort.kind, "\n".join([abort.message, *(d.report() for d in deaths)]), tuple(d.brief() for d in deaths))
        elif not deaths and n_rpc:
            abort = replace(abort, refused=self.servers.refusals(n_rpc))
        if abort.kind == "timeout":
            self.servers.close()  # a server may be the one that hangs: start afresh
        return self._trace(records, abort), None

    def _send(self, worker: Worker, scenario: Scenario, endpoints: list[str], values: bool) -> None:
        """Send ``scenario`` to ``worker``, then validate it (a graph is checked once) while the
        worker runs it: a step of the parent's fewer before the worker can start. A scenario
        that is not valid (a drawn one never is: ``GraphBuilder`` checks as it builds) raises
        its ``SpecError``, naming its graph; the RPC servers, which may have been given anything,
        are stopped here, and the worker by the caller, as after any unexpected error."""
        try:
            try:
                worker.send_pickled(self._sent.setdefault(worker, SentSpecs()).request(scenario, endpoints, values))
            finally:
                scenario.validate()  # a shape that cannot be inferred fails the pickling: its error, named
        except SpecError:
            self.servers.close()
            raise

    def _collect(self, worker: Worker, records: list[StepRecord]) -> Abort | None:
        """Read the worker's messages for one scenario into ``records``; the ``Abort`` if it ended early."""
        while True:
            try:
                msg = worker.recv(self.step_timeout)
            except WorkerTimeout:
                return Abort(len(records), "timeout", f"step {len(records)} did not finish within {self.step_timeout:g} s")
            except WorkerGone:
                return Abort(len(records), "crash", worker.crash_report())
            if "record" in msg:
                records.append(msg["record"])
            elif "done" in msg:
                return None
            elif "abort" in msg:
                return Abort(int(msg["abort"]["step"]), "abort", msg["abort"]["message"])
            elif "unsupported" in msg:
                raise Unsupported(msg["unsupported"])
            elif "unreachable" in msg:
                raise _Unreachable(msg["unreachable"])
            elif "error" in msg:
                raise TargetError(f"the ggml worker failed at step {msg['error']['step']}:\n{msg['error']['message']}")
            else:
                raise RuntimeError(f"unexpected message from the ggml worker: {msg}")

    def _trace(self, records: list[StepRecord], abort: Abort | None) -> Trace:
        return Trace(tuple(records), abort, dict(self.engine))

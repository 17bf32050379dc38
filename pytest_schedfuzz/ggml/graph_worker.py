"""The process that runs scenarios on the real ggml: ``python -m pytest_schedfuzz.ggml.graph_worker``.

Protocol: messages pickled after their length (``process.channel.Channel``, ``process.worker.Worker.recv``; JSON
cost several ms each way). The worker reads requests on stdin and writes replies on the file
descriptor that was its stdout; its fd 1 is then pointed at stderr, so whatever ggml or Python
print cannot corrupt the protocol.

* startup: ``{"hello": {engine info}}``, or ``{"fatal": message}`` and exit;
* request (``Worker.send_pickled``, made by ``kept.SentSpecs``) ``{"layout", "graphs": ((name,
  token), ...), "steps", "specs": {token: GraphSpec}, "forget": [token, ...], "endpoints":
  ["127.0.0.1:P", ...], "values": bool}``: the scenario, its graphs as tokens of specs sent now
  or kept from an earlier request (``kept.KeptSpecs``); ``values``: whether a property compares
  the values of its compute steps. The scenario comes validated, with its graphs' geometry
  inferred, by the parent, which is this worker's only writer; the values oracle's seed
  (``cpu_values.scenario_seed``) is made here, where a step computes, while the parent's reference
  predicts. It is answered with one
  ``{"record": StepRecord}`` per step and then ``{"done": true}``; or ``{"unsupported": reason}``;
  or ``{"unreachable": endpoint}`` when an RPC server does not answer (the parent restarts it
  and sends the scenario again); or ``{"error": {"step": i, "message": traceback}}`` when the
  harness failed (not ggml);
* when ggml aborts (``GGML_ABORT``/``GGML_ASSERT``): ``{"abort": {"step": i, "message": text}}``
  is written from ggml's abort callback, and the process dies right after.

What is observed, and how:

* backends of nodes and leafs: ``ggml_backend_sched_get_tensor_backend``, called from the log
  callback when ``ggml_backend_sched_print_assignments`` starts (``GGML_SCHED_DEBUG=2``): that
  is inside ``ggml_backend_sched_split_graph``, once every node has its backend, and before
  ``ggml_backend_sched_reserve`` resets the scheduler (which empties its hash table);
* splits: the ``## SPLIT`` headers of the same printout (``schedlog.SchedLog``);
* reallocations: ggml's debug log (Debug builds only; checked by a probe at startup).
"""


from __future__ import annotations

import gc
import itertools
import os
import pickle
import sys
import traceback
from collections.abc import Sequence
from typing import Any, BinaryIO

from ..builds.compile import OPTIMIZE
from ..engine import TargetError, Unsupported, gc_paused
from ..model.graph_spec import GraphBuilder
from ..model.layout import BackendLayout
from ..model.scenario import Scenario, SchedParams, Step
from ..model.trace import StepRecord
from ..process.channel import Channel
from ..process.children import die_with_parent
from .bindings import OBSERVE_SPLITS, Ggml, coverage_build, gcov_dump
from .constructors import RpcUnreachable
from .kept import KeptSpecs
from .lib import import_ggml
from .scenario_run import ScenarioRun

THAWED = 500  # requests between full collections (``main``)


def prefork() -> None:
    """What the fork server does once for all the workers it forks (``forkserver.serve``): the
    bindings and ggml's libraries, mapped once for every worker."""
    import_ggml()


def no_realloc_fix(lib: str) -> str:
    """What to do when the startup probe saw no reallocation (a build with ``NDEBUG``), for the
    library that was loaded: the built-in ones are rebuilt with pip, a user's with cmake."""
    head = (f"ggml logged no graph reallocation for a graph that must reallocate: its debug logging is compiled out "
            f"(NDEBUG) in {lib}. ")
    if "/site-packages/ggml/" in lib:
        return head + ("Rebuild ggml-python as a Debug build: pip install --force-reinstall --no-cache-dir --no-binary ggml-python "
                       "ggml-python==0.0.45 --config-settings=cmake.build-type=Debug --config-settings=cmake.define.GGML_RPC=ON "
                       "(--no-cache-dir: pip's wheel cache ignores build settings)")
    if "/site-packages/llama_cpp/" in lib:
        return head + ("Rebuild llama-cpp-python as a Debug build: pip install --force-reinstall --no-cache-dir --no-binary "
                       "llama-cpp-python llama-cpp-python==0.3.36 --config-settings=cmake.build-type=Debug "
                       "--config-settings=cmake.define.GGML_RPC=ON --config-settings=cmake.define.LLAVA_BUILD=OFF "
                       f"'--config-settings=cmake.define.CMAKE_C_FLAGS={OPTIMIZE}' '--config-settings=cmake.define.CMAKE_CXX_FLAGS={OPTIMIZE}'")
    return head + "Configure your build with -DCMAKE_BUILD_TYPE=Debug -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON and build it again"



def probe_scenario() -> Scenario:
    """CPU only: reserve a one-op graph, then alloc a two-op one. The single compute buffer
    must reallocate by itself (``ggml_gallocr_alloc_graph``: "different number of nodes")."""
    small, big = GraphBuilder(), GraphBuilder()
    for b in (small, big):
        b.input("x", (8, 2))
        b.op("scale", "x", name="y", scale=2.0)
    big.op("add", "y", "y", name="z")
    return Scenario(
        BackendLayout.of("cpu"),
        (("small", small.build("y")), ("big", big.build("z"))),
        (Step("sched_new", params=SchedParams(64, False, True)), Step("reserve", "small"), Step("alloc", "big")),
    )


def replan_probe(eng: Ggml) -> list[tuple[bool, bool]]:
    """A scheduler re-plan made to be seen: two CPU backends (two compute buffers, which ggml-alloc
    cannot re-plan by itself), a reservation for a one-op graph, then an allocation of a two-op
    one, which must re-plan. Returns the decisions ggml's realloc callback reported for that
    allocation (none where the build has no callback); a Release build's proof that its callback,
    or the llama.cpp worker's interposed allocator calls (``sched_hook.c``), tell the re-plans."""
    g = eng.g
    backends = [g.ggml_backend_cpu_init() for _ in range(2)]
    sched = g.ggml_backend_sched_new((g.ggml_backend_t_ctypes * 2)(*backends), None, 2, 64, False, True)
    if eng.set_realloc_callback is not None:
        eng.set_realloc_callback(sched, eng._realloc_cb, None)
    ctx = g.ggml_init(g.ggml_init_params(mem_size=16 * g.ggml_tensor_overhead() + 2 * g.ggml_graph_overhead(), mem_buffer=None, no_alloc=True))
    try:
        x = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 8, 2)
        y = g.ggml_scale(ctx, x, 2.0)
        small, big = g.ggml_new_graph(ctx), g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(small, y)
        g.ggml_build_forward_expand(big, g.ggml_add(ctx, y, y))
        g.ggml_backend_sched_reserve(sched, small)
        eng.said = []
        g.ggml_backend_sched_alloc_graph(sched, big)
        return list(eng.said)
    finally:
        g.ggml_backend_sched_free(sched)
        for b in backends:
            g.ggml_backend_free(b)
        g.ggml_free(ctx)
        eng.said = []


def run_scenario(eng: Ggml, scenario: Scenario, endpoints: Sequence[str], chan: Channel | None, compare_values: bool = True) -> list[StepRecord]:
    """Run every step, sending each record on ``chan`` as soon as it exists."""
    records: list[StepRecord] = []
    eng.step = 0  # backends and weights are set up as part of step 0
    run = ScenarioRun(eng, scenario, endpoints, compare_values)
    try:
        for i, st in enumerate(scenario.steps):
            eng.step = i
            records.append(run.step(i, st))
            if chan is not None:
                chan.send({"record": records[-1]})  # pickled as it is: no dict to make here and parse there
    finally:
        run.close()
    return records


def read_request(stream: BinaryIO) -> dict[str, Any] | None:
    """The next request (``Worker.send_pickled``), or None once the parent has closed the pipe."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    req: dict[str, Any] = pickle.loads(stream.read(int.from_bytes(head, "little")))
    return req


def main() -> None:
    die_with_parent()
    if OBSERVE_SPLITS:
        os.environ["GGML_SCHED_DEBUG"] = "2"  # read by ggml_backend_sched_new
    chan = Channel(os.dup(1))
    os.dup2(2, 1)  # ggml's printf and Python's print now go to stderr
    sys.stdout = sys.stderr
    eng = Ggml(chan)
    try:
        eng.bindings = eng.check_bindings()
    except TargetError as e:
        chan.send({"fatal": str(e)})
        raise SystemExit(2)
    try:
        probe = run_scenario(eng, probe_scenario(), [], None)
    except Exception:
        chan.send({"fatal": "the startup probe failed:\n" + traceback.format_exc()})
        raise SystemExit(2)
    # a benchmark may time a Release build, which cannot show reallocs: only it skips the check
    if OBSERVE_SPLITS and not any(r.events for r in probe):
        # a Release build (NDEBUG) logs no re-plan: observed through ggml's realloc callback, where it has one that works
        # (ggml's own figures' worker, GGML_SCHED_DEBUG_REALLOC, aborts at any re-plan: the main worker proves it)
        oracle = bool(os.environ.get("GGML_SCHED_DEBUG_REALLOC"))
        said = [(False, True)] if oracle else replan_probe(eng) if eng.set_realloc_callback is not None else []
        if not said or eng.set_realloc_callback is None:
            chan.send({"fatal": no_realloc_fix(eng.info()["lib"]) + ("" if eng.set_realloc_callback is None else
                       " (its realloc callback reported no re-plan either, for a graph that must re-plan)")})
            raise SystemExit(2)
        eng.logs_reallocs = False
    chan.send({"hello": eng.info()})
    coverage = coverage_build()
    kept = KeptSpecs()
    for served in itertools.count(1):
        with gc_paused():  # the request's unpickling too: its scenario is thousands of objects
            req = read_request(sys.stdin.buffer)
            if req is None:
                break
            reply = serve(eng, chan, req, kept)
            # freed now, by its reference counts: alive when the collector restarts, the
            # scenario's thousands of objects would be its next collection's work
            del req
            # what the request left alive (the specs kept, their programs and names: thousands
            # of containers) joins the collector's permanent generation unscanned; it was each
            # request's collection, a tenth of the worker's time. Every ``THAWED`` requests all
            # is scanned once, so that cycles that died meanwhile are freed
            gc.freeze()
        if served % THAWED == 0:
            gc.unfreeze()
            gc.collect()
        if coverage:
            gcov_dump(reset=True)  # before the reply: a later crash of this worker must not take this scenario's counts
        chan.send(reply)


def serve(eng: Ggml, chan: Channel, req: dict[str, Any], kept: KeptSpecs) -> dict[str, object]:
    """Run one request's scenario; the reply that ends it."""
    eng.step = -1
    reply: dict[str, object]
    try:
        scenario = kept.scenario(req)  # first: the parent counts on the specs it sent being kept
        run_scenario(eng, scenario, req["endpoints"], chan, req["values"])
        reply = {"done": True}
    except Unsupported as e:
        reply = {"unsupported": str(e)}
    except RpcUnreachable as e:
        reply = {"unreachable": str(e)}
    except Exception:
        reply = {"error": {"step": eng.step, "message": traceback.format_exc()}}
    return reply


if __name__ == "__main__":
    main()


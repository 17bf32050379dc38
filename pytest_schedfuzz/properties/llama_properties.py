"""Properties of the real llama.cpp: pure functions from (workload, trace) to violations.

* ``llama-no-same-size-realloc``: after the context's own worst-case reservation
  (``llama_context::sched_reserve``), no call makes the scheduler re-plan at the same graph size
  with the same backend ids (ggml 0.25.3's ``GGML_SCHED_DEBUG_REALLOC`` condition). Each
  violation is explained in llama.cpp's terms: which call re-planned, which node the allocator
  found invalid, which graph the plan in force had been made for, and which earlier call
  replaced the worst-case reservation's plan (a topology switch) if one did.
* ``llama-reuse-sound``: when llama.cpp keeps its scheduler across a re-reservation, the new
  parameters satisfy ``can_reuse`` (llama.cpp 0.3.36 never does: it builds a new one each time).
* ``llama-reuse-complete``: no scheduler is rebuilt where ``can_reuse`` held (the compute buffers
  a rebuild throws away: seed ``004``), on a build that has ``can_reuse``; elsewhere counted.
* ``llama-no-abort``: no ggml abort, crash or hang, and no ``llama_decode`` failure below -1
  (-2/-3: the graph could not be allocated or computed).
* ``llama-counters-agree``: where the build has the seeds' system, ggml's realloc callback and
  the harness's derived graph size agree, and llama.cpp's same/changed counters equal the
  harness's count after every reallocation and, where its perf data has them (upstream), at the end.
* ``llama-same-logits``: a workload on GPU-like devices decodes the logits the same workload
  decodes on the CPU alone (``cpu_only``), within ``LOGITS_TOLERANCE``: the devices compute with
  the CPU's kernels, so a difference is a wrong assignment, copy or synchronisation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from reference.params import can_reuse

from ..model.llama_calls import CHANGES
from ..model.llama_trace import LlamaTrace, SchedCall
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import SchedParams
from .aborts import NO_ABORT, at_site, with_c_stack
from .base import CPU_ONLY, Export, PropertyEntry, Violation
from .llama_logits import LOGITS_TOLERANCE, decode_pairs, logit_pairs, logits_difference
from .llama_replan import (
    BY_BATCH,
    META_DEVICES,
    META_TENSORS,
    batch_class,
    call_kind,
    call_name,
    graph_kind,
    invalid_reason,
    outgrown,
    replan_reason,
    replan_trigger,
    topology_cause,
    what_grew,
)
from .realloc import NO_SAME_SIZE_REALLOC
from .sites import RPC_FAILED, killed_by_assert, server_death, server_refusal, site_key


def llama_no_same_size_realloc(w: LlamaWorkload, trace: LlamaTrace) -> list[Violation]:
    out: list[Violation] = []
    reserved: dict[int, tuple[int, SchedCall]] = {}  # sched -> its worst-case reservation (the last reserve)
    plan: dict[int, tuple[int, SchedCall]] = {}  # sched -> the graph its plan in force was made for
    replaced: dict[int, tuple[int, SchedCall]] = {}  # sched -> the first realloc that replaced the reservation's plan
    for call, s in trace.sched_calls():
        if s.kind == "reserve" and s.ok:
            reserved[s.sched] = plan[s.sched] = (call, s)
            replaced.pop(s.sched, None)
            continue
        if s.kind == "reserve_size":  # ggml_gallocr_reserve_n_size makes a plan too (for its sizes only)
            plan[s.sched] = (call, s)
            if s.sched in reserved:
                replaced.setdefault(s.sched, (call, s))
            continue
        if s.kind != "alloc" or not s.realloc:
            continue
        if s.same_size and s.sched in reserved:
            p_call, p = plan.get(s.sched, reserved[s.sched])
            r_call, r = reserved[s.sched]
            invalid = invalid_reason(s)
            whose = " (the draft context's scheduler: its catch-up or draft in llama.speculative)" if s.context else ""
            head = (f"same-size graph reallocation in {call_name(w, call)}{whose}: nodes = {s.n_nodes}, splits = {s.n_splits}, "
                    f"graph_size = {s.graph_size} (prev {s.prev_graph_size}), backend_ids_changed = 0; "
                    f"ggml_gallocr_needs_realloc: {s.realloc_reason or '?'}")
            if s.sched in replaced:
                x_call, x = replaced[s.sched]
                how = "lost"
                switched = (r.n_nodes, r.n_leafs) != (x.n_nodes, x.n_leafs)
                classes = ", ".join(f"{what} {a} -> {b}" for what, a, b in zip(("outputs", "tokens"), batch_class(r), batch_class(x)))
                change = (f"a topology switch: nodes {r.n_nodes} -> {x.n_nodes}, leafs {r.n_leafs} -> {x.n_leafs}; {classes}"
                          if switched else f"same topology, {what_grew(r, x)}")
                why = (f"the worst-case reservation ({r.shape()}) had been replaced in {call_name(w, x_call)}, which re-planned because "
                       f"{x.realloc_reason or ('it made a plan for sizes only' if x.kind == 'reserve_size' else '?')}"
                       f"{' (' + x.moved + ')' if x.moved else ''} ({change}); "
                       f"the plan in force was made in {call_name(w, p_call)} for [{p.shape()}], and this graph needs more: {what_grew(p, s)}")
                # the root cause is the re-plan that lost the reservation: which call made it
                # (after which switch), for which kind of graph, why, and whether the topology switched;
                # which tensor then shows invalid depends on the model (it is in the message)
                replan = replan_reason(x, r)
                # op offload and the MoE cache's lookup depend on the batch only: a switch made before the call is beside the point
                trigger, switch = replan_trigger(w, x_call if replan.endswith(BY_BATCH) else r_call, x_call)
                facts = {"explained": how, "lost_by": f"{trigger}: {replan}"}
                # which op offload wants depends on the batch alone: whether the graphs also differ
                # in topology or inputs (the sampler's, the outputs') does not make another cause
                if not replan.endswith(BY_BATCH):
                    facts["topology"] = "switch" if switched else "same"
                    graph = graph_kind(r, x)
                    if graph:
                        facts["graph"] = graph
                    elif switched and switch is None:  # no switch call, no other kind of graph: the batch did it
                        facts["topology"] = f"switch by {topology_cause(r, x)}"
            else:
                x_call = None
                how = "not-dominating"
                switches = [i for i in range(max(r_call, 0), call) if i < len(w.calls) and w.calls[i].kind.startswith("set_")]
                changed = (f"; the graph was changed without a new reservation by {', '.join(call_name(w, i) for i in switches)}"
                           if switches else "")
                why = (f"the worst-case reservation of {call_name(w, r_call)} ({r.shape()}) does not cover this graph "
                       f"({what_grew(r, s)}; ggml-alloc: {invalid}){changed}")
                # what the reservation did not cover, as every build tells it (the invalid tensor is in the message)
                # and the kind of call that outgrew it (the switches since are in the message: which one
                # changed the graph, a rerun without each would have to tell, and the lost reservations it
                # makes later name theirs)
                facts, switch = {"explained": how, "outgrown": outgrown(r, s), "lost_by": "-", "call": call_kind(w, call)}, None
            # an MTP context's graphs (the NextN layer's, built by llama.cpp's MTP graph code) are another cause than the
            # target's; draft-simple's context runs the same kind of model as the target: the same graphs, the same causes
            if s.context and w.draft == "mtp":
                facts = {"context": "draft"} | facts
            out.append(Violation("llama-no-same-size-realloc", max(call, 0), f"{head} — {why}", facts, switch, x_call))
        plan[s.sched] = (call, s)
        if s.sched in reserved:
            replaced.setdefault(s.sched, (call, s))
    return out


@dataclass(frozen=True)
class Rebuild:
    """One worst-case re-reservation (``llama_context::sched_reserve``) on a context that had a
    scheduler, as the scheduler hook saw it: the scheduler in force before (``current``: its
    creation), the parameters llama.cpp asked for, and whether it kept that scheduler (the next
    reserve used the same scheduler object, no ``ggml_backend_sched_new`` in between) or built a
    new one (``built``: its creation). ``logged``: whether llama.cpp logged that it reused (the
    seeds' build logs what its ``sched_new`` asks for and each reuse; None where the build logs
    neither)."""

    call: int
    current: SchedCall
    asked: SchedParams
    kept: bool
    built: SchedCall | None
    logged: bool | None

    @property
    def current_params(self) -> SchedParams:
        c = self.current
        return SchedParams(max_nodes=c.max_nodes, parallel=c.parallel, op_offload=c.op_offload)

    @property
    def wasted(self) -> bool:
        """A new scheduler although ``can_reuse(asked, current)`` held: every compute buffer the
        current one had reserved was freed and reserved again."""
        return not self.kept and can_reuse(self.asked, self.current_params)


def rebuilds(trace: LlamaTrace) -> list[Rebuild]:
    """Every worst-case re-reservation on a context that already had a scheduler, judged from the
    scheduler objects the hook sees (``ggml_backend_sched_new``/``_free``, and which scheduler each
    reserve used), not from a log line: a reuse that llama.cpp does not log is still a reuse.

    What llama.cpp asked for: on the seeds' llama.cpp every field (its ``sched_new`` logs them);
    elsewhere the ``max_nodes`` ``sched_reserve`` logged, and ``parallel``/``op_offload`` of the
    scheduler it then built (kept: of the one it kept; a build that does not say what it asks for
    is judged on ``max_nodes`` only). A draft context's schedulers are its own (``SchedCall.context``)."""
    contexts = sorted({s.context for _, s in trace.sched_calls()})
    return sorted((r for context in contexts for r in _rebuilds(trace, context)), key=lambda r: r.call)


def _rebuilds(trace: LlamaTrace, context: int) -> list[Rebuild]:
    """``rebuilds`` of one context's schedulers."""
    out: list[Rebuild] = []
    current: SchedCall | None = None  # the scheduler in force (its creation)
    pending: tuple[int, SchedCall, SchedCall] | None = None  # sched_reserve logged on a context with a scheduler, its reserve not seen yet
    asked: SchedCall | None = None
    built: SchedCall | None = None
    logged: bool | None = None
    for call, s in trace.sched_calls():
        if s.context != context:
            continue
        if s.kind == "sched_params":  # the seeds' sched_new asks (also for the fallback within one sched_reserve)
            pending = (pending[0] if pending is not None else call, s, current) if current is not None else None
            asked, built, logged = s, None, False
        elif s.kind == "reuse":
            logged = True
        elif s.kind == "sched_reserve":
            pending = (call, s, current) if current is not None else None
            asked, built, logged = None, None, None
        elif s.kind == "new":
            current = s
            built = s if pending is not None else None
        elif s.kind == "free" and current is not None and s.sched == current.sched and pending is None:
            current = None
        elif s.kind == "reserve" and pending is not None:
            at, said, before = pending
            by = built if built is not None else before
            params = (SchedParams(max_nodes=asked.max_nodes, parallel=asked.parallel, op_offload=asked.op_offload) if asked is not None
                      else SchedParams(max_nodes=said.max_nodes, parallel=by.parallel, op_offload=by.op_offload))
            out.append(Rebuild(at, before, params, built is None and s.sched == before.sched, built, logged))
            pending = None
    return out


def scheduler_reuses(trace: LlamaTrace) -> list[tuple[int, SchedCall, SchedParams]]:
    """(call, the kept scheduler's creation, the parameters llama.cpp asked for) for every
    re-reservation that kept the scheduler it had instead of building a new one (``rebuilds``):
    the reuse that ``sched_params::can_reuse`` must allow."""
    return [(r.call, r.current, r.asked) for r in rebuilds(trace) if r.kept]


def llama_reuse_sound(w: LlamaWorkload, trace: LlamaTrace) -> list[Violation]:
    """A kept scheduler satisfies ``can_reuse(asked, current)``; where llama.cpp logs its reuses
    (the seeds' build), the log and the scheduler objects agree (the log is the cross-check)."""
    out = []
    for r in rebuilds(trace):
        new, cur = r.asked, r.current_params
        if r.logged is not None and r.logged != r.kept:
            used = f"the scheduler it had (#{r.current.sched})" if r.kept else "a new scheduler"
            out.append(Violation("llama-reuse-sound", max(r.call, 0),
                                 f"{call_name(w, r.call)}: llama.cpp {'logged' if r.logged else 'did not log'} that it reused its scheduler, "
                                 f"but the next reserve used {used}", {"why": "log"}))
        if r.kept and not can_reuse(new, cur):
            why = [f for f in ("max_nodes", "parallel", "op_offload") if getattr(new, f) != getattr(cur, f) and (f != "max_nodes" or new.max_nodes > cur.max_nodes)]
            out.append(Violation("llama-reuse-sound", max(r.call, 0),
                                 f"{call_name(w, r.call)} kept scheduler #{r.current.sched} (max_nodes {cur.max_nodes}, parallel {cur.parallel}, "
                                 f"op_offload {cur.op_offload}) for max_nodes {new.max_nodes}, parallel {new.parallel}, op_offload {new.op_offload}: "
                                 f"can_reuse is false ({', '.join(why)})", {"why": ",".join(why) or "params"}))
    return out


def llama_reuse_complete(w: LlamaWorkload, trace: LlamaTrace) -> list[Violation]:
    """No scheduler is rebuilt where ``can_reuse(asked, current)`` held (``Rebuild.wasted``): seed
    ``004``'s reason to exist. Judged on a build that has ``can_reuse`` (its ``sched_new`` logs
    the parameters it is asked for). A build without any reuse (llama.cpp before seed ``004``:
    its ``sched_reserve`` always builds a new scheduler) is not judged here, and its wasted
    rebuilds are counted in the summary instead: the feature is absent, not wrong."""
    for r in rebuilds(trace):
        if not r.wasted or r.logged is None:
            continue
        new, cur = r.asked, r.current_params
        return [Violation("llama-reuse-complete", max(r.call, 0),
                          f"{call_name(w, r.call)} built a new scheduler (#{r.built.sched if r.built else '?'}) although can_reuse held: asked for "
                          f"max_nodes {new.max_nodes}, parallel {new.parallel}, op_offload {new.op_offload}; the current scheduler "
                          f"#{r.current.sched} had max_nodes {cur.max_nodes}, parallel {cur.parallel}, op_offload {cur.op_offload}; its "
                          f"compute buffers were freed and reserved again", {"rebuilt": "can_reuse held"})]
    return []


def llama_counters_agree(w: LlamaWorkload, trace: LlamaTrace) -> list[Violation]:
    """Two oracles of each re-reservation, where the build has them (the seeds' system):

    * ggml's realloc callback says whether the graph size changed; the harness derives the same
      from ggml's graph-size formula (``reference.rules``): they must agree;
    * llama.cpp counts the reallocations it did not expect (``n_same``/``n_diff``, traced after
      each one): its counts must equal the harness's count of the same events, every time, and
      at the end where its perf data has them (``n_reallocs_same``/``_diff``: upstream's API).

    Each context counts its own schedulers' (a draft context's perf data is ``draft.``'s)."""
    out: list[Violation] = []
    counting = {s.sched for _, s in trace.sched_calls() if s.kind == "new" and s.owner_counts}
    counted: dict[int, tuple[int, int]] = {}  # context -> (same, diff)
    for call, s in trace.sched_calls():
        if s.kind != "alloc" or not s.realloc:
            continue
        if s.observed and s.derived_same_size != s.same_size:
            out.append(Violation("llama-counters-agree", max(call, 0),
                                 f"{call_name(w, call)}: ggml's realloc callback says graph_size_changed = {int(bool(s.ggml_size_changed))}, "
                                 f"backend_ids_changed = {int(bool(s.ggml_ids_changed))}; the harness derives graph_size {s.graph_size} "
                                 f"(prev {s.prev_graph_size}) from ggml's formula for this graph", {"what": "graph-size"}))
            return out
        if s.sched not in counting or (s.ggml_ids_changed if s.observed else s.backend_ids_changed):
            continue  # llama.cpp ignores a reallocation after a change of the backend assignments
        same, diff = counted.get(s.context, (0, 0))
        same, diff = counted[s.context] = same + s.same_size, diff + (not s.same_size)
        if (s.llama_n_same, s.llama_n_diff) != (same, diff):
            said = "traced nothing" if s.llama_n_same is None else f"counts n_same = {s.llama_n_same}, n_diff = {s.llama_n_diff}"
            out.append(Violation("llama-counters-agree", max(call, 0),
                                 f"{call_name(w, call)}: after this reallocation ({'same' if s.same_size else 'changed'} size, ggml says) "
                                 f"llama.cpp {said}; the harness counts n_same = {same}, n_diff = {diff}", {"what": "counters"}))
            return out
    for context, prefix in enumerate(("", "draft.")):
        perf = (trace.perf.get(prefix + "n_reallocs_same"), trace.perf.get(prefix + "n_reallocs_diff"))
        same, diff = counted.get(context, (0, 0))
        if perf[0] is not None and trace.abort is None and perf != (same, diff):
            last = max((c.index for c in trace.calls), default=0)
            whose = "the draft context's" if context else "llama.cpp's"
            out.append(Violation("llama-counters-agree", max(last, 0),
                                 f"after the workload {whose} perf data (llama_perf_context) counts n_reallocs_same = {perf[0]}, "
                                 f"n_reallocs_diff = {perf[1]}; the harness counts {same} and {diff} of ggml's decisions", {"what": "perf"}))
    return out


# calls that change what the model's devices hold or what the graph reads (not decodes)


def _last_change(w: LlamaWorkload, call: int) -> str:
    """The kind of the last call before ``call`` that changed the devices' contents ("-": none)."""
    return next((w.calls[i].kind for i in range(min(call, len(w.calls)) - 1, -1, -1) if w.calls[i].kind in CHANGES), "-")


def out_of_memory(w: LlamaWorkload, trace: LlamaTrace) -> str:
    """What refused the context or a LoRA adapter, when a GPU-like device the workload left little
    free memory (``Devices.gpu_free``) ran out of it: llama.cpp rightly fails then (a context
    after retrying without pipeline parallelism), so the workload tests nothing. "" otherwise.
    (The model stays loaded from workload to workload, so how full a device is depends on what
    ran before: such a refusal need not come back on a replay.)"""
    if not w.devices.gpu_free:
        return ""
    for c in trace.calls:
        if c.kind == "init" and c.rc != 0:
            return next((x for x in c.error if re.search(r"GPU\d+: out of memory", x)), "")
        if c.kind == "lora_load" and isinstance(c.rc, str) and re.search(r"failed to allocate GPU\d+ buffer", c.rc):
            return c.rc
    return ""


def llama_no_abort(w: LlamaWorkload, trace: LlamaTrace) -> list[Violation]:
    a = trace.abort
    if a is not None:
        lines = a.message.strip().splitlines() or [a.kind]
        # a crash's first line is the signal; the C assert that raised it (if any) is what separates causes
        at = next((k for k, x in enumerate(lines) if re.search(r"Assertion `|GGML_ASSERT|GGML_ABORT", x)), 0)
        cause = re.sub(r"^\S*: (?=\S*\.(?:c|cpp|h):\d+)", "", lines[at])  # the "python: " program prefix
        cause = re.sub(r"\S*/(\w[\w.-]*\.(?:c|cpp|h)):\d+", r"\1", cause)
        # the first line too (an RPC client's abort, before the server's own assert): its source path is the build folder's
        head = re.sub(r"\S*/(\w[\w.-]*\.(?:c|cpp|h)):\d+", r"\1", lines[0]) if at else ""
        if not at:  # no assert: the top of the C stack tells one crash from another
            cause = with_c_stack(cause, a.message)
        died = server_death(a.servers, a.message) if RPC_FAILED in a.message else None
        signed = killed_by_assert(a.kind, head, died, lines[at]) if at else None
        signed_as, signed_head = signed or (a.kind, head)
        # split mode tensor's meta device names its per-device tensors after its devices
        # (``Meta(RPC0,RPC1,GPU0)#kqv_out-0#0``): the devices drawn are not the cause
        kind = re.sub(r"\d+", "N", META_TENSORS.sub(r"\1=(tensor)", META_DEVICES.sub("Meta(...)", (signed_head + ": " if signed_head else "") + cause)))[:160]
        text = f"{head}: {cause}" if head else cause
        # what separates root causes beside the message: the check site (one assert text has many),
        # the call kind and where in it ggml stopped (the context's reservation, a decode's alloc...)
        facts: dict[str, object] = {"kind": signed_as, "message": kind, "call": call_kind(w, a.call)}
        if a.phase and signed_as == "abort":  # a signal has no phase: ggml's abort callback tells it
            facts["phase"] = a.phase
        # an RPC server's assert has its site in its own line (the client's is ggml-rpc.cpp's check)
        site = site_key(lines[at] if signed else a.message)
        if site:
            facts["site"] = site
        if RPC_FAILED in a.message and not (signed and died):
            # the RPC client reports every server failure alike: a server that died says how; one
            # that refused a command (and closed the connection) is signed by the command
            # (``RpcServers.refusals``); where none is known, the call that changed what the
            # model's devices hold before the failing call separates causes
            refusal = None if died else server_refusal(a.refused)
            facts["server"] = died or refusal or f"refused after {_last_change(w, a.call)}"
            if refusal is not None:  # the command refused names the cause; where the client noticed it (phase) depends on the build
                facts.pop("phase", None)
        said = "".join(f"\n  RPC server {line}" for line in a.refused if RPC_FAILED in a.message)
        return [Violation("llama-no-abort", max(a.call, 0), f"ggml {a.kind} during {call_name(w, a.call)}: {text}{at_site(lines[at] if signed else a.message)}{said}", facts)]
    for c in trace.calls:
        if c.kind == "init" and c.rc != 0 and not out_of_memory(w, trace):
            said = " / ".join(c.error) or "nothing"
            # the workload's parameters are valid (LlamaWorkload.validate): the context must come up
            message = re.sub(r"\d+(\.\d+)?", "N", said.split(" / ")[-1])[:160]
            return [Violation("llama-no-abort", 0, f"llama_init_from_model failed for valid parameters ({w.describe()}); llama.cpp said: {said}",
                              {"kind": "init", "message": message})]
        if c.kind == "decode" and isinstance(c.rc, int) and c.rc < -1:
            # what separates causes: whether ggml re-planned during the call and whether the devices
            # were drawn nearly full, so that a -2 that follows a re-plan on full devices (the re-plan
            # itself is llama-no-same-size-realloc's to sign) never hides a -2 of another cause
            replanned = next((s.realloc_reason for s in c.sched if s.kind == "alloc" and s.realloc), "")
            facts = {"kind": "decode", "rc": c.rc, "replanned": "yes" if replanned else "no", "gpu_free": "drawn" if w.devices.gpu_free else "unlimited"}
            during = f" during a re-plan ({replanned})" if replanned else ""
            free = f"; the GPU-like devices were left {', '.join(f'{n:,}' for n in w.devices.gpu_free)} bytes free" if w.devices.gpu_free else ""
            return [Violation("llama-no-abort", c.index, f"{call_name(w, c.index)} returned {c.rc} (the graph could not be allocated or computed){during}{free}", facts)]
    return []



def llama_same_logits(w: LlamaWorkload, trace: LlamaTrace, cpu: LlamaTrace) -> list[Violation]:
    """Each decode's recorded logits (first and last output) against the CPU-only run's. Runs
    that aborted are not compared here: llama-no-abort reports the devices' run, and
    ``cpu_run_violations`` the CPU-only run. A NaN or infinity the CPU does not have is a
    finding of its own kind (``value=nan``, ``value=inf``)."""
    for call, k, got, want in logit_pairs(trace, cpu):
        found = logits_difference(got, want)
        if found is None:
            continue
        token, kind = found
        # who computes: the devices' kinds, or split mode tensor's meta device whatever its members
        devices = "Meta" if w.devices.split_mode == "tensor" else ", ".join(["RPC"] * bool(w.devices.n_rpc) + ["GPU-like"] * bool(w.devices.gpus))
        facts: dict[str, object] = {"on": devices}
        if not w.ctx.offload_kqv:  # a KV cache left in host memory computes attention elsewhere
            facts["kv"] = "host"
        what = f"{call_name(w, call)}: the logits of its {'first' if k == 0 else 'last'} output differ from the CPU-only run's: "
        if kind == "count":
            what += f"{len(got)} logits, on the CPU alone {len(want)}"
            facts["value"] = "count"
        else:
            diff = abs(got[token] - want[token])
            what += f"token {token}: {got[token]:.5f}, on the CPU alone {want[token]:.5f}"
            if kind == "finite":
                what += f" (|diff| {diff:.5f} > {LOGITS_TOLERANCE})"
            else:
                odd = math.isnan if kind == "nan" else math.isinf
                what += f" (a {'NaN' if kind == 'nan' else 'infinity'} {'on the devices' if odd(got[token]) else 'on the CPU alone'} only)"
                facts["value"] = kind
        return [Violation("llama-same-logits", call, f"{what}; {w.devices.describe()}", facts)]
    return []


def cpu_run_violations(w: LlamaWorkload, trace: LlamaTrace, cpu_w: LlamaWorkload, cpu: LlamaTrace) -> list[Violation]:
    """The CPU-only run (llama-same-logits' reference) judged like any run: an abort, a crash or
    a decode that fails below -1 there is a llama-no-abort finding of its own (``run=cpu-only``);
    a decode that succeeded on the devices and failed on the CPU alone (or the other way round)
    is a llama-same-logits finding (``value=rc``): the same calls must decode alike."""
    found = [replace(v, message=f"the CPU-only run of this workload (llama-same-logits' reference): {v.message}", facts={**v.facts, "run": "cpu-only"})
             for v in llama_no_abort(cpu_w, cpu)]
    if found or trace.abort is not None:
        return found
    for c, ref in decode_pairs(trace, cpu):
        if (c.rc == 0) != (ref.rc == 0):
            return [Violation("llama-same-logits", c.index, f"{call_name(w, c.index)} returned {c.rc} on the devices and {ref.rc} on the CPU alone; "
                                                            f"{w.devices.describe()}", {"on": "devices", "value": "rc"})]
    return []


def unmade_calls(w: LlamaWorkload, trace: LlamaTrace) -> list[str]:
    """What the harness meant to do and could not: a call llama.cpp refused although the workload
    is valid, or a context whose scheduler calls were never seen. Not a verdict of pass: the
    fuzzer stops on it as a harness error (its generator or its observation is broken)."""
    if trace.abort is not None:
        return []
    out = []
    for c in trace.calls:
        name = call_name(w, c.index)
        if c.kind == "init":
            if c.rc == 0 and not any(s.kind == "reserve" for s in c.sched):
                out.append("llama_init_from_model reserved nothing the scheduler hook saw: the observation is broken")
        elif c.kind in ("decode", "spec"):  # a full cache (1) is llama.cpp's answer; a rollback refused is a string
            if c.rc in (-1, 2) or isinstance(c.rc, str):  # -1: an invalid batch, 2: aborted; the generator makes neither
                out.append(f"{name} returned {c.rc}")
        elif c.rc != 0:
            out.append(f"{name} could not be made (returned {c.rc!r})")
    return out


# in the registry's order; llama-same-logits needs a second run (on the CPU alone), so the fuzzer
# judges it (``cpu_run_violations``, ``llama_same_logits``)
ENTRIES = (
    PropertyEntry("llama-no-same-size-realloc", "no llama.cpp call re-plans at the same size after the context's reservation",
                  judge=llama_no_same_size_realloc, llama=True, seen_as=NO_SAME_SIZE_REALLOC.id,
                  export=Export("realloc", "ggml's own check: every scheduler of the context is made with `GGML_SCHED_DEBUG_REALLOC=1`, so "
                                           "ggml aborts on a reallocation with unchanged backend ids and graph size (\"unexpected graph reallocation\")")),
    PropertyEntry("llama-reuse-sound", "llama.cpp keeps its scheduler only where can_reuse held", judge=llama_reuse_sound, llama=True),
    PropertyEntry("llama-reuse-complete", "llama.cpp rebuilds no scheduler where can_reuse held", judge=llama_reuse_complete, llama=True),
    PropertyEntry("llama-no-abort", "the context initializes; no abort, crash, hang or decode failure below -1",
                  judge=llama_no_abort, llama=True, seen_as=NO_ABORT.id,
                  export=Export("death", "ggml aborts (its abort callback) or the process dies of a signal in the call")),
    PropertyEntry("llama-counters-agree", "llama.cpp's n_same/n_diff and ggml's realloc callback agree with the harness",
                  judge=llama_counters_agree, llama=True),
    PropertyEntry("llama-same-logits", "the devices decode the logits the CPU alone decodes", needs=frozenset({CPU_ONLY}), llama=True,
                  export=Export("logits", "the logits of the first or last output of call {step} differ from the same calls' on the CPU "
                                          "alone (a second run) by more than {tolerance} (relative)")),
)
# the llama.cpp properties judged on one run of a workload
LLAMA_CHECKS: dict[str, Callable[[LlamaWorkload, LlamaTrace], list[Violation]]] = {e.id: e.judge for e in ENTRIES if e.judge is not None}

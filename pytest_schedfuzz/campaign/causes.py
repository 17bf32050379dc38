"""Reruns that tell a finding's cause: the scenario (or llama.cpp workload) again without
what may cause it."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import replace

from .. import properties as props
from ..model.llama_calls import SWITCHES
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import LlamaWorkload, WorkloadError
from ..model.scenario import Scenario
from ..model.trace import Trace
from ..properties.aborts import NO_ABORT
from ..properties.llama_properties import llama_no_same_size_realloc
from ..properties.values import SAME_VALUES

Run = Callable[[Scenario], Trace]
LlamaRun = Callable[[LlamaWorkload], LlamaTrace]

_AFTER = re.compile(r" after \w+\(\w+\)")
# a topology switch with no switch call before it is signed by what switched it (``switch by
# tokens``): without the switch, the same switch is that
_SWITCH_BY = re.compile(r"^switch by \w+$")
MAX_SWITCH_RERUNS = 3  # per finding: each switch before the re-plan, the last first


def causes_told_apart(scenario: Scenario, prediction: Trace, found: list[props.Violation], run: Run) -> list[props.Violation]:
    """Wrong values, or aborts, in a compute step: run the scenario again without what may
    cause them, and sign what goes away by that cause, so that its varying symptoms make
    one signature and other bugs keep theirs:

    * every device synchronous: a race (``properties.as_race``);
    * no view assigned a backend: a forced view (``properties.as_forced_view``)."""
    def unexplained(v: props.Violation, kinds: tuple[str, ...]) -> bool:
        explained = "race" in v.facts or "forced" in v.facts
        return v.property in kinds and not explained and scenario.steps[min(v.step, len(scenario.steps) - 1)].kind == "compute"

    # the properties the reruns judge again (their judges, below): their findings are re-signed
    rejudged = (SAME_VALUES.id, NO_ABORT.id)
    causes = []
    if any(b.asynchronous for b in scenario.layout.backends):
        causes.append((rejudged, props.synchronous_variant, props.as_race))
    if props.forced_views(scenario):
        causes.append((rejudged, props.unforced_views_variant, props.as_forced_view))
    for kinds, variant_of, resign in causes:
        if not any(unexplained(v, kinds) for v in found):
            continue
        variant = variant_of(scenario)
        trace = run(variant)
        still = {v.property for v in props.no_abort(variant, trace, prediction) + props.same_values(variant, trace, prediction)}
        found = [resign(v, scenario) if unexplained(v, kinds) and v.property not in still else v for v in found]
    return found


def _unswitched(v: props.Violation) -> dict[str, object]:
    """``v``'s facts without what naming a switch call adds to them: its name in ``lost_by``, and
    the ``by …`` a topology switch has only where no switch call came before it."""
    return {k: _SWITCH_BY.sub("switch", _AFTER.sub("", str(x))) if k == "topology" else _AFTER.sub("", str(x)) for k, x in v.facts.items()}


def _same_without(w: LlamaWorkload, v: props.Violation, calls: list[int], run: LlamaRun) -> tuple[LlamaWorkload, props.Violation] | None:
    """``w`` without ``calls`` and the violation there that is ``v`` (the same call re-planning the
    same way, its switches aside, after the same call lost the reservation: where a later call
    loses it instead, another switch of the same kind left in the workload did, and naming the
    switch before that call would name the wrong one), or None: the workload is not valid without
    them, or it differs."""
    fewer = replace(w, calls=tuple(c for i, c in enumerate(w.calls) if i not in calls))
    try:
        fewer.validate()
    except WorkloadError:  # the calls after them need them (a checkpoint, an attached adapter)
        return None
    step = v.step - sum(i < v.step for i in calls)
    lost_at = None if v.lost_at is None else v.lost_at - sum(i < v.lost_at for i in calls)
    same = [u for u in llama_no_same_size_realloc(fewer, run(fewer))
            if u.step == step and u.lost_at == lost_at and _unswitched(u) == _unswitched(v)]
    return (fewer, same[0]) if same else None


def switches_told_apart(workload: LlamaWorkload, found: list[props.Violation], run: LlamaRun,
                        known: Collection[str]) -> tuple[list[props.Violation], int]:
    """A lost reservation is signed by the last switch (``set_warmup``, ``set_embeddings``…)
    llama.cpp was given before the re-plan: a switch can be the cause (warmup routes every
    token to every expert). Where it is not, naming it would split one cause into a signature
    per switch a server happened to make before it. So for a new finding that names one, run
    the workload again without every switch up to it: where the same call then re-plans the same
    way, no switch is named. Else each switch is dropped in turn, the last first, while the same
    call re-plans the same way without it (at most ``MAX_SWITCH_RERUNS``), and the one it stops
    at is named. Returns the findings and the reruns made."""
    out, reruns = [], 0
    for v in found:
        w, now, dropped = workload, v, []
        if now.switch is not None and now.signature() not in known:
            every = [i for i in range(now.switch + 1) if w.calls[i].kind in SWITCHES]
            reruns += 1
            if (none := _same_without(w, now, every, run)) is not None:
                dropped, (w, now) = [w.calls[i].describe() for i in every], none
        while now.switch is not None and now.signature() not in known and len(dropped) < MAX_SWITCH_RERUNS:
            reruns += 1
            if (fewer := _same_without(w, now, [now.switch], run)) is None:
                break
            dropped.append(w.calls[now.switch].describe())
            w, now = fewer
        if dropped:
            v = props.Violation(v.property, v.step, f"{v.message} (signed without {', '.join(dropped)}: the same call re-plans the same way "
                                f"without {'it' if len(dropped) == 1 else 'them'})", now.facts, now.switch, v.lost_at)
        out.append(v)
    return out, reruns

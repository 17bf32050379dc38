"""Reruns that tell a finding's cause: the scenario (or llama.cpp workload) again without
what may cause it."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import replace

from .. import properties as props
from ..model.llama import LlamaWorkload, WorkloadError
from ..model.llama_trace import LlamaTrace
from ..model.scenario import Scenario
from ..model.trace import Trace
from ..properties.llama import llama_no_same_size_realloc

Run = Callable[[Scenario], Trace]
LlamaRun = Callable[[LlamaWorkload], LlamaTrace]

_AFTER = re.compile(r" after \w+\(\w+\)")
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

    causes = []
    if any(b.asynchronous for b in scenario.layout.backends):
        causes.append((("same-values", "no-abort"), props.synchronous_variant, props.as_race))
    if props.forced_views(scenario):
        causes.append((("same-values", "no-abort"), props.unforced_views_variant, props.as_forced_view))
    for kinds, variant_of, resign in causes:
        if not any(unexplained(v, kinds) for v in found):
            continue
        variant = variant_of(scenario)
        trace = run(variant)
        still = {v.property for v in props.no_abort(variant, trace, prediction) + props.same_values(variant, trace, prediction)}
        found = [resign(v, scenario) if unexplained(v, kinds) and v.property not in still else v for v in found]
    return found


def _unswitched(v: props.Violation) -> dict[str, object]:
    return {**v.facts, "lost_by": _AFTER.sub("", str(v.facts.get("lost_by", "")))}


def switches_told_apart(workload: LlamaWorkload, found: list[props.Violation], run: LlamaRun,
                        known: Collection[str]) -> tuple[list[props.Violation], int]:
    """A lost reservation is signed by the last switch (``set_warmup``, ``set_embeddings``…)
    llama.cpp was given before the re-plan: a switch can be the cause (warmup routes every
    token to every expert). Where it is not, naming it would split one cause into a signature
    per switch a server happened to make before it. So for a new finding that names one, run
    the workload again without that call: where the same call then re-plans the same way, the
    switch is beside the point and not named (and the switch before it is tried in turn).
    Returns the findings and the reruns made."""
    out, reruns = [], 0
    for v in found:
        w, now, dropped = workload, v, []
        while now.switch is not None and now.signature() not in known and len(dropped) < MAX_SWITCH_RERUNS:
            fewer = replace(w, calls=w.calls[:now.switch] + w.calls[now.switch + 1:])
            try:
                fewer.validate()
            except WorkloadError:  # the calls after it need it (a checkpoint, an attached adapter)
                break
            reruns += 1
            same = [u for u in llama_no_same_size_realloc(fewer, run(fewer)) if u.step == now.step - 1 and _unswitched(u) == _unswitched(now)]
            if not same:
                break
            dropped.append(w.calls[now.switch].describe())
            w, now = fewer, same[0]
        if dropped:
            v = props.Violation(v.property, v.step, f"{v.message} (signed without {', '.join(dropped)}: the same call re-plans the same way "
                                f"without {'it' if len(dropped) == 1 else 'them'})", now.facts, now.switch)
        out.append(v)
    return out, reruns

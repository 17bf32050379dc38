"""Graph specs a graph worker keeps from one scenario to the next: the parent sends a spec once,
then its token (``SentSpecs``); the worker keeps the spec, with what it made of it (its program,
ggml's names of its nodes), under that token (``KeptSpecs``).

A spec recurs: a fresh run of the same scenario (``reuse-equivalent``), a confirmation, the
reruns that tell causes apart, Hypothesis's mutations of an example (``sim.models.llama_graph``
hands out one object per arguments), a captured graph drawn into many scenarios, most of them
with more nodes forced (a copy that shares its tensors: it is sent as the kept spec's token
with its own forced assignments). Each time the parent pickled it again (its thousands of
tensors), the worker unpickled it and encoded its program again. Both sides forget the least
recently used spec beyond ``KEPT`` specs or ``KEPT_TENSORS`` tensors, the parent saying which
(the worker never decides alone, so the two tables cannot drift); a new worker starts with an
empty table on both sides.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..model.graph_spec import GraphSpec
from ..model.scenario import Scenario

# specs per worker, and their tensors at most (about a kilobyte each in the worker: rows, geometry,
# program, names); a scenario's own specs are never forgotten while it is sent. The captured
# llama.cpp graphs the graph properties draw from are about 60 specs of up to 2,000 tensors
KEPT = 256
KEPT_TENSORS = 250_000


class SentSpecs:
    """The parent's side, for one worker: the specs it holds, by object, with their tokens."""

    def __init__(self) -> None:
        # id(spec) -> (token, the spec): weakly, for the parent's specs hold what judges derived
        # from them (the reference's graph), which nothing else may need; a dead spec's id that
        # comes again is another spec's
        self._tokens: OrderedDict[int, tuple[int, weakref.ref[GraphSpec]]] = OrderedDict()
        self._sizes: dict[int, int] = {}  # tensors, by token
        self._next = 0

    def request(self, scenario: Scenario, endpoints: Sequence[str], values: bool) -> dict[str, Any]:
        """The worker's request for ``scenario``: its graphs as tokens, the specs the worker lacks
        in full, or as one it keeps with other forced assignments or label (``alike``), and the
        tokens it may forget."""
        graphs, new, alike, forget = [], {}, {}, []
        for name, spec in scenario.graphs:
            hit = self._tokens.get(id(spec))
            if hit is None or hit[1]() is not spec:
                if hit is not None:
                    forget.append(hit[0])
                    del self._sizes[hit[0]]
                base = self._sharing(spec)
                hit = self._tokens[id(spec)] = (self._next, weakref.ref(spec))
                self._sizes[self._next] = len(spec.tensors)  # an alike copy too: it may outlive its base
                if base is None:
                    new[self._next] = spec
                else:
                    alike[self._next] = (base, spec.forced, spec.label)
                self._next += 1
            self._tokens.move_to_end(id(spec))
            graphs.append((name, hit[0]))
        protected = {token for token, _, _ in alike.values()} | {token for _, token in graphs}
        while len(self._tokens) > len(protected) and (len(self._tokens) > KEPT or sum(self._sizes.values()) > KEPT_TENSORS):
            oldest = next(k for k, (token, _) in self._tokens.items() if token not in protected)
            forget.append(token := self._tokens.pop(oldest)[0])
            del self._sizes[token]
        return {"layout": scenario.layout, "graphs": tuple(graphs), "steps": scenario.steps, "specs": new, "alike": alike,
                "forget": forget, "endpoints": list(endpoints), "values": values}

    def _sharing(self, spec: GraphSpec) -> int | None:
        """The token of a kept spec that ``spec`` is a copy of with other forced assignments or
        label (``GraphSpec.with_forced``, ``relabeled``: the same tensors and roots, and what was
        derived from them), if the worker keeps one: a captured llama.cpp graph (thousands of
        tensors) is drawn with more nodes forced in most of its examples, and was sent, unpickled
        and encoded again each time."""
        for token, ref in self._tokens.values():
            kept = ref()
            if kept is not None and kept.tensors is spec.tensors and kept.roots == spec.roots and kept.derived is spec.derived:
                return token
        return None


class KeptSpecs:
    """The worker's side: the specs it was sent, by token."""

    def __init__(self) -> None:
        self._specs: dict[int, GraphSpec] = {}

    def scenario(self, req: dict[str, Any]) -> Scenario:
        """The request's scenario, its specs those sent now, made from a kept one, or kept from an
        earlier request."""
        self._specs.update(req["specs"])
        for token, (base, forced, label) in req["alike"].items():
            self._specs[token] = self._specs[base].with_forced(forced).relabeled(label)
        for token in req["forget"]:
            del self._specs[token]
        return Scenario(req["layout"], tuple((name, self._specs[token]) for name, token in req["graphs"]), req["steps"])

"""Graph specs a graph worker keeps from one scenario to the next: the parent sends a spec once,
then its token (``SentSpecs``); the worker keeps the spec, with what it made of it (its program,
ggml's names of its nodes), under that token (``KeptSpecs``).

A spec recurs: a fresh run of the same scenario (``reuse-equivalent``), a confirmation, the
reruns that tell causes apart, Hypothesis's mutations of an example (``sim.models.llama_graph``
hands out one object per arguments), a captured graph drawn into many scenarios. Each time
the parent pickled it again (its thousands of tensors), the worker unpickled it and encoded
its program again. Both sides forget the least recently used spec beyond ``KEPT``, the parent
saying which (the worker never decides alone, so the two tables cannot drift); a new worker
starts with an empty table on both sides.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..model.graph_spec import GraphSpec
from ..model.scenario import Scenario

KEPT = 64  # specs per worker; a scenario's own specs are never forgotten while it is sent


class SentSpecs:
    """The parent's side, for one worker: the specs it holds, by object, with their tokens."""

    def __init__(self) -> None:
        # id(spec) -> (token, the spec): weakly, for the parent's specs hold what judges derived
        # from them (the reference's graph), which nothing else may need; a dead spec's id that
        # comes again is another spec's
        self._tokens: OrderedDict[int, tuple[int, weakref.ref[GraphSpec]]] = OrderedDict()
        self._next = 0

    def request(self, scenario: Scenario, endpoints: Sequence[str], values: bool) -> dict[str, Any]:
        """The worker's request for ``scenario``: its graphs as tokens, the specs the worker lacks
        in full, and the tokens it may forget."""
        graphs, new, forget = [], {}, []
        for name, spec in scenario.graphs:
            hit = self._tokens.get(id(spec))
            if hit is None or hit[1]() is not spec:
                if hit is not None:
                    forget.append(hit[0])
                hit = self._tokens[id(spec)] = (self._next, weakref.ref(spec))
                new[self._next] = spec
                self._next += 1
            self._tokens.move_to_end(id(spec))
            graphs.append((name, hit[0]))
        while len(self._tokens) > max(KEPT, len(scenario.graphs)):
            _, (token, _) = self._tokens.popitem(last=False)
            forget.append(token)
        return {"layout": scenario.layout, "graphs": tuple(graphs), "steps": scenario.steps, "specs": new, "forget": forget,
                "endpoints": list(endpoints), "values": values}


class KeptSpecs:
    """The worker's side: the specs it was sent, by token."""

    def __init__(self) -> None:
        self._specs: dict[int, GraphSpec] = {}

    def scenario(self, req: dict[str, Any]) -> Scenario:
        """The request's scenario, its specs those sent now or kept from an earlier request."""
        for token in req["forget"]:
            del self._specs[token]
        self._specs.update(req["specs"])
        return Scenario(req["layout"], tuple((name, self._specs[token]) for name, token in req["graphs"]), req["steps"])

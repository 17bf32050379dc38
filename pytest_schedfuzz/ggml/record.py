"""What a step of the graph engine's run comes to (``StepRecording``, a part of
``scenario_run.ScenarioRun``): every node's and leaf's backend, read while the scheduler's hash table is
live (``observe.c``), the splits from ggml's log, the buffer sizes and counts, and each
reallocation with ggml's own decision where its realloc callback tells it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from typing import Any

from ..engine import TargetError
from ..model.scenario import Scenario
from ..model.trace import UNOBSERVABLE, ReallocEvent, SizeCounts, Split, StepRecord
from .bindings import OBSERVE_SPLITS, Built, Ggml

UNKNOWN_BACKEND = -2  # observe.c's index for a backend pointer not among the scenario's


@dataclass
class Snapshot:
    """Backend index (-1: none) of every node and leaf, read while the hash table is live."""

    nodes: tuple[int, ...] = ()
    leafs: tuple[int, ...] = ()
    taken: bool = False


class StepRecording:
    """A step's record. A part of ``ScenarioRun``, which sets up the backends and the scheduler."""

    eng: Ggml
    g: Any  # ggml-python
    scenario: Scenario
    sched: Any
    backends: list[int]
    names: list[str]  # the backends' names, in the scheduler's order
    counts: SizeCounts | None
    _backend_array: Any

    def _arm_snapshot(self, built: Built) -> Any:
        """Have ``observe.c`` read every node's and leaf's backend at the step's split printout
        (inside ``ggml_backend_sched_split_graph``, while the hash table is live); its output array."""
        out = (ctypes.c_int * len(built.observed))()
        self.eng.helpers.schedfuzz_observe_arm(self.sched, built.observed, len(built.observed), self._backend_array, len(self.backends), out)
        return out

    def _snapshot(self, built: Built, out: Any) -> Snapshot:
        n = len(built.nodes)
        got = list(out)
        if UNKNOWN_BACKEND in got:
            k = got.index(UNKNOWN_BACKEND)
            raise TargetError(f"ggml_backend_sched_get_tensor_backend gave {'node' if k < n else 'leaf'} #{k if k < n else k - n} "
                              "a backend the scheduler was not given")
        return Snapshot(tuple(got[:n]), tuple(got[n:]), True)

    def _sizes(self) -> tuple[int, ...]:
        return tuple(self.g.ggml_backend_sched_get_buffer_size(self.sched, b) for b in self.backends)

    def _with_ggml_decisions(self, index: int, events: tuple[ReallocEvent, ...]) -> tuple[ReallocEvent, ...]:
        """The scheduler's reallocations (``via`` sched: ``alloc_splits`` re-reserving) with ggml's
        own decision from its realloc callback, one call per reallocation it logged."""
        said, out = list(self.eng.said), []
        for e in events:
            if e.via != "sched":
                out.append(e)  # ggml-alloc re-planned by itself: no scheduler decision to report
                continue
            if not said:
                raise TargetError(f"step {index}: ggml logged a reallocation its realloc callback did not report")
            ids_changed, size_changed = said.pop(0)
            if ids_changed != e.backend_ids_changed:
                raise TargetError(f"step {index}: ggml's realloc callback says backend_ids_changed = {int(ids_changed)}, its log {int(e.backend_ids_changed)}")
            out.append(replace(e, ggml_size_changed=size_changed))
        if said:
            raise TargetError(f"step {index}: ggml's realloc callback reported {len(said)} reallocation(s) its log did not show")
        return tuple(out)

    def _dep_nodes(self) -> int:
        """The dependency nodes ggml made for the GPU-like devices' fusions (``add_alloc_dep``)
        since the last call, as the devices count them."""
        gpus = [b for b, spec in zip(self.backends, self.scenario.layout.backends) if spec.device.fake_gpu]
        return sum(self.eng.fake_gpu().schedfuzz_fake_gpu_take_dep_nodes(b) for b in gpus) if gpus else 0

    def _record(self, index: int, kind: str, built: Built, snap: Snapshot, ok: bool, n_dep_nodes: int) -> StepRecord:
        g, log = self.g, self.eng.log
        if log.errors:
            raise TargetError(f"step {index}: cannot read ggml's log: " + "; ".join(log.errors) + self._log_tail())
        n_nodes, n_leafs = len(built.nodes), len(built.leafs)
        n_splits = g.ggml_backend_sched_get_n_splits(self.sched)
        n_copies = g.ggml_backend_sched_get_n_copies(self.sched)
        splits = self._splits(index, n_nodes, n_splits) if OBSERVE_SPLITS else ()
        counts = SizeCounts(n_nodes, n_leafs, n_splits, sum(len(s.inputs) for s in splits), *self.eng.input_leafs(built, n_copies), n_copies, n_dep_nodes)
        prev, self.counts = self.counts, counts
        events = tuple(ReallocEvent(index, r.via, r.backend_ids_changed, n_splits, r.reason) for r in log.reallocs)
        if not self.eng.logs_reallocs:  # a Release build: the callback alone tells the scheduler's re-plans
            events = tuple(ReallocEvent(index, "sched", ids, n_splits, UNOBSERVABLE, ggml_size_changed=size) for ids, size in self.eng.said)
        elif self.eng.set_realloc_callback is not None:
            events = self._with_ggml_decisions(index, events)
        return StepRecord(
            index,
            kind,
            node_names=built.names[0],
            node_backends=snap.nodes,
            leaf_names=built.names[1],
            leaf_backends=snap.leafs,
            splits=splits,
            n_copies=n_copies,
            counts=counts,
            prev_counts=prev,
            buffer_sizes=self._sizes(),
            events=events,
            ok=ok,
        )

    def _splits(self, index: int, n_nodes: int, n_splits: int) -> tuple[Split, ...]:
        logged = self.eng.log.splits
        if n_nodes == 0:
            return ()
        if len(logged) != n_splits:
            raise TargetError(
                f"step {index}: ggml_backend_sched_get_n_splits says {n_splits} splits, the log shows {len(logged)}"
                " (is GGML_SCHED_DEBUG=2 set before ggml_backend_sched_new?)" + self._log_tail()
            )
        starts = [s.first_node for s in logged]
        if any(s is None for s in starts):
            raise TargetError(f"step {index}: a logged split has no node line" + self._log_tail())
        bounds = [int(s) for s in starts if s is not None] + [n_nodes]
        by_name = {n: i for i, n in enumerate(self.names)}
        return tuple(Split(by_name[s.backend_name], bounds[k], bounds[k + 1], tuple(s.inputs)) for k, s in enumerate(logged))

    def _log_tail(self) -> str:
        return "\nlast lines of ggml's log:\n" + "\n".join(self.eng.log.tail)

"""Scenarios on llama.cpp's own graphs (``campaign.captures``): a captured scenario's graphs,
on a layout drawn again (each device an RPC server or a GPU-like device with drawn settings, the
CPU last, so that every weight keeps its device), with tensors forced onto drawn backends, under
drawn scheduler parameters, where the scheduler is kept exactly when the reuse policy says so, as
``llama_context::sched_reserve`` decides (``sim.driver.Driver``):

- ``captured_scenarios``: in drawn sequences of reserves, allocs, computes (their inputs filled
  by the values oracle, ``ggml.cpu_values``), splits, eval callbacks and re-reservations (``sched_new``);
- ``captured_workloads``: in llama.cpp's own order, as a server would drive it: its reservation
  (the worst-case graphs ``sched_reserve`` reserved, in its order), then ubatches of the graphs
  llama.cpp built for its decodes, in a drawn order, and re-reservations (``sched_new`` with drawn
  parameters, then the reservation again), as after a ``llama_set_*`` call; now and then with an
  eval callback on every scheduler (``cparams.cb_eval``, as llama-imatrix sets it: llama.cpp hands
  it to ``ggml_backend_sched_set_eval_callback`` before it computes)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import strategies as st

from ..model.devices import DeviceLimits
from ..model.graph_spec import GraphSpec
from ..model.layout import BackendLayout, BackendSpec
from ..model.ops import VIEW_OPS
from ..model.scenario import Scenario, SchedParams, Step
from ..sim.driver import Policy, can_reuse
from . import fit_max_size, gpus, sampled, written_device

CAPTURED_DEVICES = DeviceLimits.of(gpu=2)  # the GPU-like devices a captured layout may draw instead of RPC ones

@st.composite
def captured_scenarios(draw: st.DrawFn, pool: Sequence[Scenario], limits: DeviceLimits = CAPTURED_DEVICES, max_steps: int = 8,
                       policy: Policy = can_reuse) -> Scenario:
    base = _base(draw, pool)
    layout = draw(_layouts(base.layout, limits))
    graphs = tuple((name, draw(_forced(g, layout.n))) for name, g in base.graphs)
    max_nodes = max((s.params.max_nodes for s in base.steps if s.params is not None), default=1024)
    params = st.builds(SchedParams, st.just(max_nodes), parallel=st.booleans(), op_offload=st.booleans())
    names = [n for n, _ in graphs]
    cur = draw(params)
    steps = [Step("sched_new", params=cur)]
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(sampled(("reserve", "alloc", "alloc", "compute", "split", "sched_new", "eval_callback")))
        if kind == "eval_callback":
            steps.append(Step(kind))
            continue
        if kind != "sched_new":
            steps.append(Step(kind, draw(st.sampled_from(names))))
            continue
        # the scheduler is kept when the policy allows it (then its parameters stay), else built anew
        new = draw(params)
        reuse = bool(policy(new, cur))
        steps.append(Step("sched_new", params=new, reuse=reuse))
        cur = cur if reuse else new
    layout = fit_max_size(layout, [g for _, g in graphs])
    return Scenario(layout, graphs, tuple(steps))


@st.composite
def captured_workloads(draw: st.DrawFn, pool: Sequence[Scenario], limits: DeviceLimits = CAPTURED_DEVICES, max_ubatches: int = 8,
                       policy: Policy = can_reuse) -> Scenario:
    base = _base(draw, pool)
    layout = draw(_layouts(base.layout, limits))
    graphs = draw(_forced_alike(base.graphs, layout.n))
    first = next(i for i, s in enumerate(base.steps) if s.kind == "sched_new")
    # sched_reserve's splits and reserves, in its order, up to the first ubatch
    reservation = list(itertools.takewhile(lambda s: s.kind in ("split", "reserve"), base.steps[first + 1:]))
    decodes = sorted({s.graph for s in base.steps if s.kind == "alloc" and s.graph is not None})
    max_nodes = max((s.params.max_nodes for s in base.steps if s.params is not None), default=1024)
    params = st.builds(SchedParams, st.just(max_nodes), parallel=st.booleans(), op_offload=st.booleans())
    cur = draw(params)
    cb_eval = [Step("eval_callback")] if draw(st.integers(0, 3)) == 3 else []
    steps = [Step("sched_new", params=cur), *cb_eval, *reservation]
    for _ in range(draw(st.integers(1, max_ubatches))):
        if draw(st.integers(0, 7)) == 7:  # a reconfiguration: the policy decides, the reservation follows
            new = draw(params)
            reuse = bool(policy(new, cur))
            steps += [Step("sched_new", params=new, reuse=reuse), *([] if reuse else cb_eval), *reservation]
            cur = cur if reuse else new
        steps.append(Step("compute", draw(st.sampled_from(decodes))))  # llama_decode: alloc the ubatch's graph, compute it
    return Scenario(fit_max_size(layout, [g for _, g in graphs]), graphs, tuple(steps))


def _base(draw: st.DrawFn, pool: Sequence[Scenario]) -> Scenario:
    """A scenario of ``pool``, drawn by index: ``sampled_from`` hashes its elements at every draw,
    here every tensor of every captured graph (and ``integers`` would favour the first)."""
    return pool[draw(st.sampled_from(range(len(pool))))]


@st.composite
def _forced_alike(draw: st.DrawFn, graphs: Sequence[tuple[str, GraphSpec]], n_backends: int) -> tuple[tuple[str, GraphSpec], ...]:
    """``graphs`` with up to two more nodes forced onto drawn backends, by name, in every graph
    that has one, as llama.cpp forces a layer's norms in every graph it builds (forced in one
    graph only, a reservation cannot dominate the graph that differs; a write into a cache onto
    the cache's device only, ``written_device``)."""
    names = sorted({t.name for _, g in graphs for t in g.tensors if not t.is_leaf and t.op not in VIEW_OPS} - {n for _, g in graphs for n, _ in g.forced})
    extra = _up_to_two(draw, names, n_backends)
    out = []
    for name, g in graphs:
        here = [(n, b if (w := written_device(g.by_name, n)) is None else w) for n, b in extra if n in g.by_name]
        out.append((name, g.with_forced(g.forced + tuple(here)) if here else g))
    return tuple(out)


@st.composite
def _layouts(draw: st.DrawFn, base: BackendLayout, limits: DeviceLimits) -> BackendLayout:
    """As many backends as ``base`` (the weights name them by index), each device drawn again:
    a GPU-like device while ``limits`` allows one more, else an RPC device (llama.cpp's own
    layouts hold no BLAS)."""
    specs: list[BackendSpec] = []
    for b in base.backends[:-1]:
        n_gpu = sum(s.device.fake_gpu for s in specs)
        specs.append(draw(gpus()) if n_gpu < limits["gpu"] and draw(st.booleans()) else BackendSpec("rpc"))
    return BackendLayout((*specs, BackendSpec("cpu")))


@st.composite
def _forced(draw: st.DrawFn, g: GraphSpec, n_backends: int) -> GraphSpec:
    """``g`` with up to two more nodes (not views) forced onto drawn backends, as llama.cpp forces
    norms; a write into a pre-allocated tensor (a cache view's cpy or set_rows) onto that tensor's
    device only: forced elsewhere, the CPU writes through an RPC buffer's address (as the graph
    strategy knows, ``written_device``)."""
    taken = {name for name, _ in g.forced}
    nodes = [t.name for t in g.tensors if not t.is_leaf and t.op not in VIEW_OPS and t.name not in taken]
    extra = [(name, b if (w := written_device(g.by_name, name)) is None else w) for name, b in _up_to_two(draw, nodes, n_backends)]
    return g.with_forced(g.forced + tuple(extra)) if extra else g


def _up_to_two(draw: st.DrawFn, names: Sequence[str], n_backends: int) -> list[tuple[str, int]]:
    """Up to two of ``names``, each with a drawn backend. Drawn by index: a ``lists`` of
    ``sampled_from`` hundreds of names was a new strategy to validate at every draw, a fifth of
    the drawing of a captured scenario."""
    out: dict[str, int] = {}
    for _ in range(draw(st.integers(0, 2)) if names else 0):
        name = names[draw(st.sampled_from(range(len(names))))]
        out.setdefault(name, draw(st.integers(0, n_backends - 1)))
    return list(out.items())


__all__ = ["captured_scenarios", "captured_workloads"]

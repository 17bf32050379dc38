"""Scenarios on llama.cpp's own graphs (``campaign.captures``): a captured scenario's graphs,
on a layout drawn again (each device an RPC server or a GPU-like device with drawn settings, the
CPU last, so that every weight keeps its device), with tensors forced onto drawn backends, under
drawn scheduler parameters, in drawn sequences of reserves, allocs, computes (their inputs filled
by the values oracle, ``ggml.values``), splits and re-reservations
(``sched_new``), where the scheduler is kept exactly when the reuse policy says so, as
``llama_context::sched_reserve`` decides (``sim.driver.Driver``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from ..model.scenario import BackendLayout, BackendSpec, GraphSpec, Scenario, SchedParams, Step
from ..model.shapes import VIEW_OPS
from ..sim.driver import Policy, can_reuse
from . import fit_max_size, gpus, written_device


@st.composite
def captured_scenarios(draw: st.DrawFn, pool: Sequence[Scenario], max_gpu: int = 2, max_steps: int = 8,
                       policy: Policy = can_reuse) -> Scenario:
    base = draw(st.sampled_from(list(pool)))
    layout = draw(_layouts(base.layout, max_gpu))
    graphs = tuple((name, draw(_forced(g, layout.n))) for name, g in base.graphs)
    max_nodes = max((s.params.max_nodes for s in base.steps if s.params is not None), default=1024)
    params = st.builds(SchedParams, st.just(max_nodes), parallel=st.booleans(), op_offload=st.booleans())
    names = [n for n, _ in graphs]
    cur = draw(params)
    steps = [Step("sched_new", params=cur)]
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(("reserve", "alloc", "alloc", "compute", "split", "sched_new")))
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
def _layouts(draw: st.DrawFn, base: BackendLayout, max_gpu: int) -> BackendLayout:
    """As many backends as ``base`` (the weights name them by index), each device drawn again."""
    specs: list[BackendSpec] = []
    for b in base.backends[:-1]:
        n_gpu = sum(s.kind == "gpu" for s in specs)
        specs.append(draw(gpus()) if n_gpu < max_gpu and draw(st.booleans()) else BackendSpec("rpc"))
    return BackendLayout((*specs, BackendSpec("cpu")))


@st.composite
def _forced(draw: st.DrawFn, g: GraphSpec, n_backends: int) -> GraphSpec:
    """``g`` with up to two more nodes (not views) forced onto drawn backends, as llama.cpp forces
    norms; a write into a pre-allocated tensor (a cache view's cpy or set_rows) onto that tensor's
    device only: forced elsewhere, the CPU writes through an RPC buffer's address (as the graph
    strategy knows, ``written_device``)."""
    taken = {name for name, _ in g.forced}
    nodes = [t.name for t in g.tensors if not t.is_leaf and t.op not in VIEW_OPS and t.name not in taken]
    extra = draw(st.lists(st.tuples(st.sampled_from(nodes), st.integers(0, n_backends - 1)), max_size=2, unique_by=lambda f: f[0])) if nodes else []
    extra = [(name, b if (w := written_device(g.by_name, name)) is None else w) for name, b in extra]
    return replace(g, forced=g.forced + tuple(extra)) if extra else g


__all__ = ["captured_scenarios"]

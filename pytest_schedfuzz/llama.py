"""Server-like workloads for the real llama.cpp: what a server does to one ``llama_context``.

A ``LlamaWorkload`` is plain data (JSON round-trippable): a tiny model (``gguf_models.ModelSpec``),
where its layers go (``Devices``: RPC devices on loopback, ``n_gpu_layers``), the context
parameters (``ContextParams``) and a list of ``Call``s: ``llama_decode`` of a batch mixing
sequences, the memory calls a server makes (``seq_rm`` for speculative rollback and slot reuse,
``seq_cp``, ``seq_keep``, context shift = ``seq_rm`` + ``seq_add``) and the per-request switches
(``llama_set_embeddings``, ``llama_set_causal_attn``, ``llama_set_warmup``, backend samplers, the
LoRA adapters of the request: ``loras`` are tiny adapters written with the model, loaded on it
with ``llama_adapter_lora_init``, attached with ``llama_set_adapters_lora``, freed).

Positions are not stored: the worker continues every sequence from ``llama_memory_seq_pos_max``,
as a server does, so a shrunk workload stays valid. Calls that llama.cpp documents as invalid
(a sequence id >= ``n_seq_max``, more outputs than ``n_outputs_max``/``n_outputs_max_per_seq``
allow, a batch larger than ``n_batch``) are never generated and are refused by ``validate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from hypothesis import strategies as st

from .gguf_models import LORA_TARGETS, MAX_WEIGHT_BYTES, LoraSpec, ModelSpec

FLASH_ATTN = ("off", "on", "auto")
KV_TYPES = ("f16", "f32", "q8_0")
POOLING = ("none", "mean", "last", "cls")
OUTPUTS = ("last", "all", "none")
# backend sampler chains as llama-server builds them from a request's parameters (each sampler
# here has a backend implementation in 0.3.36: the whole chain runs in the graph)
SAMPLER_CHAINS: dict[str, tuple[str, ...]] = {
    "greedy": ("greedy",),
    "top_k-greedy": ("top_k", "greedy"),
    "top_k-temp-dist": ("top_k", "temp", "dist"),
    "top_p-min_p-temp-dist": ("top_p", "min_p", "temp", "dist"),
}
CALL_KINDS = ("decode", "seq_rm", "seq_cp", "seq_keep", "shift", "set_embeddings", "set_causal_attn", "set_warmup", "set_sampler", "clear",
              "lora_load", "lora_set", "lora_free")

# explicit limits, checked by validate(): tiny models, and runs of a few hundred ms
MAX_RPC = 2
MAX_CALLS = 64
MAX_CTX = 4096
MAX_SEQ = 8
MAX_LORAS = 3


class WorkloadError(ValueError):
    """A workload field out of range; the message names the field."""


@dataclass(frozen=True)
class Devices:
    """Where the model lives: ``n_rpc`` ggml RPC servers (devices in this order, highest priority
    first, the CPU last) and how many layers are offloaded to them (``llama_model_params``)."""

    n_rpc: int = 1
    n_gpu_layers: int = 99  # > n_layer: everything offloaded (pipeline parallelism needs it)
    tensor_split: tuple[float, ...] = ()  # per RPC device; () = llama.cpp's default (by free memory)


@dataclass(frozen=True)
class ContextParams:
    """``llama_context_params`` fields that change the scheduled graphs."""

    n_ctx: int = 512
    n_batch: int = 64
    n_ubatch: int = 32
    n_seq_max: int = 1
    flash_attn: str = "off"
    op_offload: bool = True
    offload_kqv: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    kv_unified: bool = True
    embeddings: bool = False
    pooling: str = "none"
    n_outputs_max: int = 0  # 0 = n_batch
    n_outputs_max_per_seq: int = 0  # 0 = n_outputs_max
    backend_samplers: bool = False  # a backend sampler chain per sequence (llama_sampler_seq_config)
    sampler_chain: str = "greedy"  # which (SAMPLER_CHAINS)

    def outputs_max(self) -> int:
        return self.n_outputs_max or self.n_batch

    def outputs_max_per_seq(self) -> int:
        return min(self.n_outputs_max_per_seq or self.outputs_max(), self.outputs_max())


@dataclass(frozen=True)
class Part:
    """``n_tokens`` consecutive tokens of sequence ``seq`` in one batch, with outputs for the last
    token, all of them, or none."""

    seq: int
    n_tokens: int
    outputs: str = "last"

    def n_outputs(self) -> int:
        return {"last": 1, "all": self.n_tokens, "none": 0}[self.outputs]


@dataclass(frozen=True)
class Call:
    """One call on the context. ``decode``: ``parts``; ``seq_rm``: drop the last ``n`` positions of
    ``seq`` (``n`` = -1: all of it, a slot reused); ``seq_cp``: copy ``seq`` to ``dst``;
    ``seq_keep``: keep only ``seq``; ``shift``: context shift of ``seq``, keeping ``n_keep`` and
    discarding the next ``n`` (``seq_rm`` then ``seq_add``); ``set_*``: ``flag``; ``set_sampler``:
    attach (``flag``) a new backend sampler chain ``chain`` to ``seq``, or detach it; ``clear``:
    ``llama_memory_clear``; ``lora_load``/``lora_free``: load or free adapter ``n`` of the
    workload's ``loras`` on the model; ``lora_set``: attach the loaded adapters whose bits are set
    in ``n`` (scale 1; 0 detaches all), as llama-server does per request."""

    kind: str
    parts: tuple[Part, ...] = ()
    seq: int = 0
    dst: int = 0
    n: int = 0
    n_keep: int = 0
    flag: bool = False
    chain: str = ""  # set_sampler: SAMPLER_CHAINS key ("": greedy)

    def describe(self) -> str:
        if self.kind == "decode":
            body = ", ".join(f"seq {p.seq}: {p.n_tokens} tok, out {p.outputs}" for p in self.parts)
            return f"llama_decode([{body}])"
        return {
            "seq_rm": f"llama_memory_seq_rm(seq {self.seq}, {'all' if self.n < 0 else f'last {self.n}'})",
            "seq_cp": f"llama_memory_seq_cp({self.seq} -> {self.dst})",
            "seq_keep": f"llama_memory_seq_keep({self.seq})",
            "shift": f"context shift(seq {self.seq}: keep {self.n_keep}, discard {self.n})",
            "clear": "llama_memory_clear()",
            "set_sampler": f"llama_set_sampler(seq {self.seq}, {'chain ' + (self.chain or 'greedy') if self.flag else 'none'})",
            "lora_load": f"llama_adapter_lora_init(lora {self.n})",
            "lora_free": f"llama_adapter_lora_free(lora {self.n})",
            "lora_set": f"llama_set_adapters_lora([{', '.join(f'lora {i}' for i in range(MAX_LORAS) if self.n >> i & 1)}])",
        }.get(self.kind, f"llama_{self.kind}({str(self.flag).lower()})")

    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.parts)

    def n_outputs(self) -> int:
        return sum(p.n_outputs() for p in self.parts)


@dataclass(frozen=True)
class LlamaWorkload:
    model: ModelSpec
    devices: Devices = Devices()
    ctx: ContextParams = ContextParams()
    calls: tuple[Call, ...] = ()
    loras: tuple[LoraSpec, ...] = ()  # adapters for the model, loaded and attached by the calls

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.to_json(),
            "devices": asdict(self.devices),
            "ctx": asdict(self.ctx),
            "calls": [_call_json(c) for c in self.calls],
        } | ({"loras": [a.to_json() for a in self.loras]} if self.loras else {})

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> LlamaWorkload:
        """Parse and validate; any problem raises ``WorkloadError`` naming the field."""
        try:
            model = ModelSpec.from_json(d["model"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise WorkloadError(f"model: {e}") from None
        try:
            dv = dict(d.get("devices", {}))
            dv["tensor_split"] = tuple(float(x) for x in dv.get("tensor_split", ()))
            devices = Devices(**dv)
            ctx = ContextParams(**d.get("ctx", {}))
            calls = tuple(
                Call(**{**c, "parts": tuple(Part(**p) for p in c.get("parts", ()))}) for c in d.get("calls", ())
            )
            loras = tuple(LoraSpec.from_json(a) for a in d.get("loras", ()))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise WorkloadError(f"malformed llama workload: {type(e).__name__}: {e}") from None
        w = LlamaWorkload(model, devices, ctx, calls, loras)
        w.validate()
        return w

    def validate(self) -> None:
        try:
            self.model.validate()
        except ValueError as e:
            raise WorkloadError(f"model: {e}") from None
        c, dv = self.ctx, self.devices

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise WorkloadError(what)

        need(0 <= dv.n_rpc <= MAX_RPC, f"devices.n_rpc {dv.n_rpc}: must be 0..{MAX_RPC}")
        need(0 <= dv.n_gpu_layers <= 999, f"devices.n_gpu_layers {dv.n_gpu_layers}: must be 0..999")
        need(not dv.tensor_split or (len(dv.tensor_split) == dv.n_rpc and all(x >= 0 for x in dv.tensor_split) and sum(dv.tensor_split) > 0),
             f"devices.tensor_split {list(dv.tensor_split)}: one non-negative share per RPC device, not all zero")
        need(16 <= c.n_ctx <= MAX_CTX, f"ctx.n_ctx {c.n_ctx}: must be 16..{MAX_CTX}")
        need(1 <= c.n_ubatch <= c.n_batch <= c.n_ctx, f"ctx.n_ubatch {c.n_ubatch} / n_batch {c.n_batch}: need 1 <= n_ubatch <= n_batch <= n_ctx")
        need(1 <= c.n_seq_max <= MAX_SEQ, f"ctx.n_seq_max {c.n_seq_max}: must be 1..{MAX_SEQ}")
        need(c.flash_attn in FLASH_ATTN, f"ctx.flash_attn {c.flash_attn!r}: one of {', '.join(FLASH_ATTN)}")
        need(c.type_k in KV_TYPES and c.type_v in KV_TYPES, f"ctx.type_k/type_v {c.type_k}/{c.type_v}: each one of {', '.join(KV_TYPES)}")
        need(c.type_v == "f16" or c.type_v == "f32" or c.flash_attn == "on", "ctx.type_v: a quantized V cache needs flash_attn on")
        need(c.pooling in POOLING, f"ctx.pooling {c.pooling!r}: one of {', '.join(POOLING)}")
        need(c.sampler_chain in SAMPLER_CHAINS, f"ctx.sampler_chain {c.sampler_chain!r}: one of {', '.join(SAMPLER_CHAINS)}")
        need(0 <= c.n_outputs_max <= c.n_batch and 0 <= c.n_outputs_max_per_seq <= c.n_batch,
             f"ctx.n_outputs_max {c.n_outputs_max} / n_outputs_max_per_seq {c.n_outputs_max_per_seq}: must be 0..n_batch")
        need(len(self.calls) <= MAX_CALLS, f"calls: {len(self.calls)} calls, at most {MAX_CALLS}")
        need(len(self.loras) <= MAX_LORAS, f"loras: {len(self.loras)} adapters, at most {MAX_LORAS}")
        for k, a in enumerate(self.loras):
            try:
                a.validate(self.model)
            except ValueError as e:
                raise WorkloadError(f"loras[{k}]: {e}") from None
        loaded: set[int] = set()
        attached = 0
        causal = True
        for i, call in enumerate(self.calls):
            if call.kind == "set_causal_attn":
                causal = call.flag
            where = f"calls[{i}] ({call.kind})"
            need(call.kind in CALL_KINDS, f"{where}: unknown call kind; one of {', '.join(CALL_KINDS)}")
            need(0 <= call.seq < c.n_seq_max and 0 <= call.dst < c.n_seq_max, f"{where}: sequence id >= n_seq_max {c.n_seq_max}")
            need(call.n >= -1 and call.n_keep >= 0, f"{where}: n {call.n} / n_keep {call.n_keep} out of range")
            need(not call.chain or call.chain in SAMPLER_CHAINS, f"{where}: chain {call.chain!r}: one of {', '.join(SAMPLER_CHAINS)}")
            if call.kind in ("lora_load", "lora_free"):
                need(0 <= call.n < len(self.loras), f"{where}: adapter {call.n}: the workload has {len(self.loras)}")
                need((call.n in loaded) == (call.kind == "lora_free"), f"{where}: adapter {call.n} is {'not ' if call.kind == 'lora_free' else ''}loaded")
                # freeing an attached adapter leaves the context a dangling pointer: llama-server never does
                need(call.kind == "lora_load" or not attached >> call.n & 1, f"{where}: adapter {call.n} is attached to the context")
                loaded ^= {call.n}
            elif call.kind == "lora_set":
                need(call.n >= 0 and all(call.n >> i & 1 == 0 or i in loaded for i in range(max(call.n.bit_length(), 1))),
                     f"{where}: attaches adapters that are not loaded (mask {call.n}, loaded {sorted(loaded)})")
                attached = call.n
            if call.kind == "decode":
                need(bool(call.parts), f"{where}: a batch needs at least one part")
                seqs = [p.seq for p in call.parts]
                need(len(set(seqs)) == len(seqs), f"{where}: a sequence appears twice in one batch")
                for p in call.parts:
                    need(0 <= p.seq < c.n_seq_max, f"{where}: sequence id {p.seq} >= n_seq_max {c.n_seq_max}")
                    need(p.n_tokens >= 1 and p.outputs in OUTPUTS, f"{where}: part {p} out of range")
                    need(p.n_outputs() <= c.outputs_max_per_seq(), f"{where}: {p.n_outputs()} outputs for seq {p.seq} > n_outputs_max_per_seq {c.outputs_max_per_seq()}")
                need(call.n_tokens() <= c.n_batch, f"{where}: {call.n_tokens()} tokens > n_batch {c.n_batch}")
                need(causal or call.n_tokens() <= c.n_ubatch, f"{where}: {call.n_tokens()} tokens > n_ubatch {c.n_ubatch} while causal attention is off")
                need(call.n_outputs() <= c.outputs_max(), f"{where}: {call.n_outputs()} outputs > n_outputs_max {c.outputs_max()}")

    def describe(self) -> str:
        m, c, dv = self.model, self.ctx, self.devices
        return (
            f"model {m.describe()}; devices: {dv.n_rpc} RPC, n_gpu_layers {dv.n_gpu_layers}"
            + (f", tensor_split {list(dv.tensor_split)}" if dv.tensor_split else "")
            + f"; ctx: n_ctx {c.n_ctx}, n_batch {c.n_batch}, n_ubatch {c.n_ubatch}, n_seq_max {c.n_seq_max}, "
            f"flash_attn {c.flash_attn}, op_offload {c.op_offload}, kv {c.type_k}/{c.type_v}{' unified' if c.kv_unified else ''}"
            + (f", embeddings pooling {c.pooling}" if c.embeddings else "")
            + (f", n_outputs_max {c.n_outputs_max}/{c.n_outputs_max_per_seq}" if c.n_outputs_max or c.n_outputs_max_per_seq else "")
            + (f", backend samplers ({c.sampler_chain})" if c.backend_samplers else "")
            + ("; loras: " + ", ".join(f"rank {a.rank} on {'/'.join(a.targets)}" for a in self.loras) if self.loras else "")
        )


def _call_json(c: Call) -> dict[str, Any]:
    """A call without its default fields: corpus files stay readable."""
    d = asdict(c)
    defaults = asdict(Call(c.kind))
    out = {k: v for k, v in d.items() if k == "kind" or v != defaults[k]}
    if "parts" in out:
        out["parts"] = [asdict(p) for p in c.parts]
    return out


# ------------------------------------------------------------------------------- strategies


@st.composite
def model_specs(draw: st.DrawFn, max_layers: int = 3) -> ModelSpec:
    """A tiny dense or mixture-of-experts llama (sizes within ``ModelSpec``'s bounds)."""
    n_head_kv = draw(st.sampled_from((1, 2, 4)))
    n_head = n_head_kv * draw(st.sampled_from((1, 2)))
    head_dim = draw(st.sampled_from((16, 32) if n_head == 1 else (8, 16, 32) if n_head <= 4 else (8, 16)))
    moe = draw(st.booleans())
    spec = ModelSpec(
        kind="moe" if moe else "dense",
        n_layer=draw(st.integers(1, max_layers)),
        n_embd=n_head * head_dim,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=draw(st.sampled_from((16, 32) if moe else (32, 64, 128))),
        n_expert=draw(st.sampled_from((4, 8))) if moe else 0,
        n_expert_used=2 if moe else 0,
        seed=draw(st.integers(0, 3)),
    )
    # deep models of wide layers (the nightly's max_layers): as many layers as the weights hold
    while spec.n_layer > 1 and 4 * spec.n_params > MAX_WEIGHT_BYTES:
        spec = replace(spec, n_layer=spec.n_layer - 1)
    return spec


@st.composite
def context_params(draw: st.DrawFn, head_dim: int = 32) -> ContextParams:
    """Context parameters; a quantized (q8_0) KV cache only where rows hold whole blocks of 32
    (``head_dim % 32 == 0``: ggml asserts on partial blocks)."""
    n_ubatch = draw(st.sampled_from((8, 16, 32, 64)))
    n_batch = n_ubatch * draw(st.sampled_from((1, 2)))
    n_seq_max = draw(st.integers(1, MAX_SEQ))
    flash = draw(st.sampled_from(FLASH_ATTN))
    kv_types = KV_TYPES if head_dim % 32 == 0 else ("f16", "f32")
    type_k = draw(st.sampled_from(kv_types))
    type_v = draw(st.sampled_from(kv_types if flash == "on" else ("f16", "f32")))
    embeddings = draw(st.integers(0, 5)) == 0
    pooling = draw(st.sampled_from(POOLING)) if embeddings else "none"
    # the limits llama-server sets: n_parallel * (1 + n_draft) outputs, capped at n_batch
    n_draft = draw(st.sampled_from((0, 0, 1, 3)))
    # with embeddings on and no pooling llama.cpp outputs every token: llama-server then sets no limit
    limited = draw(st.booleans()) and not embeddings
    per_seq = min(n_batch, 1 + n_draft) if limited else 0
    total = min(n_batch, n_seq_max * (1 + n_draft)) if limited else 0
    return ContextParams(
        n_ctx=draw(st.sampled_from((256, 512, 1024))),
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_seq_max=n_seq_max,
        flash_attn=flash,
        op_offload=draw(st.booleans()),
        offload_kqv=draw(st.sampled_from((True, True, False))),
        type_k=type_k,
        type_v=type_v,
        kv_unified=draw(st.booleans()),
        embeddings=embeddings,
        pooling=pooling,
        n_outputs_max=total,
        n_outputs_max_per_seq=per_seq,
        backend_samplers=draw(st.integers(0, 4)) == 0 and not embeddings,
        sampler_chain=draw(st.sampled_from(tuple(SAMPLER_CHAINS))),
    )


@st.composite
def devices(draw: st.DrawFn, n_layer: int, max_rpc: int = MAX_RPC) -> Devices:
    n_rpc = draw(st.integers(1, max_rpc))
    all_layers = draw(st.integers(0, 3)) > 0
    split = tuple(draw(st.sampled_from((1.0, 2.0, 3.0))) for _ in range(n_rpc)) if n_rpc > 1 and draw(st.booleans()) else ()
    return Devices(n_rpc=n_rpc, n_gpu_layers=99 if all_layers else draw(st.integers(0, n_layer)), tensor_split=split)


def _outputs(draw: st.DrawFn, n_tokens: int, room: int) -> str:
    options = [o for o in OUTPUTS if {"last": 1, "all": n_tokens, "none": 0}[o] <= room]
    return draw(st.sampled_from(options))


@st.composite
def server_calls(draw: st.DrawFn, ctx: ContextParams, max_calls: int = 24, n_loras: int = 0) -> tuple[Call, ...]:
    """What a server does between requests: prompts chunked to ``n_batch``, single-token decode
    of all active slots in one batch, speculative drafts verified and rolled back, slot reuse,
    ``seq_cp``/``seq_keep``, context shifts and per-request switches, and with ``n_loras``
    adapters their loading at start (as ``--lora`` does), per-request sets and run-time loads and
    frees. Outputs per batch and per sequence stay within the context's limits."""
    calls: list[Call] = []
    active: set[int] = set()
    loaded: set[int] = set(range(draw(st.integers(0, n_loras)))) if n_loras else set()
    attached = 0
    calls += [Call("lora_load", n=k) for k in sorted(loaded)]
    per_seq, total = ctx.outputs_max_per_seq(), ctx.outputs_max()
    n_steps = draw(st.integers(1, max_calls))
    for _ in range(n_steps):
        if len(calls) >= max_calls:
            break
        what = draw(st.sampled_from(("prompt", "prompt", "generate", "generate", "generate", "draft", "mixed", "reuse", "copy", "keep", "shift", "switch")
                                    + (("adapters", "adapters") if n_loras else ())))
        seqs = list(range(ctx.n_seq_max))
        if what == "prompt" or not active:
            seq = draw(st.sampled_from(seqs))
            length = draw(st.integers(1, 3 * ctx.n_batch))
            last_out = draw(st.sampled_from(("last", "last", "all", "none")))
            while length > 0 and len(calls) < max_calls:
                n = min(length, ctx.n_batch)
                length -= n
                out = last_out if length == 0 else "none"
                if out == "all" and n > min(per_seq, total):
                    out = "last"
                calls.append(Call("decode", (Part(seq, n, out),)))
            active.add(seq)
        elif what == "generate":
            chosen = sorted(draw(st.sets(st.sampled_from(sorted(active)), min_size=1)))
            chosen = chosen[: min(len(chosen), ctx.n_batch, total)]
            calls.append(Call("decode", tuple(Part(s, 1, "last") for s in chosen)))
        elif what == "draft":
            # speculative decoding: verify 1 + n_draft tokens (all output), then roll back the rejected
            seq = draw(st.sampled_from(sorted(active)))
            n = draw(st.integers(2, max(2, min(per_seq, total, ctx.n_batch))))
            out = "all" if n <= min(per_seq, total) else "last"
            calls.append(Call("decode", (Part(seq, n, out),)))
            rejected = draw(st.integers(0, n - 1))
            if rejected:
                calls.append(Call("seq_rm", seq=seq, n=rejected))
        elif what == "mixed":
            # continuous batching: one slot's prompt chunk next to other slots' next tokens
            seq = draw(st.sampled_from(seqs))
            others = [s for s in sorted(active) if s != seq][: max(0, min(total, ctx.n_batch) - 1)]
            room = ctx.n_batch - len(others)
            n = draw(st.integers(1, max(1, room)))
            parts = [Part(seq, n, _outputs(draw, n, min(per_seq, total - len(others))))] + [Part(s, 1, "last") for s in others]
            calls.append(Call("decode", tuple(parts)))
            active.add(seq)
        elif what == "reuse":
            seq = draw(st.sampled_from(sorted(active)))
            keep_prefix = draw(st.booleans())
            calls.append(Call("seq_rm", seq=seq, n=draw(st.integers(1, 16)) if keep_prefix else -1))
        elif what == "copy" and ctx.n_seq_max > 1:
            src = draw(st.sampled_from(sorted(active)))
            dst = draw(st.sampled_from([s for s in seqs if s != src]))
            # as llama-server does: the destination slot is emptied first
            calls += [Call("seq_rm", seq=dst, n=-1), Call("seq_cp", seq=src, dst=dst)]
            active.add(dst)
        elif what == "keep":
            seq = draw(st.sampled_from(sorted(active)))
            calls.append(Call("seq_keep", seq=seq))
            active = {seq}
        elif what == "shift":
            seq = draw(st.sampled_from(sorted(active)))
            calls.append(Call("shift", seq=seq, n_keep=draw(st.integers(0, 4)), n=draw(st.integers(1, 16))))
        elif what == "adapters" and n_loras:
            # a request with other LoRA adapters (llama-server sets them per request), or one loaded or freed at run time
            op = draw(st.sampled_from(("set", "set", "set", "load", "free")))
            if op == "load" and len(loaded) < n_loras:
                k = draw(st.sampled_from(sorted(set(range(n_loras)) - loaded)))
                calls.append(Call("lora_load", n=k))
                loaded.add(k)
            elif op == "free" and loaded:
                k = draw(st.sampled_from(sorted(loaded)))
                if attached >> k & 1:
                    attached &= ~(1 << k)
                    calls.append(Call("lora_set", n=attached))
                calls.append(Call("lora_free", n=k))
                loaded.discard(k)
            else:
                attached = sum(1 << k for k in draw(st.sets(st.sampled_from(sorted(loaded)))) ) if loaded else 0
                calls.append(Call("lora_set", n=attached))
        else:
            # a server with backend samplers sets each request's chain: the most frequent switch there
            kind = draw(st.sampled_from(("set_embeddings", "set_causal_attn", "set_warmup", "set_sampler", "clear")
                                        + (("set_sampler", "set_sampler") if ctx.backend_samplers else ())))
            if (kind == "set_sampler" and not ctx.backend_samplers) or (kind == "set_embeddings" and (ctx.n_outputs_max or ctx.n_outputs_max_per_seq)):
                kind = "set_warmup"
            flag = draw(st.booleans())
            chain = draw(st.sampled_from(tuple(SAMPLER_CHAINS))) if kind == "set_sampler" and flag else ""
            calls.append(Call(kind, seq=draw(st.sampled_from(seqs)), flag=flag, chain=chain))
            if kind == "clear":
                active = set()
    return _within_ubatch_when_non_causal(calls[:max_calls], ctx.n_ubatch)


def _within_ubatch_when_non_causal(calls: list[Call], n_ubatch: int) -> tuple[Call, ...]:
    """llama.cpp requires ``n_tokens <= n_ubatch`` while causal attention is off: trim such batches."""
    out, causal = [], True
    for c in calls:
        if c.kind == "set_causal_attn":
            causal = c.flag
        elif c.kind == "decode" and not causal and c.n_tokens() > n_ubatch:
            parts, room = [], n_ubatch
            for p in c.parts:
                if room > 0:
                    n = min(p.n_tokens, room)
                    parts.append(replace(p, n_tokens=n, outputs="last" if p.outputs == "all" and n < p.n_tokens else p.outputs))
                    room -= n
            c = replace(c, parts=tuple(parts))
        out.append(c)
    return tuple(out)


@st.composite
def llama_workloads(draw: st.DrawFn, max_layers: int = 3, max_rpc: int = MAX_RPC, max_calls: int = 24) -> LlamaWorkload:
    """A tiny model on 1..``max_rpc`` RPC devices, a context, and a server's calls on it."""
    model = draw(model_specs(max_layers))
    ctx = draw(context_params(model.head_dim))
    adapters = draw(loras(model))
    calls = draw(server_calls(ctx, max_calls, len(adapters)))
    return LlamaWorkload(model, draw(devices(model.n_layer, max_rpc)), ctx, calls, adapters)


@st.composite
def loras(draw: st.DrawFn, model: ModelSpec) -> tuple[LoraSpec, ...]:
    """0..``MAX_LORAS`` tiny LoRA adapters for ``model`` (a quarter of the workloads have some)."""
    if draw(st.integers(0, 3)):
        return ()
    targets = [t for t in LORA_TARGETS if model.kind == "dense" or not t.startswith("ffn_")]
    return tuple(LoraSpec(rank=draw(st.sampled_from((1, 2, 4, 8))), targets=tuple(sorted(draw(st.sets(st.sampled_from(targets), min_size=1)))),
                          alpha=draw(st.sampled_from((1.0, 4.0, 16.0))), seed=draw(st.integers(0, 3)))
                 for _ in range(draw(st.integers(1, MAX_LORAS))))


__all__ = [
    "SAMPLER_CHAINS", "Call", "ContextParams", "Devices", "LlamaWorkload", "Part", "WorkloadError",
    "context_params", "devices", "llama_workloads", "loras", "model_specs", "server_calls",
]

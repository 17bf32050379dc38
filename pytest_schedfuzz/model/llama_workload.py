"""Server-like workloads for the real llama.cpp: what a server does to one ``llama_context``.

A ``LlamaWorkload`` is plain data (JSON round-trippable): a tiny model (``gguf_models.ModelSpec``),
where its layers go (``Devices``: RPC devices on loopback, schedfuzz's GPU-like devices,
``n_gpu_layers``, split mode, tensor overrides), the context
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

from .devices import DeviceLimits
from .layout import BackendSpec

# the calls (one entry per kind) and what the workload's modules name from here
from .llama_calls import CALL_KINDS, MAX_DRAFT, MAX_LORAS, OUTPUTS, SAMPLER_CHAINS, Call, Checking, Part, check_calls  # noqa: F401
from .llama_model import RECURRENT_KINDS, ROLLBACK_KINDS, LoraSpec, ModelSpec
from .shapes import SpecError

FLASH_ATTN = ("off", "on", "auto")
KV_TYPES = ("f16", "f32", "q8_0")
POOLING = ("none", "mean", "last", "cls")
# a workload's draft context, as llama-server's --spec-type makes one: "" none (a ``spec`` call then
# drafts as ngram-mod does, from token tables, with no llama.cpp call), "mtp" (draft-mtp: a context
# of type MTP on the same model, running its NextN layer), "model" (draft-simple with -md: a plain
# context on a draft model of its own, ``draft_model``, which decodes what the target decodes)
DRAFTS = ("", "mtp", "model")

# explicit limits, checked by validate(): tiny models, and runs of a few hundred ms
MAX_RPC = 2
MAX_GPU = 2
LLAMA_DEVICES = DeviceLimits.of(rpc=MAX_RPC, gpu=MAX_GPU)  # what a workload may hold, and what the strategies draw by default
# LLAMA_SPLIT_MODE_TENSOR (llama.h 0.3.36 and b11739): with explicit devices llama.cpp wraps them all
# (RPC too) in one meta device that splits each weight between them. Row is left out: it needs the
# device's split buffer type (``ggml_backend_split_buffer_type``, which in 0.3.36's ggml only SYCL's
# and Hexagon's registries have; neither RPC nor the GPU-like device): llama.cpp refuses the model
# ("device ... does not support split buffers")
SPLIT_MODES = ("none", "layer", "tensor")
# architectures llama.cpp has no tensor split for (``llm_arch_supports_sm_tensor``, llama-arch.cpp of
# 0.3.36): loading one with split mode tensor throws "LLAMA_SPLIT_MODE_TENSOR not implemented for
# architecture"; of the tiny models' archs, mamba2 and granitehybrid (llama and glm4moe have it)
NO_TENSOR_SPLIT = frozenset((
    "grok", "mpt", "plamo2", "minicpm3", "gemma3n", "mamba", "mamba2", "jamba", "falcon-h1", "olmo2", "olmoe", "deepseek2", "deepseek32",
    "hy_v4", "dots3note", "glm-dsa", "bitnet", "t5", "nemotron_h", "nemotron_h_moe", "granitehybrid", "minimax-01", "minimax-m2",
    "minimax-m3", "mistral4", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen3tts", "qwen4exp"))
# context parameters some builds' llama_context_params lack (a build's own declarations say which; 0 is
# how a workload leaves one unset): the worker passes one only where the build declares it, a build
# without it refuses a workload that sets it (``Unsupported``), and the strategies draw it only for a
# build that has it (``llama_workloads(absent=...)``). b11739's MoE cache (bytes, 0 = off; 0.3.36 has
# none), the output limits (b10335 has no n_outputs_max_per_seq), the recurrent state's snapshots for
# rollback (n_rs_seq, for the architectures llama.cpp rolls back by them: ``ROLLBACK_KINDS``)
OPTIONAL_PARAMS = ("moe_cache_size", "n_outputs_max", "n_outputs_max_per_seq", "n_rs_seq")
MAX_RS_SEQ = 8  # snapshots per sequence drawn at most (llama-server sets its largest draft)
CPU_DEVICE = -1  # a tensor override's device: the CPU (else an index into the model's devices)
MAX_CALLS = 64
MAX_CTX = 4096
MAX_SEQ = 8


class WorkloadError(ValueError):
    """A workload field out of range; the message names the field."""


@dataclass(frozen=True)
class Devices:
    """Where the model lives (``llama_model_params``): its devices, in the order llama.cpp ranks
    them when it picks them itself (``n_rpc`` ggml RPC servers first, then the GPU-like devices
    ``gpus``; the CPU last), and how the layers and tensors go to them.

    * ``n_gpu_layers``: layers offloaded; more than the model has: all (pipeline parallelism needs it);
    * ``tensor_split``: a share per device; ``()`` = llama.cpp's default (by free memory);
    * ``gpus``: schedfuzz's GPU-like devices (``BackendSpec`` of kind ``gpu``, with ``memory``,
      the free memory llama.cpp sees when it loads the model), registered with ggml's backend
      registry; ``gpu_free``: per GPU-like device, the bytes it has free once the model is
      loaded (``0``: the rest of its memory), as a GPU the weights mostly fill;
    * ``split_mode`` (``none``: only ``main_gpu``; ``tensor``: every weight split between all
      the devices, which llama.cpp wraps in one meta device), ``main_gpu``;
    * ``overrides``: ``tensor_buft_overrides`` (the API of ``-ot``): a tensor-name regex and the
      device whose buffer type holds the matching weights (``CPU_DEVICE`` or a device index).
    """

    n_rpc: int = 1
    n_gpu_layers: int = 99
    tensor_split: tuple[float, ...] = ()
    gpus: tuple[BackendSpec, ...] = ()
    gpu_free: tuple[int, ...] = ()
    split_mode: str = "layer"
    main_gpu: int = 0
    overrides: tuple[tuple[str, int], ...] = ()

    @property
    def n_devices(self) -> int:
        return self.n_rpc + len(self.gpus)

    def device_name(self, i: int) -> str:
        """The device as ggml names its backend: ``RPC0[host:port]``-like for RPC, ``GPU<k>``."""
        return "CPU" if i == CPU_DEVICE else f"RPC{i}" if i < self.n_rpc else f"GPU{i - self.n_rpc}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n_rpc": self.n_rpc, "n_gpu_layers": self.n_gpu_layers}
        if self.tensor_split:
            out["tensor_split"] = list(self.tensor_split)
        if self.gpus:
            out["gpus"] = [g.to_json() for g in self.gpus]
        if self.gpu_free:
            out["gpu_free"] = list(self.gpu_free)
        if self.split_mode != "layer" or self.main_gpu:
            out |= {"split_mode": self.split_mode, "main_gpu": self.main_gpu}
        if self.overrides:
            out["overrides"] = [list(o) for o in self.overrides]
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Devices:
        dv = dict(d)
        dv["tensor_split"] = tuple(float(x) for x in dv.get("tensor_split", ()))
        dv["gpus"] = tuple(BackendSpec.from_json(g) for g in dv.get("gpus", ()))
        dv["gpu_free"] = tuple(int(x) for x in dv.get("gpu_free", ()))
        dv["overrides"] = tuple((str(p), int(i)) for p, i in dv.get("overrides", ()))
        return Devices(**dv)

    def validate(self, need: Any) -> None:
        """Each problem through ``need(ok, message)``, naming the field."""
        need(0 <= self.n_rpc <= MAX_RPC, f"devices.n_rpc {self.n_rpc}: must be 0..{MAX_RPC}")
        need(len(self.gpus) <= MAX_GPU, f"devices.gpus: {len(self.gpus)} GPU-like devices, at most {MAX_GPU}")
        for k, g in enumerate(self.gpus):
            # llama.cpp makes every registered ACCEL device a backend of every context: a shared-buffer one would outlive its workload
            need(g.device.fake_gpu and not g.shared_buft, f"devices.gpus[{k}]: a GPU-like device (kind gpu, no shared_buft), not {g.to_json()}")
        need(0 <= self.n_gpu_layers <= 999, f"devices.n_gpu_layers {self.n_gpu_layers}: must be 0..999")
        need(not self.tensor_split or (len(self.tensor_split) == self.n_devices and all(x >= 0 for x in self.tensor_split) and sum(self.tensor_split) > 0),
             f"devices.tensor_split {list(self.tensor_split)}: one non-negative share per device ({self.n_devices}), not all zero")
        need(not self.gpu_free or (len(self.gpu_free) == len(self.gpus) and all(x >= 0 for x in self.gpu_free)),
             f"devices.gpu_free {list(self.gpu_free)}: one byte count (>= 0) per GPU-like device")
        need(self.split_mode in SPLIT_MODES, f"devices.split_mode {self.split_mode!r}: one of {', '.join(SPLIT_MODES)}")
        need(0 <= self.main_gpu < max(self.n_devices, 1), f"devices.main_gpu {self.main_gpu}: must name one of the {self.n_devices} devices")
        for k, (pattern, dev) in enumerate(self.overrides):
            need(bool(pattern) and CPU_DEVICE <= dev < self.n_devices, f"devices.overrides[{k}] {pattern!r} -> {dev}: a pattern and CPU_DEVICE or a device index")

    def describe(self) -> str:
        gpus = f", {len(self.gpus)} GPU-like" if self.gpus else ""
        return (f"devices: {self.n_rpc} RPC{gpus}, n_gpu_layers {self.n_gpu_layers}"
                + (f", tensor_split {list(self.tensor_split)}" if self.tensor_split else "")
                + (f", split_mode {self.split_mode}" + (f" (main_gpu {self.main_gpu})" if self.split_mode == "none" else "") if self.split_mode != "layer" else "")
                + (", overrides " + ", ".join(f"{p}={self.device_name(d)}" for p, d in self.overrides) if self.overrides else ""))


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
    # b11739's MoE cache (``--moe-cache-mib``): device memory, in bytes, for the routed experts of the
    # layers whose experts are host weights (``-ot exps=CPU``, ``-ncmoe``) while the layer runs on a
    # device; llama.cpp uploads the selected ones through ggml's copy callback (0: no cache)
    moe_cache_size: int = 0
    # recurrent-state snapshots per sequence (llama-server: its largest draft, for MTP and the like):
    # llama_memory_seq_rm of a sequence's last n <= n_rs_seq positions rolls a recurrent state back
    # by one, where the architecture supports it (llm_arch_supports_rs_rollback; elsewhere clamped to 0)
    n_rs_seq: int = 0

    def outputs_max(self) -> int:
        return self.n_outputs_max or self.n_batch

    def outputs_max_per_seq(self) -> int:
        return min(self.n_outputs_max_per_seq or self.outputs_max(), self.outputs_max())


@dataclass(frozen=True)
class DraftModel:
    """The draft's model of its own, as llama-server loads it with ``--spec-draft-devices`` and
    ``-ngld`` (``common_speculative_init_result``, ``common_base_params_to_speculative``): the
    target's file loaded again, on ``devices`` (indices into the target's device list, RPC first;
    ``()``: the target's devices, as llama-server defaults them) with ``n_gpu_layers`` of its
    own, and none of the target's tensor overrides; on one device split mode layer, else the
    target's split mode and shares. The draft context is made on it (``ctx_other`` the target)."""

    devices: tuple[int, ...] = ()
    n_gpu_layers: int = 99
    # the draft context's recurrent-state snapshots (draft "model" on a model that rolls back by them):
    # llama-server gives it none (common_speculative_init_result), a program may give it the target's
    n_rs_seq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "n_gpu_layers": self.n_gpu_layers} | ({"n_rs_seq": self.n_rs_seq} if self.n_rs_seq else {})

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DraftModel:
        return DraftModel(tuple(int(i) for i in d.get("devices", ())), int(d.get("n_gpu_layers", 99)), int(d.get("n_rs_seq", 0)))

    def placement(self, dv: Devices) -> tuple[Devices, tuple[int, ...]]:
        """How the draft model is loaded beside a target on ``dv``: its placement, and which of
        the target's devices (indices, in order) it is given."""
        if not self.devices:
            return replace(dv, n_gpu_layers=self.n_gpu_layers, overrides=()), tuple(range(dv.n_devices))
        one = len(self.devices) == 1
        return (replace(dv, n_gpu_layers=self.n_gpu_layers, overrides=(), tensor_split=(),
                        split_mode="layer" if one else dv.split_mode, main_gpu=0), self.devices)

    def describe(self, dv: Devices) -> str:
        on = ", ".join(dv.device_name(i) for i in self.devices) if self.devices else "the target's devices"
        return f"a draft model of its own on {on}, n_gpu_layers {self.n_gpu_layers}" + (f", n_rs_seq {self.n_rs_seq}" if self.n_rs_seq else "")


@dataclass(frozen=True)
class LlamaWorkload:
    model: ModelSpec
    devices: Devices = Devices()
    ctx: ContextParams = ContextParams()
    calls: tuple[Call, ...] = ()
    loras: tuple[LoraSpec, ...] = ()  # adapters for the model, loaded and attached by the calls
    draft: str = ""  # DRAFTS: the draft context beside the target's
    draft_model: DraftModel | None = None  # the draft context's own model (else the target's)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.to_json(),
            "devices": self.devices.to_json(),
            "ctx": _ctx_json(self.ctx),
            "calls": [_call_json(c) for c in self.calls],
        } | ({"loras": [a.to_json() for a in self.loras]} if self.loras else {}) | ({"draft": self.draft} if self.draft else {}) \
            | ({"draft_model": self.draft_model.to_json()} if self.draft_model else {})

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> LlamaWorkload:
        """Parse and validate; any problem raises ``WorkloadError`` naming the field."""
        try:
            model = ModelSpec.from_json(d["model"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise WorkloadError(f"model: {e}") from None
        try:
            devices = Devices.from_json(d.get("devices", {}))
            ctx = ContextParams(**d.get("ctx", {}))
            calls = tuple(
                Call(**{**c, "parts": tuple(Part(**p) for p in c.get("parts", ()))}) for c in d.get("calls", ())
            )
            loras = tuple(LoraSpec.from_json(a) for a in d.get("loras", ()))
            draft = str(d.get("draft", ""))
            draft_model = DraftModel.from_json(d["draft_model"]) if "draft_model" in d else None
        except (KeyError, TypeError, ValueError, AttributeError, SpecError) as e:
            raise WorkloadError(f"malformed llama workload: {type(e).__name__}: {e}") from None
        w = LlamaWorkload(model, devices, ctx, calls, loras, draft, draft_model)
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

        dv.validate(need)
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
        tensor = dv.split_mode == "tensor"
        if tensor:  # what llama.cpp refuses with LLAMA_SPLIT_MODE_TENSOR (llama_model_load, llama_init_from_model)
            need(dv.n_devices >= 1, "devices.split_mode tensor: needs at least one device to split the weights between")
            need(c.flash_attn != "off", "devices.split_mode tensor: needs flash attention (ctx.flash_attn on or auto): llama.cpp refuses the context")
            need(self.model.arch not in NO_TENSOR_SPLIT, f"devices.split_mode tensor: llama.cpp has none for architecture {self.model.arch!r}")
            need(not c.backend_samplers, "devices.split_mode tensor: no backend samplers (ctx.backend_samplers): llama.cpp samples on the CPU with it")
        need(c.moe_cache_size >= 0, f"ctx.moe_cache_size {c.moe_cache_size}: bytes, >= 0")
        if c.moe_cache_size:  # what llama.cpp's MoE cache throws on (llama_moe_cache::impl): the context is not made
            need(self.model.n_expert > 0, f"ctx.moe_cache_size {c.moe_cache_size}: needs a mixture-of-experts model, not a {self.model.kind} one")
            need(dv.n_devices >= 1, f"ctx.moe_cache_size {c.moe_cache_size}: needs a device of GPU type (RPC or GPU-like) for the cache")
            need(not tensor, f"ctx.moe_cache_size {c.moe_cache_size}: llama.cpp's MoE cache does not support split mode tensor")
        # llama.cpp keeps a sequence's last n_rs_seq + 1 tokens in one ubatch (llama_memory_recurrent::init_batch),
        # and asserts n_ubatch > n_rs_seq + 1 at the first decode (llama_batch_allocr::split_equal); the context takes any
        need(0 <= c.n_rs_seq <= MAX_RS_SEQ and (c.n_rs_seq == 0 or c.n_rs_seq + 1 < c.n_ubatch),
             f"ctx.n_rs_seq {c.n_rs_seq}: 0..{MAX_RS_SEQ}, and n_ubatch {c.n_ubatch} > n_rs_seq + 1 (a sequence's last n_rs_seq + 1 tokens "
             "share a ubatch, and split_equal asserts it)")
        need(len(self.calls) <= MAX_CALLS, f"calls: {len(self.calls)} calls, at most {MAX_CALLS}")
        need(len(self.loras) <= MAX_LORAS, f"loras: {len(self.loras)} adapters, at most {MAX_LORAS}")
        need(self.draft in DRAFTS, f"draft {self.draft!r}: one of {', '.join(map(repr, DRAFTS))}")
        need(self.draft != "mtp" or self.model.kind == "mtp", f"draft 'mtp': the model must have an MTP layer (kind mtp), not {self.model.kind}")
        need(self.draft != "model" or self.draft_model is not None, "draft 'model': needs the draft model's placement (draft_model)")
        if self.draft_model is not None:
            dm = self.draft_model
            need(self.draft in ("mtp", "model"), "draft_model: only for a draft context (draft 'mtp' or 'model')")
            need(dm.n_rs_seq == 0 or (self.draft == "model" and self.model.kind in ROLLBACK_KINDS),
                 f"draft_model.n_rs_seq {dm.n_rs_seq}: only for draft 'model' on a model that rolls back by snapshots")
            need(0 <= dm.n_rs_seq <= c.n_rs_seq, f"draft_model.n_rs_seq {dm.n_rs_seq}: 0..the target's n_rs_seq {c.n_rs_seq} "
                 "(the draft context shares the target's n_ubatch, and drops what the target drops)")
            need(len(set(dm.devices)) == len(dm.devices) and all(0 <= i < dv.n_devices for i in dm.devices),
                 f"draft_model.devices {list(dm.devices)}: distinct indices of the target's {dv.n_devices} devices")
            need(0 <= dm.n_gpu_layers <= 99, f"draft_model.n_gpu_layers {dm.n_gpu_layers}: must be 0..99")
        for k, a in enumerate(self.loras):
            try:
                a.validate(self.model)
            except ValueError as e:
                raise WorkloadError(f"loras[{k}]: {e}") from None
        rs_seq = c.n_rs_seq if self.model.kind in ROLLBACK_KINDS else 0  # llama.cpp clamps it to 0 elsewhere
        if self.draft == "model" and self.draft_model is not None and self.model.kind in RECURRENT_KINDS:
            # the draft context drops the positions the target drops (common_memory): its snapshots bound them too
            rs_seq = min(rs_seq, self.draft_model.n_rs_seq)
        check_calls(self.calls, Checking(c, len(self.loras), self.model.kind, self.model.kind in RECURRENT_KINDS, tensor, need, rs_seq=rs_seq))

    def describe(self) -> str:
        m, c, dv = self.model, self.ctx, self.devices
        return (
            f"model {m.describe()}; {dv.describe()}"
            + f"; ctx: n_ctx {c.n_ctx}, n_batch {c.n_batch}, n_ubatch {c.n_ubatch}, n_seq_max {c.n_seq_max}, "
            f"flash_attn {c.flash_attn}, op_offload {c.op_offload}, kv {c.type_k}/{c.type_v}{' unified' if c.kv_unified else ''}"
            + ("" if c.offload_kqv else " in host memory (offload_kqv off)")
            + (f", embeddings pooling {c.pooling}" if c.embeddings else "")
            + (f", n_outputs_max {c.n_outputs_max}/{c.n_outputs_max_per_seq}" if c.n_outputs_max or c.n_outputs_max_per_seq else "")
            + (f", backend samplers ({c.sampler_chain})" if c.backend_samplers else "")
            + (f", moe_cache_size {c.moe_cache_size}" if c.moe_cache_size else "")
            + ("; loras: " + ", ".join(f"rank {a.rank} on {'/'.join(a.targets)}" for a in self.loras) if self.loras else "")
            + ("; draft: an MTP context on the same model (draft-mtp)" if self.draft == "mtp" and not self.draft_model else "")
            + (f"; draft: an MTP context on {self.draft_model.describe(dv)} (draft-mtp)" if self.draft_model and self.draft == "mtp" else "")
            + (f"; draft: a context on {self.draft_model.describe(dv)} (draft-simple)" if self.draft_model and self.draft == "model" else "")
        )


def _ctx_json(c: ContextParams) -> dict[str, Any]:
    """The context's fields; an optional parameter (``OPTIONAL_PARAMS``) only where it is set, so that
    a workload without it reads as it did before the field existed."""
    return {k: v for k, v in asdict(c).items() if k not in OPTIONAL_PARAMS or v}


def expert_bytes(m: ModelSpec) -> int:
    """The bytes of one routed expert of one layer (its gate, up and down rows, F32 as the tiny
    models are written): the unit of llama.cpp's MoE cache slots."""
    return 3 * m.n_embd * m.n_ff * 4


def all_experts_bytes(m: ModelSpec) -> int:
    """The bytes of every routed expert of every layer: a MoE cache this large holds them all."""
    return m.n_layer * m.n_expert * expert_bytes(m)


def _call_json(c: Call) -> dict[str, Any]:
    """A call without its default fields: corpus files stay readable."""
    d = asdict(c)
    defaults = asdict(Call(c.kind))
    out = {k: v for k, v in d.items() if k == "kind" or v != defaults[k]}
    if "parts" in out:
        out["parts"] = [asdict(p) for p in c.parts]
    return out

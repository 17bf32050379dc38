"""The tiny models llama.cpp runs, as plain data: a ``ModelSpec`` names a model of llama.cpp's
"llama" architecture (dense or Mixtral-style mixture of experts), a pure recurrent Mamba-2
("mamba2"), a hybrid of attention and Mamba-2 layers ("granitehybrid"), the hybrids whose state
llama.cpp rolls back by snapshots (Nemotron-H's "nemotron_h", LFM2's "lfm2") or a GLM-4.5-style
mixture of experts with a multi-token-prediction (NextN) layer ("glm4moe", kind "mtp"), with a self-made
SentencePiece-style vocabulary (``TOKENS``); a ``LoraSpec`` a LoRA adapter for it. The files are
written by ``llama.gguf_models``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

# Part of each file's cache key: bump it whenever the bytes ``write_model`` produces for a spec change.
FORMAT_VERSION = 1

# Every valid spec's weights fit in this many bytes (f32), so that every file stays under ~5 MB.
MAX_WEIGHT_BYTES = 4 * 1024 * 1024

_BOUNDS: dict[str, tuple[int, int]] = {
    "n_layer": (1, 8),
    "n_embd": (16, 256),
    "n_head": (1, 16),
    "n_ff": (16, 512),
    "n_ctx_train": (64, 32768),
}

# The vocabulary: <unk>, <s>, </s>; the 256 byte tokens, which SentencePiece falls back on (and
# where llama.cpp looks up the newline token); then word pieces, "▁" marking a word start.
SPECIALS = ("<unk>", "<s>", "</s>")
LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")
WORD_PIECES = ("▁", *(f"▁{c}" for c in LETTERS), *LETTERS)
TOKENS: tuple[str, ...] = (*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *WORD_PIECES)
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# each kind of model, with the llama.cpp architectures that make it
KIND_ARCHS: dict[str, tuple[str, ...]] = {
    "dense": ("llama",),
    "moe": ("llama",),
    "mamba2": ("mamba2",),  # pure recurrent: Mamba-2 layers only, no attention, no FFN
    "hybrid": ("granitehybrid",),  # GraniteMoeHybrid: attention layers (attn_layers) among Mamba-2 layers, each with an FFN
    # GLM-4.5 (LLM_ARCH_GLM4_MOE): MoE layers with a shared expert, then one NextN (MTP) layer; the
    # smallest architecture that both 0.3.36 and b11739 load with an MTP draft graph (it must be MoE)
    "mtp": ("glm4moe",),
    # Nemotron-H (LLM_ARCH_NEMOTRON_H): Mamba-2, attention and MLP layers, one kind each; its recurrent
    # state rolls back by snapshots (llm_arch_supports_rs_rollback: the context's n_rs_seq)
    "nemotron": ("nemotron_h",),
    # LFM2 (LLM_ARCH_LFM2): attention layers (with q/k norms) among gated short-convolution layers,
    # each with a SwiGLU FFN; its convolution state rolls back by snapshots too, and it has a tensor split
    "lfm2": ("lfm2",),
}
EXPERT_KINDS = ("moe", "mtp")
RECURRENT_KINDS = ("mamba2", "hybrid", "nemotron", "lfm2")
ROLLBACK_KINDS = ("nemotron", "lfm2")  # the recurrent kinds whose architecture llama.cpp rolls back by snapshots (n_rs_seq)
# the kinds whose ``attn_layers`` name their attention layers among recurrent (or MLP) ones
HYBRID_KINDS = ("hybrid", "nemotron", "lfm2")
# a layer's roles that keep a recurrent state (``ModelSpec.layer_role``)
RECURRENT_ROLES = ("mamba2", "shortconv")

# the Mamba-2 sizes (fields of ModelSpec added with the recurrent kinds: to_json leaves them out
# at their defaults, so the JSON, file name and bytes of a dense or moe spec are as before)
_SSM_BOUNDS: dict[str, tuple[int, int]] = {
    "ssm_state": (1, 64),
    "ssm_conv": (2, 8),
    "ssm_groups": (1, 8),
    "ssm_head_dim": (1, 64),
}


@dataclass(frozen=True)
class ModelSpec:
    """A tiny model: ``kind`` "dense" or "moe" (Mixtral style: ``n_expert`` experts per layer,
    ``n_expert_used`` of them routed per token), both of llama.cpp's "llama" architecture;
    "mamba2" (``arch`` "mamba2": Mamba-2 layers only, a recurrent state per sequence and no KV
    cache); or "hybrid" (``arch`` "granitehybrid": the layers ``attn_layers`` are attention layers
    with a KV cache, the others Mamba-2 layers, each followed by a dense SwiGLU FFN).

    Bounds (``validate``): n_layer 1..8, n_embd 16..256, n_head 1..16 dividing n_embd with an even
    head dimension (rope rotates pairs), n_head_kv dividing n_head, n_ff 16..512, n_ctx_train
    64..32768, seed >= 0; dense: n_expert = n_expert_used = 0; moe: n_expert 4..16 and
    n_expert_used 1..n_expert. Together the weights must fit ``MAX_WEIGHT_BYTES`` (4 MiB), so a
    large MoE needs fewer layers or a narrower FFN than the per-field bounds allow.

    The Mamba-2 layers (kinds mamba2 and hybrid) have an inner size ``ssm_inner`` = 2 * n_embd
    (the only expansion llama.cpp's granitehybrid accepts), ``ssm_heads`` = ssm_inner /
    ``ssm_head_dim`` heads in ``ssm_groups`` groups (dividing the heads), a state of
    ``ssm_state`` per head channel and a causal convolution of width ``ssm_conv``: ssm_state
    1..64, ssm_conv 2..8, ssm_groups 1..8, ssm_head_dim 1..64 dividing ssm_inner. Other kinds
    keep them at their defaults. mamba2 has no attention and no FFN: n_head, n_head_kv and n_ff
    are unused there (still checked against their bounds). hybrid: ``attn_layers`` distinct
    layer indices in increasing order, at least one, and at least one recurrent layer left
    (so n_layer >= 2); it is ``()`` for every other kind. Neither recurrent kind has experts.

    nemotron (``arch`` "nemotron_h"): the layers ``attn_layers`` are attention layers (no FFN of
    their own); the others alternate, in order, a Mamba-2 layer and an MLP layer (``n_ff``, ReLU²,
    no gate), as Nemotron-H interleaves them (``layer_role``); at least one attention and one
    Mamba-2 layer. Every layer has only its input norm.

    lfm2 (``arch`` "lfm2"): the layers ``attn_layers`` are attention layers with RMS norms of q
    and k, the others gated short convolutions (``in_proj`` to three chunks B, C, x; a causal
    convolution of width ``ssm_conv``, llama.cpp's ``shortconv.l_cache``; ``out_proj``), every
    layer with a SwiGLU FFN; the Mamba-2 sizes but ``ssm_conv`` keep their defaults.

    mtp: ``n_layer`` MoE layers (experts as moe's, ``n_ff`` each expert's and the one shared
    expert's FFN size, sigmoid routing with a bias), then one NextN layer (``blk.{n_layer}``, a
    full layer of its own plus ``nextn.eh_proj``/``enorm``/``hnorm``/``shared_head_norm``):
    llama.cpp's trunk has ``n_layer`` layers, and a context of type MTP runs the NextN layer.
    """

    arch: str = "llama"
    kind: str = "dense"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    n_expert: int = 0
    n_expert_used: int = 0
    n_ctx_train: int = 4096
    seed: int = 0
    # the recurrent kinds' fields (left out of to_json at their defaults)
    ssm_state: int = 16
    ssm_conv: int = 4
    ssm_groups: int = 1
    ssm_head_dim: int = 16
    attn_layers: tuple[int, ...] = ()

    @property
    def n_vocab(self) -> int:
        """Fixed: every model shares the one built-in vocabulary."""
        return len(TOKENS)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ssm_inner(self) -> int:
        """A Mamba-2 layer's inner size (d_inner): twice the embedding."""
        return 2 * self.n_embd

    @property
    def ssm_heads(self) -> int:
        """A Mamba-2 layer's heads (llama.cpp's ssm_dt_rank)."""
        return self.ssm_inner // self.ssm_head_dim

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the causal convolution: x, B and C."""
        return self.ssm_inner + 2 * self.ssm_groups * self.ssm_state

    @property
    def has_experts(self) -> bool:
        return self.kind in EXPERT_KINDS

    @property
    def n_nextn(self) -> int:
        """NextN (MTP) layers after the trunk's ``n_layer``."""
        return 1 if self.kind == "mtp" else 0

    def layer_role(self, il: int) -> str:
        """What layer ``il`` is: "mamba2", "shortconv" (lfm2's recurrent layers), "attention"
        (with its FFN, but in nemotron), or "mlp" (nemotron's MLP-only layers: the second of each
        pair of its other layers)."""
        if self.kind == "lfm2":
            return "attention" if il in self.attn_layers else "shortconv"
        if self.kind == "mamba2" or (self.kind in HYBRID_KINDS and il not in self.attn_layers):
            if self.kind == "nemotron" and sum(1 for k in range(il) if k not in self.attn_layers) % 2:
                return "mlp"
            return "mamba2"
        return "attention"

    def is_recurrent(self, il: int) -> bool:
        """Whether layer ``il`` keeps a recurrent state (a Mamba-2 or short-convolution layer)."""
        return self.layer_role(il) in RECURRENT_ROLES

    @property
    def n_params(self) -> int:
        """Number of weights (all f32 in the file)."""
        e = self.n_embd
        kv = self.head_dim * self.n_head_kv
        attn = 2 * e + 2 * e * e + 2 * e * kv  # with the attention and FFN norms
        if self.kind == "moe":
            ffn = e * self.n_expert + 3 * e * self.n_ff * self.n_expert
        elif self.kind == "mtp":  # the router and its bias, the experts, the shared expert
            ffn = e * self.n_expert + self.n_expert + 3 * e * self.n_ff * (self.n_expert + 1)
        else:
            ffn = 3 * e * self.n_ff
        d_in_proj = self.ssm_inner + self.ssm_conv_dim + self.ssm_heads
        # norm, in_proj, conv1d weight and bias, dt bias, A, D, grouped norm, out_proj
        ssm = e + e * d_in_proj + (self.ssm_conv + 1) * self.ssm_conv_dim + 3 * self.ssm_heads + self.ssm_inner + self.ssm_inner * e
        if self.kind == "nemotron":  # an input norm each; attention without the FFN norm; MLP of up and down
            roles = {"mamba2": ssm, "attention": attn - e, "mlp": e + 2 * e * self.n_ff}
            per_layer = [roles[self.layer_role(il)] for il in range(self.n_layer)]
        elif self.kind == "lfm2":  # both norms and the FFN each; q/k norms of a head; convolution, in_proj to 3 chunks, out_proj
            roles = {"attention": attn + 2 * self.head_dim + ffn, "shortconv": 2 * e + ffn + self.ssm_conv * e + 4 * e * e}
            per_layer = [roles[self.layer_role(il)] for il in range(self.n_layer)]
        else:
            per_layer = [ssm if self.kind == "mamba2" else ssm + e + ffn if self.is_recurrent(il) else attn + ffn for il in range(self.n_layer)]
        nextn = self.n_nextn * (attn + ffn + 2 * e * e + 3 * e)  # a full layer, eh_proj and its three norms
        return 2 * self.n_vocab * e + e + sum(per_layer) + nextn

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line message naming the first field out of range."""
        for name, value in dataclasses.asdict(self).items():
            want = str if name in ("arch", "kind") else tuple if name == "attn_layers" else int
            if type(value) is not want or (want is tuple and any(type(i) is not int for i in value)):
                raise ValueError(f"{name}: expected {want.__name__}{' of int' if want is tuple else ''}, got {value!r}")
        archs = sorted({a for v in KIND_ARCHS.values() for a in v})
        if self.arch not in archs:
            raise ValueError(f"arch: one of {', '.join(archs)}, got {self.arch!r}")
        if self.kind not in KIND_ARCHS:
            raise ValueError(f"kind: one of {', '.join(KIND_ARCHS)}, got {self.kind!r}")
        if self.arch not in KIND_ARCHS[self.kind]:
            raise ValueError(f"arch: a {self.kind} model is of arch {' or '.join(KIND_ARCHS[self.kind])}, got {self.arch!r}")
        for name, (lo, hi) in _BOUNDS.items():
            if not lo <= getattr(self, name) <= hi:
                raise ValueError(f"{name}: must be in {lo}..{hi}, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head: must divide n_embd={self.n_embd}, got {self.n_head}")
        if self.head_dim % 2:
            raise ValueError(f"n_head: head dimension n_embd/n_head={self.head_dim} must be even for rope")
        if not 1 <= self.n_head_kv <= self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"n_head_kv: must divide n_head={self.n_head}, got {self.n_head_kv}")
        if not self.has_experts:
            if self.n_expert or self.n_expert_used:
                raise ValueError(f"n_expert: {self.kind} means n_expert = n_expert_used = 0, got {self.n_expert}, {self.n_expert_used}")
        else:
            if not 4 <= self.n_expert <= 16:
                raise ValueError(f"n_expert: a {self.kind} model has 4..16 experts, got {self.n_expert}")
            if not 1 <= self.n_expert_used <= self.n_expert:
                raise ValueError(f"n_expert_used: must be in 1..n_expert={self.n_expert}, got {self.n_expert_used}")
        if self.kind in RECURRENT_KINDS:
            for name, (lo, hi) in _SSM_BOUNDS.items():
                if not lo <= getattr(self, name) <= hi:
                    raise ValueError(f"{name}: must be in {lo}..{hi}, got {getattr(self, name)}")
            if self.ssm_inner % self.ssm_head_dim:
                raise ValueError(f"ssm_head_dim: must divide the inner size 2*n_embd={self.ssm_inner}, got {self.ssm_head_dim}")
            if self.ssm_heads % self.ssm_groups:
                raise ValueError(f"ssm_groups: must divide the {self.ssm_heads} heads (ggml's ssm_scan), got {self.ssm_groups}")
            if self.kind == "lfm2":
                for name in set(_SSM_BOUNDS) - {"ssm_conv"}:
                    if getattr(self, name) != _DEFAULTS[name]:
                        raise ValueError(f"{name}: lfm2 has no Mamba-2 layer and keeps {_DEFAULTS[name]}, got {getattr(self, name)}")
        else:
            for name in _SSM_BOUNDS:
                if getattr(self, name) != _DEFAULTS[name]:
                    raise ValueError(f"{name}: only for a recurrent model (kind {' or '.join(RECURRENT_KINDS)}); {self.kind} keeps {_DEFAULTS[name]}, got {getattr(self, name)}")
        if self.kind in HYBRID_KINDS:
            a = self.attn_layers
            if not a or list(a) != sorted(set(a)) or not 0 <= a[0] <= a[-1] < self.n_layer or len(a) == self.n_layer:
                raise ValueError(f"attn_layers: increasing distinct layers of 0..{self.n_layer - 1}, at least one, and not all of them, got {list(a)}")
        elif self.attn_layers:
            raise ValueError(f"attn_layers: only for a hybrid model, got {list(self.attn_layers)}")
        if self.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {self.seed}")
        if 4 * self.n_params > MAX_WEIGHT_BYTES:
            raise ValueError(f"n_params: {self.n_params} f32 weights take over {MAX_WEIGHT_BYTES} bytes")

    def to_json(self) -> dict[str, Any]:
        """Every field of a dense or moe spec as before the recurrent kinds; the recurrent kinds'
        fields only where they differ from their defaults (so old corpus files, file names and
        cache keys stay as they were)."""
        d = dataclasses.asdict(self)
        out = {k: v for k, v in d.items() if k not in _OPTIONAL or v != _DEFAULTS[k]}
        if "attn_layers" in out:
            out["attn_layers"] = list(self.attn_layers)
        return out

    def describe(self) -> str:
        ssm = f"Mamba-2 state {self.ssm_state}, conv {self.ssm_conv}, {self.ssm_heads} heads of {self.ssm_head_dim} in {self.ssm_groups} groups"
        if self.kind == "mamba2":
            return f"{self.kind} {self.arch}: {self.n_layer} layers, n_embd {self.n_embd}, {ssm}"
        experts = f", {self.n_expert} experts top-{self.n_expert_used}" if self.has_experts else ""
        experts += ", a shared expert and an MTP (NextN) layer" if self.kind == "mtp" else ""
        hybrid = f", attention in layers {list(self.attn_layers)}, the others {ssm}" if self.kind == "hybrid" else ""
        if self.kind == "nemotron":
            roles = [self.layer_role(il) for il in range(self.n_layer)]
            hybrid = f", layers {'/'.join({'mamba2': 'M', 'attention': 'A', 'mlp': 'F'}[r] for r in roles)} (Mamba-2, attention, MLP), {ssm}"
        if self.kind == "lfm2":
            hybrid = f", attention in layers {list(self.attn_layers)}, the others short convolutions of width {self.ssm_conv}"
        return f"{self.kind} {self.arch}: {self.n_layer} layers, n_embd {self.n_embd}, heads {self.n_head}/{self.n_head_kv}, n_ff {self.n_ff}{experts}{hybrid}"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelSpec:
        """The inverse of ``to_json``; unknown or missing keys and invalid values raise ``ValueError``
        (the recurrent kinds' fields may be missing: their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not set(d) <= names or not names - _OPTIONAL <= set(d):
            raise ValueError(f"model spec: unknown keys {sorted(set(d) - names)}, missing keys {sorted(names - _OPTIONAL - set(d))}")
        d = dict(d)
        if isinstance(d.get("attn_layers"), list):
            d["attn_layers"] = tuple(d["attn_layers"])
        spec = cls(**d)
        spec.validate()
        return spec

    def file_name(self) -> str:
        """``<arch>-<kind>-<hash>.gguf``: the hash covers the spec (``to_json``) and ``FORMAT_VERSION``."""
        key = json.dumps({"format_version": FORMAT_VERSION, "spec": self.to_json()}, sort_keys=True)
        return f"{self.arch}-{self.kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.gguf"


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
_OPTIONAL = frozenset((*_SSM_BOUNDS, "attn_layers"))

# the weights a LoRA adapter can adapt, by their name in a layer, with their (rows, cols) in numpy
# order (ggml's ne reversed); a dense model's FFN weights only
LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """A tiny LoRA adapter for a ``ModelSpec``: ``rank`` 1..8, the adapted weights ``targets``
    (names in ``LORA_TARGETS``, in every layer), ``alpha`` and a ``seed`` for its values. llama.cpp
    adds 6 graph nodes per adapted weight (``llama_adapter_lora::get_n_nodes``) to the worst case
    of every context of the model while it is loaded."""

    rank: int = 2
    targets: tuple[str, ...] = ("attn_q", "attn_v")
    alpha: float = 4.0
    seed: int = 0

    def validate(self, model: ModelSpec) -> None:
        if model.kind not in ("dense", "moe"):
            raise ValueError(f"lora: adapters only for a llama model (dense or moe), not a {model.kind} model")
        if not 1 <= self.rank <= 8:
            raise ValueError(f"lora rank: must be in 1..8, got {self.rank}")
        bad = [t for t in self.targets if t not in LORA_TARGETS or (model.kind == "moe" and t.startswith("ffn_"))]
        if not self.targets or bad or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"lora targets {list(self.targets)}: distinct names of {', '.join(LORA_TARGETS)} (attention only for a moe model)")
        if self.seed < 0:
            raise ValueError(f"lora seed: must be >= 0, got {self.seed}")

    def n_weights(self, model: ModelSpec) -> int:
        """Adapted weights: what llama.cpp counts its extra nodes by."""
        return len(self.targets) * model.n_layer

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "targets": list(self.targets), "alpha": self.alpha, "seed": self.seed}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LoraSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or set(d) != names:
            raise ValueError(f"lora spec: want the keys {sorted(names)}, got {sorted(d) if isinstance(d, dict) else d!r}")
        return cls(int(d["rank"]), tuple(d["targets"]), float(d["alpha"]), int(d["seed"]))

    def file_name(self, model: ModelSpec) -> str:
        key = json.dumps({"format_version": FORMAT_VERSION, "model": model.to_json(), "lora": self.to_json()}, sort_keys=True)
        return f"lora-{model.arch}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.gguf"

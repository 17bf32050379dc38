"""The tiny models llama.cpp runs, as plain data: a ``ModelSpec`` names a model of llama.cpp's
"llama" architecture, dense or Mixtral-style mixture of experts, with a self-made
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


@dataclass(frozen=True)
class ModelSpec:
    """A tiny model of llama.cpp's "llama" architecture: ``kind`` "dense", or "moe" (Mixtral style:
    ``n_expert`` experts per layer, ``n_expert_used`` of them routed per token).

    Bounds (``validate``): n_layer 1..8, n_embd 16..256, n_head 1..16 dividing n_embd with an even
    head dimension (rope rotates pairs), n_head_kv dividing n_head, n_ff 16..512, n_ctx_train
    64..32768, seed >= 0; dense: n_expert = n_expert_used = 0; moe: n_expert 4..16 and
    n_expert_used 1..n_expert. Together the weights must fit ``MAX_WEIGHT_BYTES`` (4 MiB), so a
    large MoE needs fewer layers or a narrower FFN than the per-field bounds allow.
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

    @property
    def n_vocab(self) -> int:
        """Fixed: every model shares the one built-in vocabulary."""
        return len(TOKENS)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        """Number of weights (all f32 in the file)."""
        kv = self.head_dim * self.n_head_kv
        attn = 2 * self.n_embd + 2 * self.n_embd * self.n_embd + 2 * self.n_embd * kv
        if self.kind == "moe":
            ffn = self.n_embd * self.n_expert + 3 * self.n_embd * self.n_ff * self.n_expert
        else:
            ffn = 3 * self.n_embd * self.n_ff
        return 2 * self.n_vocab * self.n_embd + self.n_embd + self.n_layer * (attn + ffn)

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line message naming the first field out of range."""
        for name, value in dataclasses.asdict(self).items():
            want = str if name in ("arch", "kind") else int
            if type(value) is not want:
                raise ValueError(f"{name}: expected {want.__name__}, got {value!r}")
        if self.arch != "llama":
            raise ValueError(f"arch: only 'llama' is supported, got {self.arch!r}")
        if self.kind not in ("dense", "moe"):
            raise ValueError(f"kind: must be 'dense' or 'moe', got {self.kind!r}")
        for name, (lo, hi) in _BOUNDS.items():
            if not lo <= getattr(self, name) <= hi:
                raise ValueError(f"{name}: must be in {lo}..{hi}, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head: must divide n_embd={self.n_embd}, got {self.n_head}")
        if self.head_dim % 2:
            raise ValueError(f"n_head: head dimension n_embd/n_head={self.head_dim} must be even for rope")
        if not 1 <= self.n_head_kv <= self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"n_head_kv: must divide n_head={self.n_head}, got {self.n_head_kv}")
        if self.kind == "dense":
            if self.n_expert or self.n_expert_used:
                raise ValueError(f"n_expert: dense means n_expert = n_expert_used = 0, got {self.n_expert}, {self.n_expert_used}")
        else:
            if not 4 <= self.n_expert <= 16:
                raise ValueError(f"n_expert: a moe model has 4..16 experts, got {self.n_expert}")
            if not 1 <= self.n_expert_used <= self.n_expert:
                raise ValueError(f"n_expert_used: must be in 1..n_expert={self.n_expert}, got {self.n_expert_used}")
        if self.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {self.seed}")
        if 4 * self.n_params > MAX_WEIGHT_BYTES:
            raise ValueError(f"n_params: {self.n_params} f32 weights take over {MAX_WEIGHT_BYTES} bytes")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        experts = f", {self.n_expert} experts top-{self.n_expert_used}" if self.kind == "moe" else ""
        return f"{self.kind} {self.arch}: {self.n_layer} layers, n_embd {self.n_embd}, heads {self.n_head}/{self.n_head_kv}, n_ff {self.n_ff}{experts}"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelSpec:
        """The inverse of ``to_json``; unknown or missing keys and invalid values raise ``ValueError``."""
        names = {f.name for f in dataclasses.fields(cls)}
        if set(d) != names:
            raise ValueError(f"model spec: unknown keys {sorted(set(d) - names)}, missing keys {sorted(names - set(d))}")
        spec = cls(**d)
        spec.validate()
        return spec

    def file_name(self) -> str:
        """``llama-<kind>-<hash>.gguf``: the hash covers the spec and ``FORMAT_VERSION``."""
        key = json.dumps({"format_version": FORMAT_VERSION, "spec": self.to_json()}, sort_keys=True)
        return f"{self.arch}-{self.kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.gguf"


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

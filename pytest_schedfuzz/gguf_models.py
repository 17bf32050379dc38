"""Tiny random-weight GGUF models that llama.cpp loads and runs, for driving its scheduler end to end.

A ``ModelSpec`` names a model of llama.cpp's "llama" architecture, dense or Mixtral-style
mixture of experts; ``write_model`` writes it with the ``gguf`` package's own writer, with
deterministic weights and a self-made SentencePiece-style vocabulary, into a content-addressed
cache (one file per spec, written atomically so that pytest-xdist workers can share the cache).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .files import atomic_write

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
_SPECIALS = ("<unk>", "<s>", "</s>")
_LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")
_WORD_PIECES = ("▁", *(f"▁{c}" for c in _LETTERS), *_LETTERS)
TOKENS: tuple[str, ...] = (*_SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *_WORD_PIECES)
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


def write_model(spec: ModelSpec, cache_dir: Path) -> Path:
    """The GGUF file of ``spec`` under ``cache_dir``, written only if it is not there yet.

    Written to a temporary file in the same directory, then renamed into place, so concurrent
    writers and readers never see a partial file; the same spec always gives the same bytes.
    """
    spec.validate()
    cache_dir = Path(cache_dir)
    target = cache_dir / spec.file_name()
    if target.exists():
        return target
    return atomic_write(target, lambda tmp: _write_gguf(spec, tmp))


def _write_gguf(spec: ModelSpec, path: Path) -> None:
    w = gguf.GGUFWriter(path, spec.arch)
    w.add_name(f"schedfuzz tiny {spec.kind}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(spec.head_dim)  # llama.cpp's "llama" loader requires n_rot == head dim
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if spec.kind == "moe":
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)

    w.add_tokenizer_model("llama")
    w.add_token_list(list(TOKENS))
    w.add_token_scores([0.0] * (len(TOKENS) - len(_WORD_PIECES)) + [-float(i) for i in range(len(_WORD_PIECES))])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(_WORD_PIECES)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)

    # numpy shapes are ggml's ne reversed: ne {n_embd, n_vocab} is shape (n_vocab, n_embd)
    rng = np.random.default_rng(spec.seed)

    def weight(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    def norm() -> np.ndarray:
        return np.ones(spec.n_embd, dtype=np.float32)

    e, kv, ff, x = spec.n_embd, spec.head_dim * spec.n_head_kv, spec.n_ff, spec.n_expert
    w.add_tensor("token_embd.weight", weight(spec.n_vocab, e))
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm())
        w.add_tensor(p + "attn_q.weight", weight(e, e))
        w.add_tensor(p + "attn_k.weight", weight(kv, e))
        w.add_tensor(p + "attn_v.weight", weight(kv, e))
        w.add_tensor(p + "attn_output.weight", weight(e, e))
        w.add_tensor(p + "ffn_norm.weight", norm())
        if spec.kind == "moe":
            w.add_tensor(p + "ffn_gate_inp.weight", weight(x, e))
            w.add_tensor(p + "ffn_gate_exps.weight", weight(x, ff, e))
            w.add_tensor(p + "ffn_up_exps.weight", weight(x, ff, e))
            w.add_tensor(p + "ffn_down_exps.weight", weight(x, e, ff))
        else:
            w.add_tensor(p + "ffn_gate.weight", weight(ff, e))
            w.add_tensor(p + "ffn_up.weight", weight(ff, e))
            w.add_tensor(p + "ffn_down.weight", weight(e, ff))
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", weight(spec.n_vocab, e))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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


def _weight_shape(model: ModelSpec, name: str) -> tuple[int, int]:
    """(rows, cols) in numpy order of layer weight ``name`` in ``_write_gguf``."""
    e, kv, ff = model.n_embd, model.head_dim * model.n_head_kv, model.n_ff
    return {"attn_q": (e, e), "attn_k": (kv, e), "attn_v": (kv, e), "attn_output": (e, e),
            "ffn_gate": (ff, e), "ffn_up": (ff, e), "ffn_down": (e, ff)}[name]


def write_lora(model: ModelSpec, lora: LoraSpec, cache_dir: Path) -> Path:
    """The GGUF adapter file of ``lora`` for ``model`` under ``cache_dir`` (as ``write_model``:
    atomic, written once, the same bytes for the same specs). Its tensors are llama.cpp's
    convention: ``blk.N.W.weight.lora_a`` with ne {cols, rank} and ``.lora_b`` with ne {rank, rows}."""
    model.validate()
    lora.validate(model)
    target = Path(cache_dir) / lora.file_name(model)
    if target.exists():
        return target

    def write(path: Path) -> None:
        w = gguf.GGUFWriter(path, model.arch)
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, lora.alpha)
        rng = np.random.default_rng(lora.seed)
        for il in range(model.n_layer):
            for t in lora.targets:
                rows, cols = _weight_shape(model, t)
                name = f"blk.{il}.{t}.weight"
                w.add_tensor(name + ".lora_a", rng.standard_normal((lora.rank, cols), dtype=np.float32) * np.float32(0.02))
                w.add_tensor(name + ".lora_b", rng.standard_normal((rows, lora.rank), dtype=np.float32) * np.float32(0.02))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return atomic_write(target, write)

"""Tiny GGUF models: specs round-trip and reject bad fields by name; files are deterministic,
cached, atomic and small; llama.cpp loads a dense and a MoE model and decodes with them."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gguf
import pytest

from pytest_schedfuzz.llama.gguf_models import write_model
from pytest_schedfuzz.model.llama_model import BOS_ID, MAX_WEIGHT_BYTES, TOKENS, ModelSpec

DENSE = ModelSpec()
MOE = ModelSpec(kind="moe", n_expert=4, n_expert_used=2)
# near MAX_WEIGHT_BYTES: the largest files a valid spec makes
LARGE_DENSE = ModelSpec(n_layer=8, n_embd=128, n_head=8, n_head_kv=2, n_ff=176, seed=7)
LARGE_MOE = ModelSpec(kind="moe", n_layer=2, n_embd=128, n_head=8, n_head_kv=4, n_ff=64, n_expert=16, n_expert_used=2, seed=9)


@pytest.mark.parametrize("spec", [DENSE, MOE, LARGE_DENSE, LARGE_MOE])
def test_json_round_trip(spec: ModelSpec):
    spec.validate()
    d = json.loads(json.dumps(spec.to_json()))
    assert d == spec.to_json() and ModelSpec.from_json(d) == spec


def test_from_json_rejects_unknown_and_missing_keys():
    with pytest.raises(ValueError, match=r"unknown keys \['n_rot'\], missing keys \['seed'\]"):
        ModelSpec.from_json({k: v for k, v in DENSE.to_json().items() if k != "seed"} | {"n_rot": 16})
    with pytest.raises(ValueError, match="^n_layer:"):
        ModelSpec.from_json(DENSE.to_json() | {"n_layer": 0})


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"arch": "mixtral"}, "arch"),
        ({"kind": "sparse"}, "kind"),
        ({"n_layer": 0}, "n_layer"),
        ({"n_layer": 9}, "n_layer"),
        ({"n_layer": True}, "n_layer"),
        ({"n_embd": 8}, "n_embd"),
        ({"n_embd": 512}, "n_embd"),
        ({"n_embd": 96, "n_head": 5}, "n_head"),  # does not divide n_embd
        ({"n_embd": 96, "n_head": 32}, "n_head"),  # above 16
        ({"n_embd": 24, "n_head": 8}, "n_head"),  # head dim 3: odd, no rope
        ({"n_head_kv": 3}, "n_head_kv"),
        ({"n_head_kv": 8}, "n_head_kv"),
        ({"n_ff": 8}, "n_ff"),
        ({"n_ff": 1024}, "n_ff"),
        ({"n_ctx_train": 16}, "n_ctx_train"),
        ({"seed": -1}, "seed"),
        ({"n_expert": 4}, "n_expert"),  # dense with experts
        ({"kind": "moe", "n_expert": 2, "n_expert_used": 2}, "n_expert"),
        ({"kind": "moe", "n_expert": 32, "n_expert_used": 2}, "n_expert"),
        ({"kind": "moe", "n_expert": 4, "n_expert_used": 0}, "n_expert_used"),
        ({"kind": "moe", "n_expert": 4, "n_expert_used": 5}, "n_expert_used"),
        ({"n_layer": 8, "n_embd": 256, "n_head": 8, "n_ff": 512}, "n_params"),  # each field in bounds, too large together
    ],
)
def test_validate_names_the_field(changes: dict[str, Any], field: str):
    spec = dataclasses.replace(DENSE, **changes)
    with pytest.raises(ValueError, match=rf"^{field}: ") as e:
        spec.validate()
    assert "\n" not in str(e.value)


def test_write_model_rejects_an_invalid_spec(tmp_path: Path):
    with pytest.raises(ValueError, match="^n_layer:"):
        write_model(dataclasses.replace(DENSE, n_layer=0), tmp_path)
    assert not list(tmp_path.iterdir())


def test_deterministic_and_keyed_by_content(tmp_path: Path):
    a, b = write_model(MOE, tmp_path / "a"), write_model(MOE, tmp_path / "b")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()
    other = write_model(dataclasses.replace(MOE, seed=1), tmp_path / "a")
    assert other.name != a.name and other.read_bytes() != a.read_bytes()


def test_cached_file_is_not_rewritten(tmp_path: Path):
    path = write_model(DENSE, tmp_path)
    before = path.stat()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))  # so that a rewrite would show
    stamp = path.stat().st_mtime_ns
    assert write_model(DENSE, tmp_path) == path
    assert path.stat().st_mtime_ns == stamp and path.stat().st_ino == before.st_ino


def test_concurrent_writers_leave_one_whole_file(tmp_path: Path):
    with ThreadPoolExecutor(4) as pool:
        paths = set(pool.map(lambda _: write_model(LARGE_MOE, tmp_path), range(4)))
    assert len(paths) == 1 and [p.name for p in tmp_path.iterdir()] == [LARGE_MOE.file_name()]
    assert len(gguf.GGUFReader(paths.pop()).tensors) == 3 + 2 * 10


@pytest.mark.parametrize("spec", [LARGE_DENSE, LARGE_MOE])
def test_largest_files_stay_small(tmp_path: Path, spec: ModelSpec):
    assert 4 * spec.n_params > 0.85 * MAX_WEIGHT_BYTES
    assert write_model(spec, tmp_path).stat().st_size < 5_000_000


def test_tensor_layout(tmp_path: Path):
    """ggml's ne order (the reverse of numpy's) and the names llama.cpp's "llama" loader asks for."""
    r = gguf.GGUFReader(write_model(MOE, tmp_path))
    shapes = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    e, ff, x, v, kv = MOE.n_embd, MOE.n_ff, MOE.n_expert, MOE.n_vocab, MOE.head_dim * MOE.n_head_kv
    assert shapes["token_embd.weight"] == shapes["output.weight"] == [e, v]
    assert shapes["blk.1.attn_k.weight"] == [e, kv]
    assert shapes["blk.1.ffn_gate_inp.weight"] == [e, x]
    assert shapes["blk.1.ffn_gate_exps.weight"] == shapes["blk.1.ffn_up_exps.weight"] == [e, ff, x]
    assert shapes["blk.1.ffn_down_exps.weight"] == [ff, e, x]
    assert sum(math.prod(s) for s in shapes.values()) == MOE.n_params
    assert r.fields["llama.expert_count"].contents() == 4 and r.fields["llama.expert_used_count"].contents() == 2
    assert r.fields["tokenizer.ggml.tokens"].contents() == list(TOKENS)


# Run in a child process, so that an abort in llama.cpp fails the test instead of killing pytest.
# Prints one JSON line: what the test checks.
LOAD_AND_DECODE = r"""
import ctypes, json, math, sys
import llama_cpp.llama_cpp as L

warnings, last = [], 0
@L.llama_log_callback
def on_log(level, text, user):
    global last
    last = last if level == 5 else level  # 5: GGML_LOG_LEVEL_CONT continues the previous line
    if last in (3, 4):  # WARN, ERROR
        warnings.append(text.decode(errors="replace"))
L.llama_log_set(on_log, None)
L.llama_backend_init()

mp = L.llama_model_default_params()
mp.n_gpu_layers = 0
model = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
assert model, "llama_model_load_from_file failed"
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 32, 32, 2, 2
ctx = L.llama_init_from_model(model, cp)
assert ctx, "llama_init_from_model failed"
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
meta = ctypes.create_string_buffer(64)
n_meta = L.llama_model_meta_val_str(model, b"llama.expert_count", meta, 64)

toks = (L.llama_token * 32)()
n = L.llama_tokenize(vocab, b"a b\nz", 5, toks, 32, True, False)
prompt = list(toks[:max(n, 0)])

def decode(ids, pos0):
    b = L.llama_batch_init(len(ids), 0, 1)
    b.n_tokens = len(ids)
    for i, t in enumerate(ids):
        b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
        b.seq_id[i][0] = 0
        b.logits[i] = i == len(ids) - 1
    rc = L.llama_decode(ctx, b)
    L.llama_batch_free(b)
    row = L.llama_get_logits_ith(ctx, -1) if rc == 0 else None
    return rc, [row[i] for i in range(n_vocab)] if row else []

rc1, logits1 = decode(prompt, 0)
rc2, logits2 = decode([max(range(n_vocab), key=logits1.__getitem__)] if logits1 else [0], len(prompt))
print(json.dumps({
    "n_vocab": n_vocab, "n_params": L.llama_model_n_params(model), "nl": L.llama_vocab_nl(vocab),
    "expert_count": meta.value.decode() if n_meta >= 0 else None, "prompt": prompt,
    "rc": [rc1, rc2], "logits": [logits1, logits2], "warnings": warnings,
}))
L.llama_free(ctx)
L.llama_model_free(model)
L.llama_backend_free()
"""


@pytest.mark.engine
@pytest.mark.parametrize("spec", [DENSE, MOE, LARGE_DENSE, LARGE_MOE], ids=["dense", "moe", "large-dense", "large-moe"])
def test_llama_cpp_loads_and_decodes(tmp_path: Path, spec: ModelSpec):
    path = write_model(spec, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_AND_DECODE, str(path)], capture_output=True, text=True, timeout=120,
        env=os.environ | {"GGML_NO_BACKTRACE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["warnings"] == []  # nothing missing or mistyped in the file
    assert out["n_vocab"] == spec.n_vocab and out["n_params"] == spec.n_params
    assert out["expert_count"] == (str(spec.n_expert) if spec.kind == "moe" else None)
    # SentencePiece with BOS, word pieces and the newline byte token
    assert out["nl"] == TOKENS.index("<0x0A>")
    assert out["prompt"] == [BOS_ID, TOKENS.index("▁a"), TOKENS.index("▁b"), out["nl"], TOKENS.index("z")]
    assert out["rc"] == [0, 0]
    for logits in out["logits"]:
        assert len(logits) == spec.n_vocab and all(map(math.isfinite, logits)) and max(logits) > min(logits)

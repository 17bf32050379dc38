"""Tiny GGUF models: specs round-trip and reject bad fields by name; files are deterministic,
cached, atomic and small; llama.cpp loads a dense, a MoE, a Mamba-2 and a hybrid (granitehybrid)
model and decodes with them; the dense and MoE files are the bytes and names they were before the
recurrent kinds came."""

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

from pytest_schedfuzz.llama.gguf_models import write_lora, write_model
from pytest_schedfuzz.model.llama_model import BOS_ID, MAX_WEIGHT_BYTES, TOKENS, LoraSpec, ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part, WorkloadError

DENSE = ModelSpec()
MOE = ModelSpec(kind="moe", n_expert=4, n_expert_used=2)
# near MAX_WEIGHT_BYTES: the largest files a valid spec makes
LARGE_DENSE = ModelSpec(n_layer=8, n_embd=128, n_head=8, n_head_kv=2, n_ff=176, seed=7)
LARGE_MOE = ModelSpec(kind="moe", n_layer=2, n_embd=128, n_head=8, n_head_kv=4, n_ff=64, n_expert=16, n_expert_used=2, seed=9)
# the recurrent kinds: pure Mamba-2, and attention in layer 1 of 3 among Mamba-2 layers
MAMBA2 = ModelSpec(arch="mamba2", kind="mamba2")
HYBRID = ModelSpec(arch="granitehybrid", kind="hybrid", n_layer=3, attn_layers=(1,))
LARGE_MAMBA2 = ModelSpec(arch="mamba2", kind="mamba2", n_layer=8, n_embd=128, ssm_state=32, ssm_groups=2, ssm_head_dim=32, seed=5)
LARGE_HYBRID = ModelSpec(arch="granitehybrid", kind="hybrid", n_layer=6, n_embd=128, n_head=8, n_head_kv=2, n_ff=144, ssm_groups=2, ssm_head_dim=32,
                         attn_layers=(2, 5), seed=11)
# GLM-4.5 style: two MoE layers with a shared expert, then the MTP (NextN) layer
MTP = ModelSpec(arch="glm4moe", kind="mtp", n_ff=32, n_expert=4, n_expert_used=2)
# Nemotron-H: Mamba-2, MLP, attention, Mamba-2 (the architecture llama.cpp rolls back by snapshots)
NEMOTRON = ModelSpec(arch="nemotron_h", kind="nemotron", n_layer=4, attn_layers=(2,))
LARGE_NEMOTRON = ModelSpec(arch="nemotron_h", kind="nemotron", n_layer=8, n_embd=128, n_head=8, n_head_kv=2, n_ff=256, ssm_groups=2,
                           ssm_head_dim=32, attn_layers=(3, 7), seed=13)
# LFM2: short convolution, attention, short convolution (its state rolls back by snapshots too)
LFM2 = ModelSpec(arch="lfm2", kind="lfm2", n_layer=3, attn_layers=(1,), ssm_conv=3)
LARGE_LFM2 = ModelSpec(arch="lfm2", kind="lfm2", n_layer=6, n_embd=128, n_head=8, n_head_kv=2, n_ff=256, attn_layers=(2, 4, 5), ssm_conv=4, seed=17)
ALL = [DENSE, MOE, LARGE_DENSE, LARGE_MOE, MAMBA2, HYBRID, LARGE_MAMBA2, LARGE_HYBRID, MTP, NEMOTRON, LARGE_NEMOTRON, LFM2, LARGE_LFM2]
IDS = ["dense", "moe", "large-dense", "large-moe", "mamba2", "hybrid", "large-mamba2", "large-hybrid", "mtp", "nemotron", "large-nemotron",
       "lfm2", "large-lfm2"]

# computed before the recurrent kinds were added: their fields must not change a dense or moe
# spec's JSON, file name (cache key) or bytes (else FORMAT_VERSION must be bumped)
PINNED_NAMES = {
    "dense": ("llama-dense-a9ffb5ae47a384a1.gguf", "c24dec598716d218"),
    "moe": ("llama-moe-14098c523be5da51.gguf", "1bb659e4be968b77"),
    "large-dense": ("llama-dense-ed8d7ae79c0d9d52.gguf", "101dcc4021feee68"),
}
PINNED_LORA = ("lora-llama-db7899759365f2d7.gguf", "9c84f7a0410b7041")  # LoraSpec() on DENSE


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_json_round_trip(spec: ModelSpec):
    spec.validate()
    d = json.loads(json.dumps(spec.to_json()))
    assert d == spec.to_json() and ModelSpec.from_json(d) == spec


def test_dense_and_moe_names_and_bytes_are_unchanged(tmp_path: Path):
    """The recurrent kinds' fields stay out of a dense or moe spec's JSON: its file name, bytes and
    the LoRA adapter's are those written before they existed."""
    import hashlib

    for spec, name in [(DENSE, "dense"), (MOE, "moe"), (LARGE_DENSE, "large-dense")]:
        assert list(spec.to_json()) == ["arch", "kind", "n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_expert", "n_expert_used", "n_ctx_train", "seed"]
        path = write_model(spec, tmp_path)
        assert (path.name, hashlib.sha256(path.read_bytes()).hexdigest()[:16]) == PINNED_NAMES[name]
    lora = write_lora(DENSE, LoraSpec(), tmp_path)
    assert (lora.name, hashlib.sha256(lora.read_bytes()).hexdigest()[:16]) == PINNED_LORA


def test_corpus_models_read_back_as_written():
    """Every llama workload in the corpus (written before the recurrent kinds) parses, and its
    model serializes to the same JSON: the same cache key and file."""
    corpus = Path(__file__).resolve().parents[2] / "corpus"
    models = [json.loads(f.read_text())["llama"]["model"] for f in sorted(corpus.glob("*.json")) if "llama" in json.loads(f.read_text())]
    assert models
    for d in models:
        assert ModelSpec.from_json(d).to_json() == d


def test_recurrent_fields_are_optional_in_json():
    d = HYBRID.to_json()
    assert d["attn_layers"] == [1] and not {"ssm_state", "ssm_conv", "ssm_groups", "ssm_head_dim"} & set(d)
    assert LARGE_MAMBA2.to_json()["ssm_state"] == 32 and "attn_layers" not in LARGE_MAMBA2.to_json()
    assert ModelSpec.from_json(MAMBA2.to_json() | {"ssm_state": 16}) == MAMBA2  # a default may also be spelled out
    assert MAMBA2.file_name().startswith("mamba2-mamba2-") and HYBRID.file_name().startswith("granitehybrid-hybrid-")
    assert len({s.file_name() for s in ALL}) == len(ALL)


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
        ({"kind": "mamba2"}, "arch"),  # a mamba2 model is of arch mamba2
        ({"arch": "mamba2"}, "arch"),  # and a dense one of arch llama
        ({"ssm_state": 32}, "ssm_state"),  # the Mamba-2 sizes only for the recurrent kinds
        ({"attn_layers": (0,)}, "attn_layers"),
    ],
)
def test_validate_names_the_field(changes: dict[str, Any], field: str):
    spec = dataclasses.replace(DENSE, **changes)
    with pytest.raises(ValueError, match=rf"^{field}: ") as e:
        spec.validate()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "base, changes, field",
    [
        (MAMBA2, {"n_expert": 4, "n_expert_used": 2}, "n_expert"),
        (MAMBA2, {"ssm_state": 0}, "ssm_state"),
        (MAMBA2, {"ssm_state": 65}, "ssm_state"),
        (MAMBA2, {"ssm_conv": 1}, "ssm_conv"),
        (MAMBA2, {"ssm_groups": 0}, "ssm_groups"),
        (MAMBA2, {"ssm_groups": 3}, "ssm_groups"),  # does not divide the 8 heads
        (MAMBA2, {"ssm_head_dim": 48}, "ssm_head_dim"),  # does not divide the inner size 128
        (MAMBA2, {"ssm_head_dim": True}, "ssm_head_dim"),
        (MAMBA2, {"attn_layers": (1,)}, "attn_layers"),  # attention layers only in a hybrid
        (MAMBA2, {"n_layer": 8, "n_embd": 256}, "n_params"),
        (HYBRID, {"attn_layers": ()}, "attn_layers"),  # at least one attention layer
        (HYBRID, {"attn_layers": (0, 1, 2)}, "attn_layers"),  # and at least one recurrent layer
        (HYBRID, {"attn_layers": (3,)}, "attn_layers"),  # out of range
        (HYBRID, {"attn_layers": (2, 1)}, "attn_layers"),  # not increasing
        (HYBRID, {"attn_layers": (1, 1)}, "attn_layers"),
        (HYBRID, {"attn_layers": [1]}, "attn_layers"),  # a tuple (from_json converts a list)
        (HYBRID, {"arch": "llama"}, "arch"),
        (HYBRID, {"n_head_kv": 3}, "n_head_kv"),  # the attention layers' bounds as for dense
        (HYBRID, {"n_expert": 4, "n_expert_used": 2}, "n_expert"),
    ],
)
def test_validate_names_the_recurrent_field(base: ModelSpec, changes: dict[str, Any], field: str):
    spec = dataclasses.replace(base, **changes)
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


def test_lora_adapters_are_for_llama_models_only():
    """The adapters' targets are the llama layer weights: a Mamba-2 layer has none of them."""
    for spec in (MAMBA2, HYBRID):
        with pytest.raises(ValueError, match="^lora: adapters only for a llama model"):
            LoraSpec().validate(spec)


@pytest.mark.parametrize("spec", [LARGE_DENSE, LARGE_MOE, LARGE_MAMBA2, LARGE_HYBRID])
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


def _layout(path: Path) -> tuple[dict[str, list[int]], gguf.GGUFReader]:
    r = gguf.GGUFReader(path)
    return {t.name: [int(n) for n in t.shape] for t in r.tensors}, r


def test_mamba2_tensor_layout(tmp_path: Path):
    """The names, ggml shapes and keys of ``llama_model_mamba2::load_arch_tensors``/``load_arch_hparams``
    (src/models/mamba2.cpp): no attention, no FFN, no head counts."""
    spec = dataclasses.replace(MAMBA2, ssm_groups=2, ssm_state=8)
    shapes, r = _layout(write_model(spec, tmp_path))
    e, inner, heads, conv_dim = spec.n_embd, 2 * spec.n_embd, 2 * spec.n_embd // 16, 2 * spec.n_embd + 2 * 2 * 8
    assert shapes["blk.1.ssm_in.weight"] == [e, inner + conv_dim + heads]
    assert shapes["blk.1.ssm_conv1d.weight"] == [4, conv_dim] and shapes["blk.1.ssm_conv1d.bias"] == [conv_dim]
    assert shapes["blk.1.ssm_dt.bias"] == [heads] and shapes["blk.1.ssm_a"] == shapes["blk.1.ssm_d"] == [1, heads]
    assert shapes["blk.1.ssm_norm.weight"] == [inner // 2, 2] and shapes["blk.1.ssm_out.weight"] == [inner, e]
    assert sorted(n for n in shapes if n.startswith("blk.0.")) == sorted(f"blk.0.{n}" for n in (
        "attn_norm.weight", "ssm_in.weight", "ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias", "ssm_a", "ssm_d", "ssm_norm.weight", "ssm_out.weight"))
    assert sum(math.prod(s) for s in shapes.values()) == spec.n_params
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("mamba2.")}
    assert f == {"mamba2.context_length": 4096, "mamba2.embedding_length": e, "mamba2.block_count": 2, "mamba2.attention.layer_norm_rms_epsilon": pytest.approx(1e-5),
                 "mamba2.ssm.conv_kernel": 4, "mamba2.ssm.inner_size": inner, "mamba2.ssm.state_size": 8, "mamba2.ssm.time_step_rank": heads, "mamba2.ssm.group_count": 2}
    # values that keep the scan finite: A < 0, softplus(dt bias) a small step
    t = {x.name: x.data for x in r.tensors}
    assert (t["blk.0.ssm_a"] < 0).all() and (t["blk.0.ssm_d"] == 1).all()
    step = [math.log1p(math.exp(float(b))) for b in t["blk.0.ssm_dt.bias"]]
    assert all(1e-3 <= s <= 0.1 + 1e-6 for s in step)


def test_hybrid_tensor_layout(tmp_path: Path):
    """granitehybrid (src/models/granite-hybrid.cpp): head_count_kv per layer, 0 marking a
    Mamba-2 layer; attention layers as llama's; an FFN after every layer."""
    spec = dataclasses.replace(HYBRID, n_layer=4, attn_layers=(0, 3))
    shapes, r = _layout(write_model(spec, tmp_path))
    assert r.fields["granitehybrid.attention.head_count_kv"].contents() == [2, 0, 0, 2]
    assert r.fields["granitehybrid.attention.head_count"].contents() == 4
    for il in range(4):
        assert (f"blk.{il}.attn_q.weight" in shapes) == (il in (0, 3)) != (f"blk.{il}.ssm_in.weight" in shapes)
        assert shapes[f"blk.{il}.ffn_down.weight"] == [spec.n_ff, spec.n_embd]
    assert shapes["blk.3.attn_k.weight"] == [spec.n_embd, spec.head_dim * spec.n_head_kv]
    assert sum(math.prod(s) for s in shapes.values()) == spec.n_params


def test_nemotron_h_tensor_layout(tmp_path: Path):
    """nemotron_h (src/models/nemotron-h.cpp): head_count_kv and feed_forward_length per layer,
    both 0 marking a Mamba-2 layer; attention layers without an FFN, MLP layers of up and down
    alone, every layer with its input norm only; layer_norm_epsilon required."""
    spec = dataclasses.replace(NEMOTRON, n_layer=5, attn_layers=(1,))
    assert [spec.layer_role(il) for il in range(5)] == ["mamba2", "attention", "mlp", "mamba2", "mlp"]
    shapes, r = _layout(write_model(spec, tmp_path))
    assert r.fields["nemotron_h.attention.head_count_kv"].contents() == [0, 2, 0, 0, 0]
    assert r.fields["nemotron_h.feed_forward_length"].contents() == [0, 0, spec.n_ff, 0, spec.n_ff]
    assert r.fields["nemotron_h.attention.layer_norm_epsilon"].contents() == pytest.approx(1e-5)
    for il, role in enumerate(spec.layer_role(i) for i in range(5)):
        layer = sorted(n.split(".", 2)[2] for n in shapes if n.startswith(f"blk.{il}."))
        assert ("ssm_in.weight" in layer) == (role == "mamba2") and ("attn_q.weight" in layer) == (role == "attention")
        assert ("ffn_up.weight" in layer) == (role == "mlp") and "ffn_norm.weight" not in layer and "ffn_gate.weight" not in layer
    assert shapes["blk.2.ffn_down.weight"] == [spec.n_ff, spec.n_embd] and shapes["blk.2.ffn_up.weight"] == [spec.n_embd, spec.n_ff]
    assert sum(math.prod(s) for s in shapes.values()) == spec.n_params


def test_lfm2_tensor_layout(tmp_path: Path):
    """lfm2 (src/models/lfm2.cpp): head_count_kv per layer, 0 marking a short convolution (in_proj
    to three chunks, kernels {l_cache, n_embd}, out_proj); attention with q/k norms of a head's
    width; an FFN and both norms in every layer; shortconv.l_cache and no Mamba-2 keys; the final
    norm named token_embd_norm."""
    spec = dataclasses.replace(LFM2, n_layer=4, attn_layers=(1, 3), ssm_conv=2)
    assert [spec.layer_role(il) for il in range(4)] == ["shortconv", "attention", "shortconv", "attention"]
    assert [spec.is_recurrent(il) for il in range(4)] == [True, False, True, False]
    shapes, r = _layout(write_model(spec, tmp_path))
    e = spec.n_embd
    assert r.fields["lfm2.attention.head_count_kv"].contents() == [0, 2, 0, 2]
    assert r.fields["lfm2.shortconv.l_cache"].contents() == 2
    assert not any(k.startswith("lfm2.ssm.") for k in r.fields)
    for il in range(4):
        layer = {n.split(".", 2)[2] for n in shapes if n.startswith(f"blk.{il}.")}
        assert {"attn_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"} <= layer
        assert ("shortconv.conv.weight" in layer) == spec.is_recurrent(il) != ("attn_q_norm.weight" in layer)
    assert shapes["blk.0.shortconv.in_proj.weight"] == [e, 3 * e] and shapes["blk.0.shortconv.conv.weight"] == [2, e]
    assert shapes["blk.1.attn_k_norm.weight"] == [spec.head_dim] and "token_embd_norm.weight" in shapes and "output_norm.weight" not in shapes
    assert sum(math.prod(s) for s in shapes.values()) == spec.n_params


def test_lfm2_keeps_the_mamba2_sizes_at_their_defaults() -> None:
    with pytest.raises(ValueError, match="ssm_state: lfm2 has no Mamba-2 layer"):
        dataclasses.replace(LFM2, ssm_state=32).validate()
    with pytest.raises(ValueError, match="attn_layers"):
        dataclasses.replace(LFM2, attn_layers=(0, 1, 2)).validate()


def test_mtp_tensor_layout(tmp_path: Path):
    """glm4moe (src/models/glm4-moe.cpp): block_count counts the NextN layer, the last block;
    every layer has a router bias and a shared expert; the NextN layer its projection of
    [embedding; hidden state] and the norms llama.cpp requires."""
    shapes, r = _layout(write_model(MTP, tmp_path))
    assert r.fields["glm4moe.block_count"].contents() == 3 and r.fields["glm4moe.nextn_predict_layers"].contents() == 1
    assert r.fields["glm4moe.expert_shared_count"].contents() == 1
    for il in range(3):
        assert shapes[f"blk.{il}.exp_probs_b.bias"] == [MTP.n_expert] and shapes[f"blk.{il}.ffn_up_shexp.weight"] == [MTP.n_embd, MTP.n_ff]
        assert (f"blk.{il}.nextn.eh_proj.weight" in shapes) == (il == 2)
    assert shapes["blk.2.nextn.eh_proj.weight"] == [2 * MTP.n_embd, MTP.n_embd]
    assert sum(math.prod(s) for s in shapes.values()) == MTP.n_params


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
mp.load_mtp = sys.argv[2] == "mtp"  # else llama.cpp skips the NextN layer's tensors, and says so
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
@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_llama_cpp_loads_and_decodes(tmp_path: Path, spec: ModelSpec):
    path = write_model(spec, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_AND_DECODE, str(path), spec.kind], check=False, capture_output=True, text=True, timeout=120,
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


@pytest.fixture(scope="module")
def target():
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    t = LlamaTarget()
    yield t
    t.close()


def decode(*parts: tuple[int, int, str]) -> Call:
    return Call("decode", tuple(Part(s, n, o) for s, n, o in parts))


# what a server does with a recurrent model, all of which llama.cpp 0.3.36 allows there: prompts
# in chunks, continuous batching of 3 slots (uneven parts: equal splits), a slot copied to another
# (emptied first), one kept, a slot reused from scratch, the context cleared
SERVER_LIKE = (
    decode((0, 40, "none")), decode((0, 9, "last")), decode((0, 1, "last"), (1, 13, "last")),
    decode((0, 1, "last"), (1, 1, "last"), (2, 5, "all")),
    Call("seq_rm", seq=2, n_drop=-1), Call("seq_cp", seq=0, dst=2), decode((0, 1, "last"), (2, 1, "last")),
    Call("seq_rm", seq=1, n_drop=-1), decode((1, 6, "last"), (2, 1, "last")),
    Call("seq_keep", seq=1), decode((1, 1, "last")), Call("clear"), decode((0, 3, "last")),
)


@pytest.mark.engine
@pytest.mark.parametrize("spec", [MAMBA2, HYBRID, LARGE_MAMBA2, LARGE_HYBRID, NEMOTRON, LARGE_NEMOTRON, LFM2, LARGE_LFM2],
                         ids=["mamba2", "hybrid", "large-mamba2", "large-hybrid", "nemotron", "large-nemotron", "lfm2", "large-lfm2"])
@pytest.mark.parametrize("devices", [Devices(n_rpc=1), Devices(n_rpc=0, n_gpu_layers=0)], ids=["rpc", "cpu"])
def test_recurrent_models_decode_server_traffic(target, spec: ModelSpec, devices: Devices) -> None:
    """Through the worker: every call returns 0, on an RPC device and on the CPU, with 3 sequences."""
    w = LlamaWorkload(spec, devices, ContextParams(n_seq_max=3), SERVER_LIKE)
    trace = target.run(w, logits=True)
    assert trace.abort is None
    assert [(c.kind, c.rc) for c in trace.calls] == [("init", 0)] + [(c.kind, 0) for c in SERVER_LIKE]
    rows = [r for c in trace.calls for r in c.logits]
    assert rows and all(len(r) == spec.n_vocab and all(map(math.isfinite, r)) and max(r) > min(r) for r in rows)


@pytest.mark.engine
def test_recurrent_memory_cannot_drop_the_last_tokens(target) -> None:
    """llama.cpp 0.3.36 (src/llama-memory-recurrent.cpp, seq_rm): a recurrent state cannot lose its
    last tokens (unless the context keeps rollback snapshots, n_rs_seq, which neither mamba2 nor
    granitehybrid supports): ``seq_rm`` of the last n < all positions (a rejected draft) returns
    false, and so does a context shift whose discarded range reaches the end. Measured once: the
    worker's rc 1 for both, the state left as it was. Such calls are documented failures, so a
    workload on a recurrent model may not hold them (its draft is a checkpoint and a restore); a
    dense model's KV cache does both."""
    calls = (decode((0, 6, "last")), decode((0, 4, "all")), Call("seq_rm", seq=0, n_drop=3), decode((0, 1, "last")),
             Call("shift", seq=0, n_keep=2, n_discard=16), Call("shift", seq=0, n_keep=2, n_discard=3), decode((0, 1, "last")), Call("seq_rm", seq=0, n_drop=99))
    trace = target.run(LlamaWorkload(DENSE, Devices(), ContextParams(), calls))
    assert trace.abort is None and [c.rc for c in trace.calls[1:]] == [0] * len(calls)
    for spec in (MAMBA2, HYBRID):
        with pytest.raises(WorkloadError, match="cannot drop its last positions"):
            LlamaWorkload(spec, Devices(), ContextParams(), calls).validate()
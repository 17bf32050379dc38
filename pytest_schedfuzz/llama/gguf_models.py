"""GGUF files of the tiny models (``model.llama_model``: llama dense and MoE, mamba2,
granitehybrid, nemotron_h, lfm2, glm4moe with an MTP layer), written with the ``gguf`` package's own writer: deterministic weights, the self-made vocabulary, into a content-addressed cache (one file
per spec, written atomically so that pytest-xdist workers can share the cache), and LoRA
adapters for them."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from ..files import atomic_write
from ..model.llama_model import BOS_ID, EOS_ID, RECURRENT_KINDS, TOKENS, UNK_ID, WORD_PIECES, LoraSpec, ModelSpec


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
    """The file llama.cpp 0.3.36 loads for ``spec``: its keys and tensors as the arch's loader
    asks for them (``src/models/<arch>.cpp``: ``load_arch_hparams``, ``load_arch_tensors``), no
    more (llama.cpp refuses a file with tensors it did not ask for)."""
    w = gguf.GGUFWriter(path, spec.arch)
    w.add_name(f"schedfuzz tiny {spec.kind}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer + spec.n_nextn)  # the NextN layers are the last blocks
    if spec.kind == "nemotron":
        # nemotron-h.cpp: a layer is recurrent iff its head_count_kv and feed_forward_length are 0; an
        # attention layer has head_count_kv, an MLP layer feed_forward_length; layer norms use f_norm_eps
        roles = [spec.layer_role(il) for il in range(spec.n_layer)]
        w.add_feed_forward_length([spec.n_ff if r == "mlp" else 0 for r in roles])
        w.add_head_count(spec.n_head)
        w.add_head_count_kv([spec.n_head_kv if r == "attention" else 0 for r in roles])
        w.add_layer_norm_eps(1e-5)
    elif spec.kind == "lfm2":
        # lfm2.cpp: a layer is a short convolution iff its head_count_kv is 0; the convolution's width
        # is shortconv.l_cache (its state keeps l_cache - 1 columns); no Mamba-2 keys
        w.add_feed_forward_length(spec.n_ff)
        w.add_head_count(spec.n_head)
        w.add_head_count_kv([0 if spec.is_recurrent(il) else spec.n_head_kv for il in range(spec.n_layer)])
        w.add_shortconv_l_cache(spec.ssm_conv)
        w.add_rope_freq_base(10000.0)
    elif spec.kind != "mamba2":  # mamba2 has neither FFN nor attention: no feed_forward_length, head_count
        w.add_feed_forward_length(spec.n_ff)
        w.add_head_count(spec.n_head)
        if spec.kind == "hybrid":
            # granitehybrid: a layer is recurrent iff its head_count_kv is 0
            w.add_head_count_kv([0 if spec.is_recurrent(il) else spec.n_head_kv for il in range(spec.n_layer)])
        else:
            w.add_head_count_kv(spec.n_head_kv)
        w.add_rope_dimension_count(spec.head_dim)  # llama.cpp's "llama" loader requires n_rot == head dim
        w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if spec.has_experts:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
    if spec.kind == "mtp":  # glm4-moe.cpp's load_arch_hparams requires the three
        w.add_expert_feed_forward_length(spec.n_ff)
        w.add_expert_shared_count(1)
        w.add_nextn_predict_layers(spec.n_nextn)
    if spec.kind in RECURRENT_KINDS and spec.kind != "lfm2":
        w.add_ssm_conv_kernel(spec.ssm_conv)
        w.add_ssm_inner_size(spec.ssm_inner)
        w.add_ssm_state_size(spec.ssm_state)
        w.add_ssm_time_step_rank(spec.ssm_heads)
        w.add_ssm_group_count(spec.ssm_groups)

    w.add_tokenizer_model("llama")
    w.add_token_list(list(TOKENS))
    w.add_token_scores([0.0] * (len(TOKENS) - len(WORD_PIECES)) + [-float(i) for i in range(len(WORD_PIECES))])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(WORD_PIECES)
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
    for il in range(spec.n_layer + spec.n_nextn):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm())
        if spec.kind == "mtp":
            _add_glm4moe_layer(w, spec, p, weight, norm, nextn=il >= spec.n_layer)
            continue
        if spec.kind == "nemotron":
            _add_nemotron_h_layer(w, spec, p, weight, rng, spec.layer_role(il))
            continue
        if spec.kind == "lfm2":
            _add_lfm2_mixer(w, spec, p, weight, spec.layer_role(il))
        elif spec.is_recurrent(il):
            _add_mamba2_mixer(w, spec, p, weight, rng)
            if spec.kind == "mamba2":
                continue  # the residual adds the mixer's output: no FFN
        else:
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
    # LFM2's final norm is named token_embd_norm (LLM_TENSOR_OUTPUT_NORM_LFM2)
    w.add_tensor("token_embd_norm.weight" if spec.kind == "lfm2" else "output_norm.weight", norm())
    w.add_tensor("output.weight", weight(spec.n_vocab, e))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_glm4moe_layer(w: gguf.GGUFWriter, spec: ModelSpec, p: str, weight, norm, nextn: bool) -> None:
    """A GLM-4.5 layer after its ``attn_norm`` (``llama_model_glm4_moe::load_arch_tensors``):
    attention, the post-attention norm, the router with its expert bias, the routed experts and
    the shared one; a NextN layer adds the projection of [embedding; hidden state] and its norms
    (the MTP head's own embedding and output fall back on ``token_embd`` and ``output``)."""
    e, kv, ff, x = spec.n_embd, spec.head_dim * spec.n_head_kv, spec.n_ff, spec.n_expert
    w.add_tensor(p + "attn_q.weight", weight(e, e))
    w.add_tensor(p + "attn_k.weight", weight(kv, e))
    w.add_tensor(p + "attn_v.weight", weight(kv, e))
    w.add_tensor(p + "attn_output.weight", weight(e, e))
    w.add_tensor(p + "post_attention_norm.weight", norm())
    w.add_tensor(p + "ffn_gate_inp.weight", weight(x, e))
    w.add_tensor(p + "exp_probs_b.bias", np.zeros(x, dtype=np.float32))
    w.add_tensor(p + "ffn_gate_exps.weight", weight(x, ff, e))
    w.add_tensor(p + "ffn_up_exps.weight", weight(x, ff, e))
    w.add_tensor(p + "ffn_down_exps.weight", weight(x, e, ff))
    w.add_tensor(p + "ffn_gate_shexp.weight", weight(ff, e))
    w.add_tensor(p + "ffn_up_shexp.weight", weight(ff, e))
    w.add_tensor(p + "ffn_down_shexp.weight", weight(e, ff))
    if nextn:
        w.add_tensor(p + "nextn.eh_proj.weight", weight(e, 2 * e))
        for name in ("enorm", "hnorm", "shared_head_norm"):
            w.add_tensor(p + f"nextn.{name}.weight", norm())


def _add_lfm2_mixer(w: gguf.GGUFWriter, spec: ModelSpec, p: str, weight, role: str) -> None:
    """An LFM2 layer's mixer after its ``attn_norm`` (``llama_model_lfm2::load_arch_tensors``):
    attention with RMS norms of q and k (a head's width each), or a gated short convolution:
    ``in_proj`` to the chunks B, C and x, the kernels ``conv`` ({l_cache, n_embd}), ``out_proj``."""
    e, kv = spec.n_embd, spec.head_dim * spec.n_head_kv
    if role == "attention":
        w.add_tensor(p + "attn_q.weight", weight(e, e))
        w.add_tensor(p + "attn_k.weight", weight(kv, e))
        w.add_tensor(p + "attn_v.weight", weight(kv, e))
        w.add_tensor(p + "attn_output.weight", weight(e, e))
        w.add_tensor(p + "attn_q_norm.weight", np.ones(spec.head_dim, dtype=np.float32))
        w.add_tensor(p + "attn_k_norm.weight", np.ones(spec.head_dim, dtype=np.float32))
    else:
        w.add_tensor(p + "shortconv.in_proj.weight", weight(3 * e, e))
        w.add_tensor(p + "shortconv.conv.weight", weight(e, spec.ssm_conv) * np.float32(10))  # ne {l_cache, n_embd}
        w.add_tensor(p + "shortconv.out_proj.weight", weight(e, e))


def _add_nemotron_h_layer(w: gguf.GGUFWriter, spec: ModelSpec, p: str, weight, rng: np.random.Generator, role: str) -> None:
    """A Nemotron-H layer after its ``attn_norm`` (``llama_model_nemotron_h::load_arch_tensors``):
    a Mamba-2 mixer, attention without an FFN, or an MLP of ``ffn_up`` and ``ffn_down`` alone."""
    e, kv, ff = spec.n_embd, spec.head_dim * spec.n_head_kv, spec.n_ff
    if role == "mamba2":
        _add_mamba2_mixer(w, spec, p, weight, rng)
    elif role == "attention":
        w.add_tensor(p + "attn_q.weight", weight(e, e))
        w.add_tensor(p + "attn_k.weight", weight(kv, e))
        w.add_tensor(p + "attn_v.weight", weight(kv, e))
        w.add_tensor(p + "attn_output.weight", weight(e, e))
    else:
        w.add_tensor(p + "ffn_up.weight", weight(ff, e))
        w.add_tensor(p + "ffn_down.weight", weight(e, ff))


def _add_mamba2_mixer(w: gguf.GGUFWriter, spec: ModelSpec, p: str, weight, rng: np.random.Generator) -> None:
    """A Mamba-2 mixer's tensors (``llama_model_mamba2::load_arch_tensors``), with values as a
    trained model has them, so that the state stays finite: A = -exp(A_log) (the converter
    stores A itself) in -1..-16, dt's bias the inverse softplus of a step in 0.001..0.1, D = 1,
    the grouped RMS norm's weight 1."""
    e, inner, conv_dim, heads = spec.n_embd, spec.ssm_inner, spec.ssm_conv_dim, spec.ssm_heads
    d_in_proj = inner + conv_dim + heads  # z, then x B C, then dt
    w.add_tensor(p + "ssm_in.weight", weight(d_in_proj, e))
    w.add_tensor(p + "ssm_conv1d.weight", weight(conv_dim, spec.ssm_conv) * np.float32(10))  # ne {d_conv, conv_dim}
    w.add_tensor(p + "ssm_conv1d.bias", np.zeros(conv_dim, dtype=np.float32))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), heads))
    w.add_tensor(p + "ssm_dt.bias", (dt + np.log(-np.expm1(-dt))).astype(np.float32))
    w.add_tensor(p + "ssm_a", (-rng.uniform(1.0, 16.0, (heads, 1))).astype(np.float32))  # ne {1, n_head}
    w.add_tensor(p + "ssm_d", np.ones((heads, 1), dtype=np.float32))
    w.add_tensor(p + "ssm_norm.weight", np.ones((spec.ssm_groups, inner // spec.ssm_groups), dtype=np.float32))  # ne {inner/groups, groups}
    w.add_tensor(p + "ssm_out.weight", weight(e, inner))


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

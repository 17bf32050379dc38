"""Llama-like graph families, built as llama.cpp's ``llm_build_*`` functions build them.

Each function returns a ``GraphSpec``: token embedding on the CPU, a stack of layers whose
weights live on the device chosen per layer (like ``--tensor-split`` and ``-ot``), a KV cache
per layer on the layer's device (written with ``set_rows``, read through views), attention
with or without flash attention, a dense or mixture-of-experts FFN, and the output head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..model.graph_spec import GraphBuilder, GraphSpec


@dataclass(frozen=True)
class ModelShape:
    """The hyper-parameters that fix a graph's topology, and the per-layer devices."""

    layer_devices: tuple[int, ...]
    output_device: int
    cpu_device: int  # the layout's last backend: llama.cpp keeps the token embedding there
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    n_vocab: int = 128
    kv_size: int = 256
    flash_attn: bool = False
    n_expert: int = 0  # 0: dense FFN
    n_expert_used: int = 2
    weight_type: str = "f32"
    ffn_devices: tuple[int, ...] = field(default=())  # -ot style override of FFN weights per layer
    # elementwise ops per layer after attention, standing in for the norms, gates and
    # activations of larger architectures (they scale a graph's node count, not its splits)
    extra_ops: int = 0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self, n_backends: int) -> None:
        """A ``ValueError`` naming the first field out of range for a layout of ``n_backends``."""
        for name in ("n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab", "kv_size"):
            if not 1 <= getattr(self, name) <= 1 << 16:
                raise ValueError(f"model.{name} = {getattr(self, name)}: must be in 1 .. 65536")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"model: n_embd {self.n_embd}, n_head {self.n_head}, n_head_kv {self.n_head_kv}: n_head must divide n_embd and n_head_kv n_head")
        if not self.layer_devices or len(self.layer_devices) > 256:
            raise ValueError(f"model.layer_devices: {len(self.layer_devices)} layers, must be 1 .. 256")
        for name, devices in (("layer_devices", self.layer_devices), ("ffn_devices", self.ffn_devices),
                              ("output_device", (self.output_device,)), ("cpu_device", (self.cpu_device,))):
            bad = [d for d in devices if not 0 <= d < n_backends]
            if bad:
                raise ValueError(f"model.{name}: device {bad[0]} is not in the layout ({n_backends} backends)")
        if self.n_expert and not 1 <= self.n_expert_used <= self.n_expert:
            raise ValueError(f"model: n_expert_used {self.n_expert_used} must be in 1 .. n_expert {self.n_expert}")
        if self.weight_type not in ("f32", "f16", "q8_0") or not 0 <= self.extra_ops <= 1000:
            raise ValueError(f"model: weight_type {self.weight_type!r} or extra_ops {self.extra_ops} out of range")

    @property
    def n_layer(self) -> int:
        return len(self.layer_devices)


@lru_cache(maxsize=256)
def llama_graph(m: ModelShape, n_tokens: int, n_kv: int, n_outputs: int | None = None, label: str = "") -> GraphSpec:
    """One ubatch of ``n_tokens`` attending to ``n_kv`` cache cells, with ``n_outputs`` logits rows.

    Built once per arguments (the last 256): a spec is immutable, and what is derived from it
    (geometry, validity, the reference's graph) is kept with it; Hypothesis's mutations draw the
    same graphs again (41% of the calls of a ci ``matches-reference`` run).

    The node order is the one ``llm_build_llama`` produces: per layer the K/V stores are expanded
    first, then attention, then the FFN; the logits tensor is the last root.
    """
    n_outputs = n_tokens if n_outputs is None else n_outputs
    if not 0 < n_outputs <= n_tokens or not 0 < n_tokens <= n_kv <= m.kv_size:
        raise ValueError(f"need 0 < n_outputs <= n_tokens <= n_kv <= kv_size, got {n_outputs}, {n_tokens}, {n_kv}, {m.kv_size}")
    b = GraphBuilder()
    wt = m.weight_type
    tok_embd = b.weight("token_embd", (m.n_embd, m.n_vocab), device=m.cpu_device, type=wt)
    inp_tokens = b.input("inp_tokens", (n_tokens,), "i32")
    inp_pos = b.input("inp_pos", (n_tokens,), "i32")
    kv_idxs = b.input("inp_kv_idxs", (n_tokens,), "i64")
    mask = b.input("kq_mask", (n_kv, n_tokens), "f16" if m.flash_attn else "f32")
    roots: list[str] = []
    x = b.op("get_rows", tok_embd, inp_tokens, name="inp_embd")

    for il, dev in enumerate(m.layer_devices):
        x = _attention(b, m, il, dev, x, (inp_pos, kv_idxs, mask), n_tokens, n_kv, roots)
        x = _ffn(b, m, il, m.ffn_devices[il] if m.ffn_devices else dev, x, n_tokens)

    if n_outputs < n_tokens:
        out_ids = b.input("inp_out_ids", (n_outputs,), "i32")
        x = b.op("get_rows", x, out_ids, name="result_embd_sel")
    out_norm = b.weight("output_norm", (m.n_embd,), m.output_device)
    output = b.weight("output", (m.n_embd, m.n_vocab), m.output_device, wt)
    x = b.op("rms_norm", x, name="norm", eps=1e-6)
    x = b.op("mul", x, out_norm, name="result_norm")
    logits = b.op("mul_mat", output, x, name="result_output", output=True)
    return b.build(*roots, logits, label=label or f"llama(T={n_tokens}, kv={n_kv}, out={n_outputs})")


def _attention(b: GraphBuilder, m: ModelShape, il: int, dev: int, x: str, inputs: tuple[str, str, str], n_tokens: int, n_kv: int,
               roots: list[str]) -> str:
    """``build_attn`` of layer ``il`` on ``dev``: its weights, the K/V stores (appended to
    ``roots``, expanded first as llama.cpp does), attention over ``n_kv`` cells, the residual."""
    inp_pos, kv_idxs, mask = inputs
    hd, nh, nkv, wt = m.head_dim, m.n_head, m.n_head_kv, m.weight_type
    p = f"blk.{il}."
    attn_norm = b.weight(p + "attn_norm", (m.n_embd,), dev)
    wq = b.weight(p + "attn_q", (m.n_embd, m.n_embd), dev, wt)
    wk = b.weight(p + "attn_k", (m.n_embd, hd * nkv), dev, wt)
    wv = b.weight(p + "attn_v", (m.n_embd, hd * nkv), dev, wt)
    wo = b.weight(p + "attn_output", (m.n_embd, m.n_embd), dev, wt)
    cache_k = b.cache(f"cache_k_l{il}", (hd * nkv, m.kv_size), dev)
    cache_v = b.cache(f"cache_v_l{il}", (hd * nkv, m.kv_size), dev)

    h = b.op("rms_norm", x, name=f"norm-{il}", eps=1e-6)
    h = b.op("mul", h, attn_norm, name=f"attn_norm-{il}")
    q = b.op("mul_mat", wq, h, name=f"Qcur-{il}")
    q = b.op("reshape", q, name=f"Qcur-{il} (reshaped)", ne=[hd, nh, n_tokens])
    q = b.op("rope", q, inp_pos, None, name=f"Qcur-{il} (rope)", n_dims=hd)
    k = b.op("mul_mat", wk, h, name=f"Kcur-{il}")
    k = b.op("reshape", k, name=f"Kcur-{il} (reshaped)", ne=[hd, nkv, n_tokens])
    k = b.op("rope", k, inp_pos, None, name=f"Kcur-{il} (rope)", n_dims=hd)
    v = b.op("mul_mat", wv, h, name=f"Vcur-{il}")
    k2 = b.op("reshape", k, name=f"Kcur-{il} (2d)", ne=[hd * nkv, n_tokens])
    roots.append(b.op("set_rows", cache_k, k2, kv_idxs, name=f"k_store-{il}"))
    roots.append(b.op("set_rows", cache_v, v, kv_idxs, name=f"v_store-{il}"))

    row = hd * nkv * 4
    kview = b.op("view", cache_k, name=f"k-{il}", ne=[hd, nkv, n_kv], nb=[hd * 4, row])
    kp = b.op("permute", kview, name=f"k-{il} (permuted)", axes=[0, 2, 1, 3])
    qp = b.op("permute", q, name=f"q-{il} (permuted)", axes=[0, 2, 1, 3])
    vview = b.op("view", cache_v, name=f"v-{il}", ne=[hd, nkv, n_kv], nb=[hd * 4, row])
    if m.flash_attn:
        vp = b.op("permute", vview, name=f"v-{il} (permuted)", axes=[0, 2, 1, 3])
        att = b.op("flash_attn_ext", qp, kp, vp, mask, name=f"fattn-{il}", scale=hd**-0.5)
        cur = b.op("reshape", att, name=f"kqv_out-{il}", ne=[m.n_embd, n_tokens])
    else:
        kq = b.op("mul_mat", kp, qp, name=f"kq-{il}")
        kq = b.op("soft_max_ext", kq, mask, name=f"kq_soft_max-{il}", scale=hd**-0.5)
        vt = b.op("permute", vview, name=f"v-{il} (transposed)", axes=[1, 2, 0, 3])
        vt = b.op("cont", vt, name=f"v-{il} (cont)")
        kqv = b.op("mul_mat", vt, kq, name=f"kqv-{il}")
        kqv = b.op("permute", kqv, name=f"kqv-{il} (merged)", axes=[0, 2, 1, 3])
        kqv = b.op("cont", kqv, name=f"kqv-{il} (cont)")
        cur = b.op("reshape", kqv, name=f"kqv_out-{il}", ne=[m.n_embd, n_tokens])
    cur = b.op("mul_mat", wo, cur, name=f"attn_out-{il}")
    for e in range(m.extra_ops):
        cur = b.op("scale", cur, name=f"attn_extra_{e}-{il}", scale=1.0)
    return b.op("add", cur, x, name=f"ffn_inp-{il}")


def _ffn(b: GraphBuilder, m: ModelShape, il: int, dev: int, x: str, n_tokens: int) -> str:
    """``build_ffn`` (or ``build_moe_ffn``) of layer ``il`` on ``dev``, and the residual."""
    p, wt = f"blk.{il}.", m.weight_type
    ffn_norm = b.weight(p + "ffn_norm", (m.n_embd,), dev)
    h = b.op("rms_norm", x, name=f"ffn_norm_raw-{il}", eps=1e-6)
    h = b.op("mul", h, ffn_norm, name=f"ffn_norm-{il}")
    if m.n_expert:
        cur = _moe(b, m, il, dev, h, n_tokens)
    else:
        gate = b.weight(p + "ffn_gate", (m.n_embd, m.n_ff), dev, wt)
        up = b.weight(p + "ffn_up", (m.n_embd, m.n_ff), dev, wt)
        down = b.weight(p + "ffn_down", (m.n_ff, m.n_embd), dev, wt)
        g = b.op("mul_mat", gate, h, name=f"ffn_gate-{il}")
        g = b.op("silu", g, name=f"ffn_silu-{il}")
        u = b.op("mul_mat", up, h, name=f"ffn_up-{il}")
        g = b.op("mul", g, u, name=f"ffn_gate_par-{il}")
        cur = b.op("mul_mat", down, g, name=f"ffn_out-{il}")
    return b.op("add", cur, x, name=f"l_out-{il}")


def _moe(b: GraphBuilder, m: ModelShape, il: int, dev: int, h: str, n_tokens: int) -> str:
    """``build_moe_ffn``: routed experts through ``mul_mat_id``, summed over the used experts."""
    p = f"blk.{il}."
    k = m.n_expert_used
    # the router's choice (argsort/top-k in llama.cpp) is one input shared by all layers here:
    # one input per layer would make every deep MoE graph hit ggml's 30-graph-inputs limit
    ids = b.by_name("inp_expert_ids") or b.input("inp_expert_ids", (k, n_tokens), "i32")
    up_e = b.weight(p + "ffn_up_exps", (m.n_embd, m.n_ff, m.n_expert), dev, m.weight_type)
    gate_e = b.weight(p + "ffn_gate_exps", (m.n_embd, m.n_ff, m.n_expert), dev, m.weight_type)
    down_e = b.weight(p + "ffn_down_exps", (m.n_ff, m.n_embd, m.n_expert), dev, m.weight_type)
    hs = b.op("reshape", h, name=f"ffn_moe_in-{il}", ne=[m.n_embd, 1, n_tokens])
    up = b.op("mul_mat_id", up_e, hs, ids, name=f"ffn_moe_up-{il}")
    gate = b.op("mul_mat_id", gate_e, hs, ids, name=f"ffn_moe_gate-{il}")
    gate = b.op("silu", gate, name=f"ffn_moe_silu-{il}")
    par = b.op("mul", gate, up, name=f"ffn_moe_par-{il}")
    down = b.op("mul_mat_id", down_e, par, ids, name=f"ffn_moe_down-{il}")
    row = m.n_embd * 4
    out = None
    for e in range(k):
        view = b.op("view", down, name=f"ffn_moe_view_{e}-{il}", ne=[m.n_embd, n_tokens], nb=[row * k], offset=row * e)
        out = view if out is None else b.op("add", out, view, name=f"ffn_moe_out_{e}-{il}")
    assert out is not None
    return out

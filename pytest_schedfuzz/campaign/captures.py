"""The captured llama.cpp graphs the graph properties fuzz on (``strategies.captured_graphs``): one
small workload per model family and size of ubatch and KV cache, run once per session on
llama.cpp with capture, each giving a scenario whose graphs are llama.cpp's own (a full ubatch,
a partial one, single-token decodes, the reservation's worst case, the flash-attention probe)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..cases.capture import CAPTURED_LABEL, CaptureError, capture
from ..engine import TargetError
from ..model.llama_model import ModelSpec
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import CPU_DEVICE, Call, ContextParams, Devices, LlamaWorkload, Part
from ..model.scenario import Scenario

if TYPE_CHECKING:
    from .engines import Engines
    from .stats import Stats

_SSM = {"ssm_state": 16, "ssm_conv": 4, "ssm_groups": 1, "ssm_head_dim": 16}
MODELS: dict[str, ModelSpec] = {
    "dense": ModelSpec(n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64),
    "moe": ModelSpec(kind="moe", n_layer=1, n_embd=16, n_head=1, n_head_kv=1, n_ff=16, n_expert=4, n_expert_used=2),
    "mamba2": ModelSpec(arch="mamba2", kind="mamba2", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, **_SSM),  # type: ignore[arg-type]
    "hybrid": ModelSpec(arch="granitehybrid", kind="hybrid", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, attn_layers=(1,),
                        **_SSM),  # type: ignore[arg-type]
}
# the pool's two sizes of ubatch and KV cache: a unified cache for n_ctx 128 (256 cells: llama.cpp
# pads it) in ubatches of 8, and 512 cells per sequence in ubatches of 16
CONTEXTS = (
    ContextParams(n_ctx=128, n_batch=16, n_ubatch=8, n_seq_max=2, kv_unified=True),
    ContextParams(n_ctx=1024, n_batch=32, n_ubatch=16, n_seq_max=2, kv_unified=False),
)


def traffic(n_ubatch: int) -> tuple[Call, ...]:
    """A prompt of a full ubatch and a partial one, two single-token decodes, a decode of two sequences."""
    return (Call("decode", (Part(0, n_ubatch + 4, "last"),)), Call("decode", (Part(0, 1, "last"),)),
            Call("decode", (Part(0, 1, "last"), Part(1, 3, "all"))))


def pool_workloads() -> tuple[tuple[str, LlamaWorkload], ...]:
    """The pool's workloads, by name (family and context): each family at each of ``CONTEXTS``
    on an RPC device beside the CPU, flash attention on for the dense model (its graphs have
    FLASH_ATTN_EXT and the probe), off for the others; and the MoE model with its experts on the
    CPU (``-ot exps=CPU``, as ``-ncmoe`` does): offloaded by a GPU-like device's ``offload_op``,
    its routed-expert matmuls copy only the experts a batch uses."""
    out = []
    for kind, model in MODELS.items():
        for ctx in CONTEXTS:
            w = LlamaWorkload(model, Devices(n_rpc=1), replace(ctx, flash_attn="on" if kind == "dense" else "off"), traffic(ctx.n_ubatch))
            w.validate()
            out.append((f"{kind}, n_ubatch {ctx.n_ubatch}, n_ctx {ctx.n_ctx}", w))
    ctx = CONTEXTS[-1]
    w = LlamaWorkload(MODELS["moe"], Devices(n_rpc=1, overrides=(("exps", CPU_DEVICE),)), replace(ctx, flash_attn="off"), traffic(ctx.n_ubatch))
    w.validate()
    out.append((f"moe experts on the CPU, n_ubatch {ctx.n_ubatch}, n_ctx {ctx.n_ctx}", w))
    return tuple(out)


def captured_pool(run: Callable[[LlamaWorkload], LlamaTrace]) -> tuple[dict[str, Scenario], str]:
    """The scenarios of the pool's workloads run by ``run`` (with capture), by name, each graph
    labelled with it, and what could not be captured and why ("" when all were): a missing
    llama.cpp leaves it empty, said so."""
    scenarios: dict[str, Scenario] = {}
    missing = []
    for name, w in pool_workloads():
        try:
            sc = capture(w, run(w)).scenario
        except (CaptureError, TargetError) as e:
            missing.append(f"{name}: {str(e).splitlines()[0][:200]}")
            continue
        graphs = tuple((g_name, replace(g, label=f"{CAPTURED_LABEL}{name}: {g_name}")) for g_name, g in sc.graphs)
        scenarios[name] = replace(sc, graphs=graphs)
    return scenarios, "; ".join(missing)


def session_pool(engines: Engines, stats: Stats, ggml_engine: bool) -> tuple[Scenario, ...]:
    """The pool's scenarios for a session's graph properties (``Fuzzer.captured_pool``): empty,
    with the reason in the statistics, where llama.cpp cannot run, the engine under test is not
    ggml (``ggml_engine`` false: a user's target), or its ggml is not the version llama.cpp's
    graphs were built by (ops differ between versions: 0.15.3's ``ggml_clamp`` returns a view,
    0.25.3's a new tensor)."""
    try:
        versions = (engines.ggml_version(False), engines.ggml_version(True)) if ggml_engine else None
    except TargetError as e:
        versions, why = None, f"llama.cpp cannot run: {str(e).splitlines()[0]}"
    else:
        why = "the engine under test is not ggml" if versions is None else ""
    if versions is not None and versions[0] != versions[1]:
        versions, why = None, f"llama.cpp's graphs are ggml {versions[1]}'s, the engine is ggml {versions[0]}"
    pool: tuple[Scenario, ...] = ()
    if versions is not None:
        families, why = captured_pool(lambda w: engines.run_llama(w, capture=True))
        pool = tuple(families.values())
        for name in families:  # "dense, n_ubatch 8, n_ctx 128": scenarios per model family
            kind = name.split(",")[0]
            stats.captured_families[kind] = stats.captured_families.get(kind, 0) + 1
    if why:
        stats.captured_missing[why[:300]] = 1
    return pool

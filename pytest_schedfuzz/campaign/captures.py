"""The captured llama.cpp graphs the graph properties fuzz on (``strategies.captured``): one
small workload per model family, run once per session on llama.cpp with capture, each giving a
scenario whose graphs are llama.cpp's own (a full ubatch, a partial one, single-token decodes,
the reservation's worst case, the flash-attention probe)."""

from __future__ import annotations

from collections.abc import Callable

from ..cases.capture import CaptureError, capture
from ..engine import TargetError
from ..model.llama import Call, ContextParams, Devices, LlamaWorkload, Part
from ..model.llama_model import ModelSpec
from ..model.llama_trace import LlamaTrace
from ..model.scenario import Scenario

_SSM = {"ssm_state": 16, "ssm_conv": 4, "ssm_groups": 1, "ssm_head_dim": 16}
MODELS: dict[str, ModelSpec] = {
    "dense": ModelSpec(n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64),
    "moe": ModelSpec(kind="moe", n_layer=1, n_embd=16, n_head=1, n_head_kv=1, n_ff=16, n_expert=4, n_expert_used=2),
    "mamba2": ModelSpec(arch="mamba2", kind="mamba2", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, **_SSM),  # type: ignore[arg-type]
    "hybrid": ModelSpec(arch="granitehybrid", kind="hybrid", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, attn_layers=(1,),
                        **_SSM),  # type: ignore[arg-type]
}
# a 12-token prompt in ubatches of 8 and 4, two single-token decodes, a decode of two sequences
TRAFFIC = (Call("decode", (Part(0, 12, "last"),)), Call("decode", (Part(0, 1, "last"),)), Call("decode", (Part(0, 1, "last"), Part(1, 3, "all"))))


def pool_workloads() -> tuple[LlamaWorkload, ...]:
    """The pool's workloads: each family on an RPC device beside the CPU, flash attention on for
    the dense model (its graphs have FLASH_ATTN_EXT and the probe), off for the others."""
    out = []
    for kind, model in MODELS.items():
        ctx = ContextParams(n_ctx=128, n_batch=16, n_ubatch=8, n_seq_max=2, flash_attn="on" if kind == "dense" else "off", kv_unified=True)
        w = LlamaWorkload(model, Devices(n_rpc=1), ctx, TRAFFIC)
        w.validate()
        out.append(w)
    return tuple(out)


def captured_pool(run: Callable[[LlamaWorkload], LlamaTrace]) -> tuple[dict[str, Scenario], str]:
    """The scenarios of the pool's workloads run by ``run`` (with capture), by model family, and
    what could not be captured and why ("" when all were): a missing llama.cpp leaves it empty, said so."""
    scenarios: dict[str, Scenario] = {}
    missing = []
    for w in pool_workloads():
        try:
            scenarios[w.model.kind] = capture(w, run(w)).scenario
        except (CaptureError, TargetError) as e:
            missing.append(f"{w.model.kind}: {str(e).splitlines()[0][:200]}")
    return scenarios, "; ".join(missing)

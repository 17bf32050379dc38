"""What the llama.cpp tests share: the hybrid models and context of a served hybrid (Nemotron-H's
Mamba-2 layers, LFM2's short convolutions; snapshots for rollback), a batch by its parts, and a
workload's first finding saved as a case and exported as a C reproducer."""

from __future__ import annotations

from pathlib import Path

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.corpus import Case, load_case, save_case
from pytest_schedfuzz.cases.export_llama import export_llama_case
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, LlamaWorkload, Part
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import LLAMA_GROUP, Violation
from pytest_schedfuzz.properties.derived import llama_trace

NEMOTRON = ModelSpec(arch="nemotron_h", kind="nemotron", n_layer=4, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, attn_layers=(2,))
LFM2 = ModelSpec(arch="lfm2", kind="lfm2", n_layer=3, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, attn_layers=(1,), ssm_conv=3)
CTX = ContextParams(n_ctx=256, n_batch=16, n_ubatch=8, n_seq_max=2, n_rs_seq=3)


def decode(*parts: tuple[int, int, str]) -> Call:
    return Call("decode", tuple(Part(s, n, o) for s, n, o in parts))


def first_finding_exported(w: LlamaWorkload, lib: str | None, tmp_path: Path) -> Violation:
    """``w``'s first finding on ``lib`` (None: the default build), saved as a case and exported
    into ``tmp_path/repro``."""
    f = Fuzzer(FuzzConfig(database=None, **({"llama_lib": lib} if lib else {})))
    try:
        v = min(f.check_llama(LLAMA_GROUP, w), key=lambda v: v.step)
        trace = llama_trace(f.engines.run_llama(w))
    finally:
        f.close()
    case = load_case(save_case(tmp_path, Case(v.property, v.signature(), None, v.message, v.step, engine=dict(trace.engine), llama=w)))
    export_llama_case(case, tmp_path / "repro", None, trace=trace)
    return v


def first_finding_reproduced(w: LlamaWorkload, lib: str | None, tmp_path: Path) -> tuple[Violation, str]:
    """``first_finding_exported``, then the reproducer built and run: it must report that finding
    in its call. The finding and the reproducer's C source."""
    from pytest_schedfuzz.cases.export import build_and_run

    v = first_finding_exported(w, lib, tmp_path)
    built = build_and_run(tmp_path / "repro")
    assert built.code == 1 and f"REPRODUCED: [{v.property}] call {v.step}" in built.output, built.output[-3000:]
    return v, (tmp_path / "repro" / "repro.c").read_text()

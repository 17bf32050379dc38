"""Workloads next to those that found a cause, as a fuzzer mutates its favoured inputs: one
dimension of a found llama.cpp workload drawn again (its model, its devices, its context or its
calls), the others kept. The causes beside a found one (the same lost reservation on another
family or after another call, another assert of the same device) then come sooner than from the
whole space. A campaign that keeps going draws half of its llama.cpp workloads here once it has
found one (``Fuzzer.strategy``)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import reject
from hypothesis import strategies as st

from ..model.devices import DeviceLimits
from ..model.llama_model import RECURRENT_KINDS, ROLLBACK_KINDS
from ..model.llama_workload import NO_TENSOR_SPLIT, OPTIONAL_PARAMS, Call, LlamaWorkload, Part, WorkloadError
from . import sampled
from .llama_workloads import context_params, devices, model_specs, mtp_model, pipeline_ready, server_calls

# what one neighbour draws again
DIMENSIONS = ("model", "devices", "context", "calls")


@st.composite
def neighbours(draw: st.DrawFn, found: tuple[LlamaWorkload, ...], max_layers: int, limits: DeviceLimits, max_calls: int,
               families: tuple[str, ...], absent: frozenset[str]) -> LlamaWorkload:
    """A workload of ``found`` with one of its ``DIMENSIONS`` drawn again as ``llama_workloads``
    draws it (within the same bounds, without the ``absent`` call kinds and context parameters;
    a model with its MTP draft, which may put the MTP layer on a device of its own);
    a mix the workload's own checks refuse (an adapter the new model cannot take, calls the new
    context cannot hold) is rejected."""
    w = draw(st.sampled_from(found))
    what = draw(sampled(DIMENSIONS))
    if what == "model":
        model, dv, draft, draft_model = draw(model_specs(max_layers, families)), w.devices, w.draft, w.draft_model
        if "mtp" in families and not w.loras:  # an MTP model too, as llama_workloads makes one (its draft with it)
            model, mtp_draft, dv, mtp_own = draw(mtp_model(model, dv, families, absent | ({"draft mtp"} if w.ctx.embeddings else set())))
            draft, draft_model = (mtp_draft, mtp_own) if model.kind == "mtp" else ("", None) if draft == "mtp" else (draft, draft_model)
        w = replace(w, model=model, devices=dv, draft=draft, draft_model=draft_model)
    elif what == "devices":
        tensor = w.model.arch not in NO_TENSOR_SPLIT and w.ctx.flash_attn != "off" and not w.ctx.backend_samplers
        w = replace(w, devices=draw(devices(w.model, limits, tensor)))
    elif what == "context":
        ctx = draw(context_params(w.model.head_dim))
        w = replace(w, ctx=replace(ctx, **{name: 0 for name in OPTIONAL_PARAMS if name in absent}))
    else:
        rs_seq = w.ctx.n_rs_seq if w.model.kind in ROLLBACK_KINDS else 0
        calls = draw(server_calls(w.ctx, max_calls, len(w.loras), w.model.kind in RECURRENT_KINDS, rs_seq))
        w = replace(w, calls=tuple(c for c in calls if c.kind not in absent) or (Call("decode", (Part(0, 1, "last"),)),))
    if pipeline_ready(w.devices):
        w = replace(w, ctx=replace(w.ctx, offload_kqv=True))  # as llama_workloads sets it
    try:
        w.validate()
    except WorkloadError:
        reject()
    return w

"""The logits comparison ``llama-same-logits`` judges by: which workloads it judges, the CPU-only
workload it compares them with, the pairs of recorded logits, and where two rows differ beyond
``LOGITS_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from ..model.llama_trace import CallRecord, LlamaTrace
from ..model.llama_workload import Devices, LlamaWorkload

# the GPU-like device computes with the CPU backend's kernels: the same workload gives the same
# logits to the last bit on every layout measured (RPC, GPU-like, overrides, pipeline parallelism,
# ops a device refuses); the CPU-only run resolves flash attention as the devices' run did
# (``cpu_only``): its kernels and the plain attention's differ by up to ~1.4e-3
LOGITS_TOLERANCE = 1e-3


def compares_logits(w: LlamaWorkload) -> bool:
    """Whether llama-same-logits judges ``w``: a device computes otherwise than the CPU (GPU-like
    devices, or split mode tensor's meta device, which splits each op between its members even when
    they are RPC servers computing with ggml's CPU backend), and it has logits to compare."""
    computes = bool(w.devices.gpus) or w.devices.split_mode == "tensor"
    return computes and not w.ctx.backend_samplers and any(c.kind == "decode" for c in w.calls)


def cpu_only(w: LlamaWorkload, trace: LlamaTrace | None) -> LlamaWorkload:
    """``w`` with every weight, cache and op on the CPU (no device at all, so no MoE cache, which
    needs one), and flash attention as llama.cpp resolved "auto" in ``w``'s run (``trace``): a
    device that refuses ``FLASH_ATTN_EXT`` turns it off there, where the CPU alone would keep it on."""
    resolved = trace.flash_attn() if trace is not None and w.ctx.flash_attn == "auto" else None
    ctx = replace(w.ctx, flash_attn=resolved, moe_cache_size=0) if resolved else replace(w.ctx, moe_cache_size=0)
    return LlamaWorkload(w.model, Devices(n_rpc=0, n_gpu_layers=0), ctx, w.calls, w.loras)


def decode_pairs(trace: LlamaTrace, cpu: LlamaTrace) -> Iterator[tuple[CallRecord, CallRecord]]:
    """Each decode of the devices' run with the same call of the CPU-only run."""
    on = {c.index: c for c in cpu.calls if c.kind == "decode"}
    for c in trace.calls:
        if c.kind == "decode" and c.index in on:
            yield c, on[c.index]


def logit_pairs(trace: LlamaTrace, cpu: LlamaTrace) -> Iterator[tuple[int, int, tuple[float, ...], tuple[float, ...]]]:
    """(call, output, logits on the devices, on the CPU alone) for each output row both runs
    recorded in a decode that returned 0 in both: what llama-same-logits compares."""
    if trace.abort is not None or cpu.abort is not None:
        return
    for c, ref in decode_pairs(trace, cpu):
        if c.rc == 0 and ref.rc == 0:
            for k, (got, want) in enumerate(zip(c.logits, ref.logits)):
                yield c.index, k, got, want


def logits_difference(got: Sequence[float], want: Sequence[float]) -> tuple[int, str] | None:
    """The first token whose logit on the devices is not the CPU alone's, and what is wrong with
    it: a NaN or an infinity where the other has a number or another infinity (a NaN never
    compares greater than a tolerance, so non-finite values are judged first), then a finite
    difference beyond ``LOGITS_TOLERANCE`` (relative to values above 1); None if they agree.

    >>> logits_difference([float("nan"), 0.0], [1.0, 0.0])
    (0, 'nan')
    >>> logits_difference([1.0, float("inf")], [1.0, 2.0])
    (1, 'inf')
    >>> logits_difference([float("nan")], [float("nan")]) is None
    True
    """
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if a.shape != b.shape:
        return 0, "count"
    a_nan, b_nan = np.isnan(a), np.isnan(b)
    bad = np.flatnonzero(a_nan != b_nan)
    if bad.size:
        return int(bad[0]), "nan"
    ok = ~a_nan
    inf = np.flatnonzero(ok & (np.isinf(a) | np.isinf(b)) & (a != b))
    if inf.size:
        return int(inf[0]), "inf"
    finite = ok & np.isfinite(a) & np.isfinite(b)
    diff = np.where(finite, np.abs(a - b) - LOGITS_TOLERANCE * np.maximum(1.0, np.abs(b)), 0.0)
    worst = int(np.argmax(diff)) if diff.size else 0
    return (worst, "finite") if diff.size and diff[worst] > 0 else None

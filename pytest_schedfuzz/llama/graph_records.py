"""A captured graph on the wire: ``sched_hook.c``'s ``schedfuzz_graph_records`` writes one
fixed-size record per tensor of a graph handed to the scheduler (its nodes, then its leafs), and
the llama.cpp worker sends those bytes as they are. The parent makes them the capture's tensors
(``tensors``) only for a graph it has not made recently: the graph's key is a digest of the bytes,
equal for equal graphs in any workload (``RecentGraphs``)."""

from __future__ import annotations

import functools
import struct
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

# struct schedfuzz_tensor_record (packed): flags, view_src, buffer; src[10]; op_params[16]; ne[4];
# nb[4]; view_offs; name[64]; op, desc and type names [32 each]
RECORD = struct.Struct("<3i10i16i4q4QQ64s32s32s32s")
N_SRC, N_PARAMS, NAME_SIZE = 10, 16, 64
NO_TENSOR, OUTSIDE = -1, -(2**31)  # a source or view source: none; not a tensor of the graph


def _ref(i: int) -> str:
    return "?" if i == OUTSIDE else f"n{i}" if i >= 0 else f"l{-2 - i}"


def _word(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


# op, desc and type fields (zero-padded by sched_hook.c): a few dozen values, each decoded once
_name = functools.cache(_word)


def tensors(raw: bytes, n_nodes: int, buffers: Sequence[tuple[str, int]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The graph's nodes and leafs, each as the worker's capture names it: name, op, desc
    (``ggml_op_desc``: a unary or GLU op's own name), type, ne, nb, flags, sources (``n<i>``,
    ``l<j>``, None, or ``?`` outside the graph; trailing Nones dropped), op params (trailing zeros
    dropped; absent when none), view source and offset (a view only), and the buffer's type name
    and usage (a tensor in a buffer only; ``buffers``: the graph's distinct buffers, in order)."""
    out = []
    for v in RECORD.iter_unpack(raw):
        srcs = list(v[3:13])
        while srcs and srcs[-1] == NO_TENSOR:
            srcs.pop()
        params = list(v[13:29])
        while params and params[-1] == 0:
            params.pop()
        t: dict[str, Any] = {"name": _word(v[38]), "op": _name(v[39]), "desc": _name(v[40]), "type": _name(v[41]), "ne": list(v[29:33]),
                             "nb": list(v[33:37]), "flags": v[0], "src": [None if s == NO_TENSOR else _ref(s) for s in srcs]}
        if params:
            t["op_params"] = params
        if v[1] != NO_TENSOR:
            t["view_src"], t["view_offs"] = _ref(v[1]), v[37]
        if v[2] >= 0:
            t["buft"], t["usage"] = buffers[v[2]]
        out.append(t)
    return out[:n_nodes], out[n_nodes:]


class RecentGraphs:
    """The tensors of the last ``size`` graphs made, by key: most graphs a llama.cpp workload
    captures were captured by an earlier one (409 distinct among 1,179 in 40 workloads of the ci
    unit: the same models, the same batch shapes)."""

    def __init__(self, size: int = 128) -> None:
        self.size = size
        self._made: OrderedDict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = OrderedDict()

    def get(self, key: str, raw: bytes, n_nodes: int, buffers: Sequence[tuple[str, int]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = tensors(raw, n_nodes, buffers)
            if len(self._made) > self.size:
                self._made.popitem(last=False)
        else:
            self._made.move_to_end(key)
        return made

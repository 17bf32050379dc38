"""ggml's structs as the llama.cpp worker reads them where no header a build ships declares them
(``ggml_cgraph``'s head, private to ggml) or reading them through ggml-python's declarations
one field at a time would be slow (``ggml_tensor``); each is checked against the loaded library
before any workload (``llama_worker.Llama``)."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from . import graph_records


class CGraphHead(ctypes.Structure):
    """The leading fields of ``struct ggml_cgraph`` (ggml-impl.h; unchanged from 0.15.3 to 0.26.0).
    The struct is private to ggml and no header a build ships declares it: ``graph_head_wrong``
    checks it against the loaded library before any workload."""

    _fields_ = [
        ("size", ctypes.c_int),
        ("n_nodes", ctypes.c_int),
        ("n_leafs", ctypes.c_int),
        ("nodes", ctypes.c_void_p),
        ("grads", ctypes.c_void_p),
        ("grad_accs", ctypes.c_void_p),
        ("leafs", ctypes.c_void_p),
    ]


def graph_head_wrong(g: ModuleType, head_type: type[ctypes.Structure]) -> str:
    """What is wrong with ``head_type`` (``CGraphHead``) on the ggml ggml-python ``g`` loaded, or
    "": a graph of one ADD of two leafs, made with ggml's own calls, read through it and through
    ggml's accessors (``ggml_graph_size``, ``ggml_graph_nodes``, ``ggml_graph_n_nodes``); the
    leafs, which no accessor gives, must be the two operands."""
    glib = g.ggml.lib
    for name, res in (("ggml_graph_size", ctypes.c_int), ("ggml_graph_n_nodes", ctypes.c_int), ("ggml_graph_nodes", ctypes.c_void_p)):
        getattr(glib, name).argtypes, getattr(glib, name).restype = [ctypes.c_void_p], res
    ctx = g.ggml_init(g.ggml_init_params(mem_size=16 * 1024 * 1024, mem_buffer=None, no_alloc=True))
    try:
        a, b = (g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 4) for _ in range(2))
        c = g.ggml_add(ctx, a, b)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, c)
        graph = ctypes.cast(gf, ctypes.c_void_p).value
        head: Any = head_type.from_address(graph)
        addr = [ctypes.cast(t, ctypes.c_void_p).value for t in (a, b, c)]
        told = (int(glib.ggml_graph_size(graph)), int(glib.ggml_graph_n_nodes(graph)), glib.ggml_graph_nodes(graph))
        if (head.size, head.n_nodes, head.nodes) != told:
            return f"size, n_nodes, nodes read {head.size}, {head.n_nodes}, {head.nodes or 0:#x}; ggml says {told[0]}, {told[1]}, {told[2] or 0:#x}"
        leafs = ctypes.cast(head.leafs, ctypes.POINTER(ctypes.c_void_p))[:2] if head.leafs and head.n_leafs == 2 else []
        if sorted(leafs) != sorted(addr[:2]) or ctypes.cast(head.nodes, ctypes.POINTER(ctypes.c_void_p))[0] != addr[2]:
            return f"n_leafs {head.n_leafs} and leafs {head.leafs or 0:#x} read are not the ADD's two operands"
        return ""
    finally:
        g.ggml_free(ctx)


class TensorLayout(ctypes.Structure):
    """``struct schedfuzz_tensor_layout`` of ``sched_hook.c``: where the fields its graph records
    copy lie in a ``ggml_tensor`` (offsets), and how many sources, op params and name bytes."""

    OFFSETS = ("type", "buffer", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs", "name")
    _fields_ = [(name, ctypes.c_int32) for name in (*OFFSETS, "n_src", "n_op_params", "name_size")]

    @classmethod
    def of(cls, tensor: type[ctypes.Structure]) -> TensorLayout:
        """The layout of ggml-python's ``ggml_tensor`` (checked against the library by the
        worker's startup probe), refused where a record could not hold it."""
        f = {name: getattr(tensor, name) for name in cls.OFFSETS}
        counts = f["src"].size // 8, f["op_params"].size // 4, f["name"].size
        if counts[0] > graph_records.N_SRC or counts[1] > graph_records.N_PARAMS or counts[2] > graph_records.NAME_SIZE:
            raise RuntimeError(f"ggml_tensor has {counts} sources, op params and name bytes: more than sched_hook.c's records hold")
        return cls(*(x.offset for x in f.values()), *counts)


class RawTensor(NamedTuple):
    """The fields of a ``ggml_tensor`` the worker reads, from one copy of its bytes (a ctypes
    read per field cost a captured graph about 30% of a workload's time in the worker)."""

    type: int
    buffer: int
    ne: tuple[int, ...]
    nb: tuple[int, ...]
    op: int
    op_params: tuple[int, ...]
    flags: int
    src: tuple[int, ...]
    view_src: int
    view_offs: int
    name: str

    @staticmethod
    def reader(layout: type[ctypes.Structure]) -> Callable[[int], RawTensor]:
        """A reader of tensors laid out as ``layout`` (ggml-python's ``ggml_tensor``, checked
        against the library by the worker's startup probe): ``struct`` formats at its offsets."""
        codes = {"type": "i", "buffer": "Q", "ne": "q", "nb": "Q", "op": "i", "op_params": "i", "flags": "i", "src": "Q", "view_src": "Q",
                 "view_offs": "Q", "name": "s"}
        fmt, at, spans, k = "<", 0, {}, 0
        for name, code in codes.items():
            f = getattr(layout, name)
            n = f.size if code == "s" else f.size // struct.calcsize("<" + code)
            fmt += "x" * (f.offset - at) + f"{n}{code}"
            at = f.offset + f.size
            width = 1 if code == "s" else n
            spans[name] = slice(k, k + width)
            k += width
        unpack, size = struct.Struct(fmt).unpack_from, ctypes.sizeof(layout)
        ne, nb, params, src = spans["ne"], spans["nb"], spans["op_params"], spans["src"]
        i = {name: spans[name].start for name in ("type", "buffer", "op", "flags", "view_src", "view_offs", "name")}

        def read(ptr: int) -> RawTensor:
            v = unpack(ctypes.string_at(ptr, size))
            return RawTensor(v[i["type"]], v[i["buffer"]], v[ne], v[nb], v[i["op"]], v[params], v[i["flags"]], v[src], v[i["view_src"]],
                             v[i["view_offs"]], v[i["name"]].split(b"\0", 1)[0].decode(errors="replace"))

        return read

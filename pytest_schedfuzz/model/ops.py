"""Every op a graph spec may hold, one entry each (``OPS``): everything the harness knows of it in
one place. Its shape rule (``shapes``: ggml's constructor's checks and result), its sources as
ggml's ``src[]`` stores them, the record the graph engine encodes for it (``ggml.program``), the
ggml constructor calls that build it, which ``graph.c`` compiles (``ggml.graph_ops`` writes them
as C) and the reproducer writes (``cases.export``), and how a node captured inside llama.cpp is
read back as it (``cases.capture``). A new op is one entry here.

An op's record has a shape (the constructor's ``ne`` for views and reshapes), eight integer
parameters and four real ones. A ``Build`` names a constructor and its arguments after the
context, as tokens: ``aK`` the K-th argument tensor, ``iK`` integer parameter K as an int,
``lK`` as an int64_t, ``zK`` as a size_t, ``bK`` as a bool, ``tK`` as a ggml type, ``fK`` real
parameter K as a float, ``nK`` the record's shape's dim K; anything else is a C literal
(``0``, ``1.0f``). An op's first build whose ``when`` holds is the call (``WHEN``).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import shapes
from .shapes import Geometry, SpecError, new_tensor
from .versions import GgmlVersion

Args = tuple[str | None, ...]
Params = Callable[..., Any]  # a tensor's parameter by name, with a default: ``P("eps", 1e-6)``
Fields = tuple[tuple[int, ...], list[int], list[float]]  # a record's shape, 8 integer and 4 real parameters
Inferrer = Callable[[Geometry, Sequence["Geometry | None"], Sequence["str | None"], Mapping[str, object]], Geometry]
Recorder = Callable[[Params, Mapping[str, int]], Fields]  # (parameters, the loaded ggml's type codes) -> fields


TOKEN_LETTERS = "aitblzfn"  # the argument tokens' letters (the module's docstring)
_TOKEN = re.compile(rf"([{TOKEN_LETTERS}])(\d)")


def token(tok: str) -> tuple[str, int] | None:
    """A build argument's letter and index, or None for a C literal."""
    m = _TOKEN.fullmatch(tok)
    return (m[1], int(m[2])) if m else None


@dataclass(frozen=True)
class Build:
    """One ggml constructor call that makes an op (see the module's docstring for ``args``)."""

    fn: str
    args: tuple[str, ...]
    when: str = ""  # a condition of ``WHEN``; "" always


# the conditions a build may name: its C test in graph.c's ``construct`` (over the record ``r``, its
# integer parameters ``p``, its argument tensors ``a`` and ``inplace``), and the same test in Python
# over what ``Record`` holds
WHEN: dict[str, tuple[str, Callable[[Record], bool]]] = {
    "inplace": ("inplace", lambda r: r.inplace),
    "no_a1": ("a[1] == NULL", lambda r: r.args[1] is None),
    "shape_given": ("p[4]", lambda r: r.ints[4] != 0),  # ggml_cont_4d
    "k_given": ("r[R_FLAGS] & FLAG_VERSION_K", lambda r: r.k_given),  # ggml_ssm_scan's K argument (0.25.3)
    **{f"dims{k}": (f"r[R_NDIMS] == {k}", lambda r, k=k: len(r.ne) == k) for k in (1, 2, 3)},
}


@dataclass(frozen=True)
class Record:
    """What a build's condition reads: the record's shape and parameters, the arguments (None
    where absent), whether the in-place form and ssm_scan's K were asked for."""

    ne: tuple[int, ...]
    ints: Sequence[int]
    args: Sequence[object | None]
    inplace: bool
    k_given: bool


def no_fields(P: Params, types: Mapping[str, int]) -> Fields:
    return (), [0] * 8, [0.0] * 4


def _ints(*values: int, ne: Sequence[int] = ()) -> Fields:
    return tuple(ne), [*values, *[0] * (8 - len(values))], [0.0] * 4


def _reals(*values: float) -> Fields:
    return (), [0] * 8, [*values, *[0.0] * (4 - len(values))]


def f32(word: int) -> float:
    """An ``op_params`` word read as the float ggml stored in it."""
    return float(struct.unpack("<f", struct.pack("<i", word))[0])


def word(node: Mapping[str, Any], i: int) -> int:
    """Word ``i`` of a captured node's ``op_params`` (0 past its end)."""
    params = node.get("op_params", [])
    return int(params[i]) if i < len(params) else 0


@dataclass(frozen=True)
class Op:
    """One op a spec may hold (``TensorSpec.op``), by its ggml constructor's name."""

    name: str
    arity: int  # arguments, in call order
    shape: Inferrer  # the result's geometry (``shapes``), or a ``SpecError``
    builds: tuple[Build, ...]  # the calls that make it, the first whose ``when`` holds
    optional: frozenset[int] = frozenset()  # arguments that may be None
    desc: str = ""  # ggml_op_desc of its node ("" = its name upper-cased); a unary kind for ``unary``
    unary: bool = False  # a GGML_OP_UNARY kind: ggml_op_name says UNARY, ggml_op_desc its kind
    inplace: bool = False  # an ``_inplace`` constructor, whose result views its first source
    record: Recorder = no_fields  # its record's fields (``ggml.program``)
    needs: tuple[str, str] = ()  # a ``GgmlApi`` feature its encoding needs, and what lacks it
    to_srcs: Callable[[Args], Args] | None = None  # ggml's src[] from the arguments (None: in order)
    from_srcs: Callable[[Args], Args] | None = None  # the arguments from a captured node's src[] (None: in order)
    from_node: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None  # its parameters from a captured node
    captured: bool = True  # read back from a captured node by ``cases.capture``'s generic path
    is_view: bool = False  # its result views its source (ggml_is_view_op: no computation of its own)
    # the arguments that index a table: (the argument, the argument it indexes or None for token
    # positions, that argument's dim), so that values drawn for it stay in range (``ggml.cpu_values``)
    indexes: tuple[tuple[int, int | None, int], ...] = ()

    @property
    def ggml_desc(self) -> str:
        return self.desc or self.name.upper()

    @property
    def ggml_name(self) -> str:
        """What ``ggml_op_name`` calls its node."""
        return "UNARY" if self.unary else self.ggml_desc

    def srcs(self, args: Args) -> Args:
        return self.to_srcs(args) if self.to_srcs is not None else tuple(args)

    def args_of(self, srcs: Args) -> Args:
        if self.from_srcs is not None:
            return self.from_srcs(srcs)
        return tuple(srcs[i] if i < len(srcs) else None for i in range(self.arity))

    def params_of(self, node: Mapping[str, Any]) -> dict[str, Any]:
        return self.from_node(node) if self.from_node is not None else {}

    def unsupported(self, version: GgmlVersion) -> str | None:
        """Why ``version``'s API cannot build it, or None."""
        if self.needs and not getattr(version.calls, self.needs[0]):
            return self.needs[1]
        return None

    def build_for(self, record: Record) -> Build:
        return next(b for b in self.builds if not b.when or WHEN[b.when][1](record))


def _call(fn: str, *args: str, when: str = "") -> Build:
    return Build(fn, tuple(args), when)


def _plain(name: str, arity: int) -> tuple[Build, ...]:
    return (_call(f"ggml_{name}", *(f"a{k}" for k in range(arity))),)


def _with_inplace(name: str, *args: str) -> tuple[Build, ...]:
    return (_call(f"ggml_{name}_inplace", *args, when="inplace"), _call(f"ggml_{name}", *args))


def _unary(name: str, **kw: Any) -> Op:
    return Op(name, 1, lambda a, args, names, p: shapes.unary(a, name), _plain(name, 1), **kw)


def _binary(name: str, inplace: bool = False) -> Op:
    builds = _with_inplace(name, "a0", "a1") if inplace else _plain(name, 2)
    return Op(name, 2, lambda a, args, names, p: shapes.binary(a, args[1]), builds, inplace=inplace)  # type: ignore[arg-type]


def _view_op(name: str, builds: tuple[Build, ...], record: Recorder = no_fields, **kw: Any) -> Op:
    return Op(name, 1, lambda a, args, names, p: shapes.view_op(name, a, str(names[0]), p), builds, record=record, is_view=True, **kw)


def _dims_builds(fn: str, *tail: Callable[[int], tuple[str, ...]]) -> tuple[Build, ...]:
    """``fn``'s 1d..4d forms (``ggml_reshape_Nd``), each over the record's shape and ``tail(N)``."""
    return tuple(_call(f"{fn}_{k}d", "a0", *(f"n{d}" for d in range(k)), *(x for t in tail for x in t(k)), when=f"dims{k}" if k < 4 else "")
                 for k in (1, 2, 3, 4))


def _view_record(P: Params, types: Mapping[str, int]) -> Fields:
    ne, nb = tuple(int(x) for x in P("ne")), [int(x) for x in P("nb", ())]
    return _ints(*nb, *[0] * (3 - len(nb)), int(P("offset", 0)), ne=ne)


def _rope_builds() -> tuple[Build, ...]:
    # n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
    tail = ("i0", "i1", "0", "10000.0f", "1.0f", "0.0f", "1.0f", "32.0f", "1.0f")
    return (_call("ggml_rope_ext_inplace", "a0", "a1", "a2", *tail, when="inplace"), _call("ggml_rope_ext", "a0", "a1", "a2", *tail))


def _cont_record(P: Params, types: Mapping[str, int]) -> Fields:
    if P("ne") is None:
        return no_fields(P, types)
    cne = [int(x) for x in P("ne")]
    return _ints(*cne, *[1] * (4 - len(cne)), 1)


_OPS: tuple[Op, ...] = (
    Op("fill", 1, lambda a, args, names, p: shapes.fill(a), _with_inplace("fill", "a0", "f0"), inplace=True,
       record=lambda P, types: _reals(float(P("value", 0.0))), from_node=lambda t: {"value": f32(word(t, 0))}),
    Op("cast", 1, lambda a, args, names, p: new_tensor(str(p["type"]), a.ne), (_call("ggml_cast", "a0", "t0"),), desc="CPY",
       record=lambda P, types: _ints(types[str(P("type"))]), to_srcs=lambda args: (args[0], shapes.CAST_SELF), captured=False),
    Op("pad", 1, lambda a, args, names, p: shapes.pad(a, [int(x) for x in p["pad"]]),  # type: ignore[attr-defined]
       (_call("ggml_pad_ext", "a0", *(f"i{k}" for k in range(8))),), record=lambda P, types: _ints(*(int(x) for x in P("pad"))),
       from_node=lambda t: {"pad": tuple(word(t, i) for i in range(8))}),
    Op("argmax", 1, lambda a, args, names, p: shapes.argmax(a), _plain("argmax", 1)),
    Op("ssm_conv", 2, lambda a, args, names, p: shapes.ssm_conv(a, args[1]), _plain("ssm_conv", 2)),  # type: ignore[arg-type]
    _binary("sub"),
    Op("sum", 1, lambda a, args, names, p: new_tensor(a.type, (1,)), _plain("sum", 1)),
    _unary("log"),
    _unary("exp", unary=True),
    _unary("sigmoid", unary=True),
    _unary("step", unary=True),
    _unary("relu", unary=True),
    _unary("sqr"),
    Op("cumsum", 1, lambda a, args, names, p: shapes.cumsum(a), _plain("cumsum", 1)),
    Op("top_k", 1, lambda a, args, names, p: shapes.top_k(a, int(p["k"])), (_call("ggml_top_k", "a0", "i0"),),  # type: ignore[call-overload]
       record=lambda P, types: _ints(int(P("k"))), needs=("has_top_k", "GGML_OP_TOP_K is ggml 0.25.3's"),
       from_node=lambda t: {"k": int(t["ne"][0])}),
    Op("ssm_scan", 7, lambda a, args, names, p: shapes.ssm_scan(a, *args[1:], k=int(p.get("k", 1))),  # type: ignore[arg-type,call-overload]
       (_call("ggml_ssm_scan", *(f"a{k}" for k in range(7)), "l0", when="k_given"), _call("ggml_ssm_scan", *(f"a{k}" for k in range(7)))),
       record=lambda P, types: _ints(int(P("k", 1))), from_node=lambda t: {"k": word(t, 0)}),  # 0.25.3 added K, the states kept
    Op("get_rows", 2, lambda a, args, names, p: shapes.get_rows(a, args[1]), _plain("get_rows", 2), indexes=((1, 0, 1),)),  # type: ignore[arg-type]
    Op("mul_mat", 2, lambda a, args, names, p: shapes.mul_mat(a, args[1]), _plain("mul_mat", 2)),  # type: ignore[arg-type]
    _binary("add", inplace=True),
    _binary("mul", inplace=True),
    _binary("div", inplace=True),
    Op("cpy", 2, lambda a, args, names, p: shapes.cpy(a, args[1], str(names[1])), _plain("cpy", 2)),
    Op("silu", 1, lambda a, args, names, p: shapes.unary(a, "silu"), _with_inplace("silu", "a0"), unary=True, inplace=True),
    _view_op("transpose", _plain("transpose", 1)),
    # ggml_view_tensor keeps op NONE and no src: ggml's graph makes it a leaf that views a tensor
    Op("view_tensor", 1, lambda a, args, names, p: shapes.view(str(names[0]), a, a.type, a.ne, a.nb), _plain("view_tensor", 1), desc="NONE",
       to_srcs=lambda args: (), captured=False),
    Op("sum_rows", 1, lambda a, args, names, p: shapes.sum_rows(a), _plain("sum_rows", 1)),
    Op("dup", 1, lambda a, args, names, p: shapes.same(a), _plain("dup", 1)),  # ggml_dup_tensor of its source, a contiguous copy
    Op("cont", 1, lambda a, args, names, p: shapes.cont(a, p.get("ne")),  # type: ignore[arg-type]
       (_call("ggml_cont_4d", "a0", "l0", "l1", "l2", "l3", when="shape_given"), _call("ggml_cont", "a0")), record=_cont_record),
    Op("argsort", 1, lambda a, args, names, p: shapes.argsort(a), (_call("ggml_argsort", "a0", "i0"),),
       record=lambda P, types: _ints(int(P("order", 0))), from_node=lambda t: {"order": word(t, 0)}),
    Op("clamp", 1, lambda a, args, names, p: shapes.unary(a, "clamp"), (_call("ggml_clamp", "a0", "f0", "f1"),),
       record=lambda P, types: _reals(float(P("min", 0.0)), float(P("max", 1.0))),
       needs=("clamp_out_of_place", "ggml 0.15.3's ggml_clamp works in place"),
       from_node=lambda t: {"min": f32(word(t, 0)), "max": f32(word(t, 1))}),
    Op("glu", 2, lambda a, args, names, p: shapes.glu(a, args[1]), (_call("ggml_glu", "a0", "i0", "b1", when="no_a1"), _call("ggml_glu_split", "a0", "a1", "i0")),
       optional=frozenset({1}), record=lambda P, types: _ints(int(P("glu", 2)), int(bool(P("swapped", False)))), captured=False),
    Op("mul_mat_id", 3, lambda a, args, names, p: shapes.mul_mat_id(a, args[1], args[2]), _plain("mul_mat_id", 3),  # type: ignore[arg-type]
       indexes=((2, 0, 2),)),
    Op("set_rows", 3, lambda a, args, names, p: shapes.set_rows(a, args[1], args[2], str(names[0])), _plain("set_rows", 3), indexes=((2, 0, 1),),
       to_srcs=lambda args: (args[1], args[2], args[0]), from_srcs=lambda s: (s[2], s[0], s[1])),  # ggml_set_rows(a, b, c) stores {b, c, a}
    Op("scale", 1, lambda a, args, names, p: shapes.unary(a, "scale"), _with_inplace("scale", "a0", "f0"), inplace=True,
       record=lambda P, types: _reals(float(P("scale", 1.0))), from_node=lambda t: {"scale": f32(word(t, 0))}),
    Op("rms_norm", 1, lambda a, args, names, p: shapes.unary(a, "rms_norm"), (_call("ggml_rms_norm", "a0", "f0"),),
       record=lambda P, types: _reals(float(P("eps", 1e-6))), from_node=lambda t: {"eps": f32(word(t, 0))}),
    Op("rope", 3, lambda a, args, names, p: shapes.rope(a, args[1], args[2]), _rope_builds(), optional=frozenset({2}), inplace=True,  # type: ignore[arg-type]
       indexes=((1, None, 0),),
       record=lambda P, types: _ints(int(P("n_dims")), int(P("mode", 0))), from_node=lambda t: {"n_dims": word(t, 1), "mode": word(t, 2)}),
    Op("soft_max_ext", 2, lambda a, args, names, p: shapes.soft_max_ext(a, args[1]), (_call("ggml_soft_max_ext", "a0", "a1", "f0", "f1"),),
       optional=frozenset({1}), desc="SOFT_MAX", record=lambda P, types: _reals(float(P("scale", 1.0)), float(P("max_bias", 0.0))),
       from_node=lambda t: {"scale": f32(word(t, 0)), "max_bias": f32(word(t, 1))}),
    Op("flash_attn_ext", 4, lambda a, args, names, p: shapes.flash_attn_ext(a, args[1], args[2], args[3]),  # type: ignore[arg-type]
       (_call("ggml_flash_attn_ext", "a0", "a1", "a2", "a3", "f0", "f1", "f2"),), optional=frozenset({3}),
       record=lambda P, types: _reals(float(P("scale", 1.0)), float(P("max_bias", 0.0)), float(P("logit_softcap", 0.0))),
       from_node=lambda t: {"scale": f32(word(t, 0)), "max_bias": f32(word(t, 1)), "logit_softcap": f32(word(t, 2))}),
    Op("concat", 2, lambda a, args, names, p: shapes.concat(a, args[1], int(p.get("dim", 0))),  # type: ignore[arg-type,call-overload]
       (_call("ggml_concat", "a0", "a1", "i0"),), record=lambda P, types: _ints(int(P("dim", 0))), from_node=lambda t: {"dim": word(t, 0)}),
    _view_op("permute", (_call("ggml_permute", "a0", "i0", "i1", "i2", "i3"),), record=lambda P, types: _ints(*(int(x) for x in P("axes"))),
             from_node=lambda t: {"axes": tuple(word(t, i) for i in range(4))}),
    # a captured VIEW or RESHAPE is read with its source's geometry (``cases.capture``'s own path)
    _view_op("reshape", _dims_builds("ggml_reshape"), record=lambda P, types: _ints(ne=tuple(int(x) for x in P("ne"))), captured=False),
    # ne in the record, the strides of dims 1.. and the byte offset in the integer parameters
    _view_op("view", _dims_builds("ggml_view", lambda k: tuple(f"z{d}" for d in range(k - 1)), lambda k: ("z3",)), record=_view_record,
             captured=False),
)
OPS: dict[str, Op] = {op.name: op for op in _OPS}
# what ``ggml_op_name`` calls each op's node
GGML_OP_NAMES: dict[str, str] = {op.name: op.ggml_name for op in _OPS} | {"none": "NONE"}
# ops with an ``_inplace`` constructor that a captured graph may use: the result views src 0
INPLACE = frozenset(op.name for op in _OPS if op.inplace)
# ops whose result is a view of a source (ggml_is_view_op in ggml-backend.cpp)
VIEW_OPS = frozenset(op.name for op in _OPS if op.is_view)
# ``ggml_view_tensor`` keeps op NONE and no src: ggml's graph makes it a leaf that views a tensor
LEAF_VIEW_OPS = frozenset(op.name for op in _OPS if op.ggml_name == "NONE")
# the ops whose record has fields (a shape, integer or real parameters); every other op's are zeros
RECORDED = frozenset(op.name for op in _OPS if op.record is not no_fields)
# the ops a captured node is read back as by ``cases.capture``, by ggml_op_desc
CAPTURED: dict[str, Op] = {op.ggml_desc: op for op in _OPS if op.captured}


def ggml_srcs(op: str, args: Sequence[str | None]) -> tuple[str | None, ...]:
    """The ``src[]`` array ggml's constructor stores for an op, given its arguments in call order.

    ``ggml_set_rows(a, b, c)`` stores ``{b, c, a}``; ``ggml_cast(a)`` ``{a, itself}``;
    ``ggml_view_tensor(a)`` none (``a`` is only its view source); every other op here stores its
    arguments in order (absent optional ones as NULL).
    """
    return OPS[op].srcs(tuple(args))


def infer(op: str, args: Sequence[Geometry | None], names: Sequence[str | None], params: Mapping[str, object]) -> Geometry:
    """Result layout of ``op`` applied to ``args`` (each a ``Geometry`` or None) named ``names``."""
    entry = OPS.get(op)
    if entry is None:
        raise SpecError(f"unknown op {op!r}")
    if len(args) != entry.arity:
        raise SpecError(f"{op} takes {entry.arity} sources, got {len(args)}")
    for i, a in enumerate(args):
        if a is None and i not in entry.optional:
            raise SpecError(f"{op}: source {i} is required")
    a = args[0]
    assert a is not None
    if params.get("inplace"):
        shapes.check(entry.inplace, f"{op}: no in-place form")
        infer(op, args, names, {k: v for k, v in params.items() if k != "inplace"})
        return shapes.view(str(names[0]), a, a.type, a.ne, a.nb)
    return entry.shape(a, args, names, params)


class NotInVersion(Exception):
    """An op the ggml version's API cannot build (``Op.needs``), and why."""


def fields(op: str, P: Params, types: Mapping[str, int], version: GgmlVersion) -> Fields:
    """Op ``op``'s record fields for ``version``'s API (``P`` reads the tensor's parameters);
    ``NotInVersion`` where it cannot build the op."""
    entry = OPS[op]
    why = entry.unsupported(version)
    if why is not None:
        raise NotInVersion(why)
    return entry.record(P, types)

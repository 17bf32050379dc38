"""Shape inference for graph specs, following the constructors in ggml's ``ggml.c``.

Op parameters (``TensorSpec.params``), as the engine passes them to ggml: scale: ``scale``;
rms_norm: ``eps``; rope: ``n_dims``, ``mode`` (0); soft_max_ext: ``scale``, ``max_bias``;
flash_attn_ext: ``scale``, ``max_bias``, ``logit_softcap``; concat: ``dim``; view: ``ne``,
``nb`` (strides of dims 1..), ``offset``; reshape: ``ne``; permute: ``axes``; cont: ``ne``
(optional: ``ggml_cont_Nd``); argsort: ``order`` (0 ascending); clamp: ``min``, ``max``; glu:
``glu`` (``ggml_glu_op``: 0 reglu, 1 geglu, 2 swiglu, ...) and ``swapped``; pad: ``pad`` (the
eight paddings of ``ggml_pad_ext``); ssm_scan: ``k`` (states kept; 0.25.3); top_k: ``k``; fill: ``value``; cast: ``type``. ``inplace``: the
``_inplace`` constructor (``INPLACE``), whose result views its first source. Any op may carry
``op_params``: the tensor's ``op_params`` words as a graph captured from llama.cpp had them,
written over the constructor's (its rope frequencies, a matmul's precision).

One function per op computes the result's ``ne`` (elements per dim), ``nb`` (bytes per dim),
type and, for ops that return a view, which source the result views. Both the reference and
the real-engine target rely on these figures; the target checks them against what ggml built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Shape = tuple[int, int, int, int]

# ggml type name -> (block size, type size), from ggml.c's type_traits
TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "i32": (1, 4),
    "i64": (1, 8),
    "q8_0": (32, 34),
}

# ops whose result is a view of a source (ggml_is_view_op in ggml-backend.cpp)
VIEW_OPS = frozenset({"view", "reshape", "permute", "transpose"})


class SpecError(ValueError):
    """A graph spec that ggml would reject (bad shape, unknown op, cycle...)."""


@dataclass(frozen=True)
class Geometry:
    """Geometry of one tensor: its type, element counts, strides and view source."""

    type: str
    ne: Shape
    nb: Shape
    view_src: str | None = None  # name of the tensor whose memory this one views
    view_offs: int = 0


def contiguous_nb(type_: str, ne: Sequence[int]) -> Shape:
    """Strides of a contiguous tensor, as ``ggml_new_tensor_impl`` sets them."""
    blck, size = TYPES[type_]
    nb0 = size
    nb1 = nb0 * (ne[0] // blck)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def pad4(ne: Sequence[int]) -> Shape:
    # a loop, not any() over a generator: every tensor of every drawn graph comes through here
    n = len(ne)
    if not 1 <= n <= 4:
        raise SpecError(f"shape {list(ne)} must have 1 to 4 dims")
    for x in ne:
        if not isinstance(x, int) or x < 0:
            raise SpecError(f"shape {list(ne)} must hold integers of at least 0 (ggml allows empty tensors)")
    if n == 4:
        return (ne[0], ne[1], ne[2], ne[3])
    return (*ne, *_ONES[n])


_ONES = {1: (1, 1, 1), 2: (1, 1), 3: (1,)}


def new_tensor(type_: str, ne: Sequence[int]) -> Geometry:
    if type_ not in TYPES:
        raise SpecError(f"unknown type {type_!r}")
    shape = pad4(ne)
    if shape[0] % TYPES[type_][0]:
        raise SpecError(f"ne0 {shape[0]} is not a multiple of {type_}'s block size")
    return Geometry(type_, shape, contiguous_nb(type_, shape))


def nbytes(t: Geometry) -> int:
    """``ggml_nbytes``: the bytes spanned by a tensor, strides included (none for an empty one)."""
    if min(t.ne) <= 0:
        return 0
    blck, size = TYPES[t.type]
    if blck == 1:
        total = size
        for n, b in zip(t.ne, t.nb):
            total += (n - 1) * b
        return total
    total = t.ne[0] * t.nb[0] // blck
    for n, b in zip(t.ne[1:], t.nb[1:]):
        total += (n - 1) * b
    return total


def is_contiguous(t: Geometry) -> bool:
    return t.nb == contiguous_nb(t.type, t.ne)


def is_transposed(t: Geometry) -> bool:
    """``ggml_is_transposed``."""
    return t.nb[0] > t.nb[1]


def is_contiguous_rows(t: Geometry) -> bool:
    """``ggml_is_contiguous_rows``: elements of a row are adjacent."""
    return t.ne[0] == TYPES[t.type][0] or t.nb[0] == TYPES[t.type][1]


def nelements(t: Geometry) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise SpecError(msg)


def _same(a: Geometry) -> Geometry:
    return new_tensor(a.type, a.ne)


def _f32(ne: Sequence[int]) -> Geometry:
    return new_tensor("f32", ne)


def _view(name: str, src: Geometry, type_: str, ne: Sequence[int], nb: Sequence[int], offs: int = 0) -> Geometry:
    root = src.view_src or name
    return Geometry(type_, pad4(ne), (nb[0], nb[1], nb[2], nb[3]), root, src.view_offs + offs)


def _get_rows(a: Geometry, b: Geometry) -> Geometry:
    _check(b.type == "i32", "get_rows: indices must be i32")
    _check(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "get_rows: shapes do not match")
    return new_tensor("i32" if a.type == "i32" else "f32", (a.ne[0], b.ne[0], b.ne[1], b.ne[2]))


def _mul_mat(a: Geometry, b: Geometry) -> Geometry:
    _check(a.ne[0] == b.ne[0], f"mul_mat: ne0 differ ({a.ne[0]} vs {b.ne[0]})")
    _check(not is_transposed(a), "mul_mat: src0 is transposed")
    _check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat: cannot broadcast")
    _check(b.type == "f32", "mul_mat: src1 must be f32")
    return _f32((a.ne[1], b.ne[1], b.ne[2], b.ne[3]))


def _mul_mat_id(as_: Geometry, b: Geometry, ids: Geometry) -> Geometry:
    _check(ids.type == "i32", "mul_mat_id: ids must be i32")
    _check(not is_transposed(as_), "mul_mat_id: experts are transposed")
    _check(as_.ne[3] == 1 and b.ne[3] == 1 and ids.ne[2] == 1 and ids.ne[3] == 1, "mul_mat_id: must be 3d")
    _check(ids.ne[1] == b.ne[2], "mul_mat_id: ids.ne1 != b.ne2")
    _check(as_.ne[0] == b.ne[0], "mul_mat_id: ne0 differ")
    _check(ids.ne[0] % b.ne[1] == 0, "mul_mat_id: cannot broadcast")
    return _f32((as_.ne[1], ids.ne[0], b.ne[2], 1))


def _binary(a: Geometry, b: Geometry) -> Geometry:
    # ggml_can_repeat: an empty tensor repeats only to an empty one
    can = min(a.ne) == 0 if min(b.ne) == 0 else all(x % y == 0 for x, y in zip(a.ne, b.ne))
    _check(can, f"binary op: {b.ne} cannot repeat to {a.ne}")
    _check(a.type == "f32" and b.type == "f32", "binary op: f32 only")
    return _same(a)


def _unary(a: Geometry, op: str) -> Geometry:
    _check(a.type == "f32", "unary op: f32 only")
    # ggml_unary_impl asserts contiguous rows, ggml_scale_impl a padded 1d tensor: ask for both
    _check(op in ("rms_norm", "clamp") or is_contiguous(a), f"{op}: source must be contiguous")
    return _same(a)


def _rope(a: Geometry, pos: Geometry, freqs: Geometry | None) -> Geometry:
    _check(pos.type == "i32" and pos.ne[1:] == (1, 1, 1), "rope: positions must be an i32 vector")
    _check(a.ne[2] == pos.ne[0], f"rope: {a.ne[2]} tokens but {pos.ne[0]} positions")
    _check(freqs is None or freqs.type == "f32", "rope: freq factors must be f32")
    return _same(a)


def _soft_max_ext(a: Geometry, mask: Geometry | None) -> Geometry:
    _check(is_contiguous(a), "soft_max_ext: src must be contiguous")
    if mask is not None:
        _check(mask.type in ("f16", "f32") and is_contiguous(mask), "soft_max_ext: bad mask")
        _check(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1], "soft_max_ext: mask shape")
        _check(a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0, "soft_max_ext: mask broadcast")
    return _same(a)


def _flash_attn_ext(q: Geometry, k: Geometry, v: Geometry, mask: Geometry | None) -> Geometry:
    _check(k.ne[0] == q.ne[0] and q.ne[2] % k.ne[2] == 0, "flash_attn_ext: k/q mismatch")
    _check(q.ne[3] == k.ne[3] == v.ne[3], "flash_attn_ext: ne3 differ")
    if mask is not None:
        _check(mask.type == "f16" and is_contiguous(mask), "flash_attn_ext: mask must be contiguous f16")
        # ggml does not check it, and its kernels read a mask row of the kv length: shorter, they
        # read past the mask (garbage, then a NaN assert far away)
        _check(mask.ne[0] >= k.ne[1] and mask.ne[1] >= q.ne[1], "flash_attn_ext: mask smaller than kv length x tokens")
        _check(q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0, "flash_attn_ext: mask broadcast")
    return _f32((v.ne[0], q.ne[2], q.ne[1], q.ne[3]))


def _concat(a: Geometry, b: Geometry, dim: int) -> Geometry:
    _check(0 <= dim < 4 and a.type == b.type, "concat: bad dim or types")
    ne = list(a.ne)
    for d in range(4):
        if d == dim:
            ne[d] = a.ne[d] + b.ne[d]
        else:
            _check(a.ne[d] == b.ne[d], "concat: shapes differ outside dim")
    return new_tensor(a.type, ne)


def _sum_rows(a: Geometry) -> Geometry:
    """``ggml_sum_rows``: one element per row."""
    return new_tensor(a.type, (1, a.ne[1], a.ne[2], a.ne[3]))


def _argsort(a: Geometry) -> Geometry:
    """``ggml_argsort``: the i32 indices that sort each row."""
    return new_tensor("i32", a.ne)


def _glu(a: Geometry, b: Geometry | None) -> Geometry:
    """``ggml_glu_impl``: with ``b`` (``ggml_glu_split``) gate and value have one shape; without,
    the two halves of each row of ``a``."""
    _check(is_contiguous_rows(a), "glu: rows must be contiguous")
    if b is None:
        _check(a.ne[0] % 2 == 0, "glu: a row of odd length has no halves")
        return new_tensor(a.type, (a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3]))
    _check(a.ne == b.ne and a.type == b.type, "glu: gate and value differ in shape or type")
    return _same(a)


def _cont(a: Geometry, ne: Sequence[int] | None) -> Geometry:
    """``ggml_cont`` (``ggml_cont_Nd`` with ``ne``: the same elements in another shape)."""
    if ne is None:
        return _same(a)
    shape = pad4(ne)
    _check(shape[0] * shape[1] * shape[2] * shape[3] == nelements(a), "cont: element count differs")
    return new_tensor(a.type, shape)


def _pad(a: Geometry, pads: Sequence[int]) -> Geometry:
    """``ggml_pad_ext``: ``pads`` = (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)."""
    _check(len(pads) == 8 and min(pads) >= 0, "pad: eight paddings of at least 0")
    return new_tensor(a.type, tuple(a.ne[d] + pads[2 * d] + pads[2 * d + 1] for d in range(4)))


def _top_k(a: Geometry, k: int) -> Geometry:
    """``ggml_top_k`` (0.25.3's own op, GGML_OP_TOP_K): the i32 indices of each row's ``k`` largest."""
    _check(1 <= k <= a.ne[0], f"top_k: k {k} must be 1 .. {a.ne[0]}")
    return new_tensor("i32", (k, a.ne[1], a.ne[2], a.ne[3]))


def _argmax(a: Geometry) -> Geometry:
    """``ggml_argmax``: the i32 index of each row's largest element, of a matrix."""
    _check(a.ne[2] == a.ne[3] == 1, "argmax: a matrix only")
    return new_tensor("i32", (a.ne[1],))


def _ssm_conv(sx: Geometry, c: Geometry) -> Geometry:
    """``ggml_ssm_conv``: ``sx`` [d_conv - 1 + n_t, d_inner, n_s] by the kernels ``c`` [d_conv, d_inner]."""
    _check(sx.ne[3] == 1 and c.ne[2] == c.ne[3] == 1, "ssm_conv: sx is 3d, c a matrix")
    n_t = sx.ne[0] - c.ne[0] + 1
    _check(n_t >= 0 and sx.ne[1] == c.ne[1], "ssm_conv: shapes do not match")
    return _f32((c.ne[1], n_t, sx.ne[2]))


def _ssm_scan(s: Geometry, x: Geometry, dt: Geometry, a: Geometry, b: Geometry, c: Geometry, ids: Geometry, k: int) -> Geometry:
    """``ggml_ssm_scan``: y and the ``k`` last states, concatenated in one f32 vector."""
    _check(k >= 1 and ids.type == "i32" and b.ne == c.ne, "ssm_scan: K, ids or B/C shapes")
    _check(is_contiguous(s) and is_contiguous(dt) and is_contiguous(a), "ssm_scan: s, dt and A must be contiguous")
    _check(dt.ne[:3] == x.ne[1:4] and s.ne[1:3] == x.ne[0:2] and ids.ne[0] == x.ne[3], "ssm_scan: shapes do not match")
    return _f32((nelements(x) + k * s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0],))


# ops with an ``_inplace`` constructor that a captured graph may use: the result views src 0
INPLACE = frozenset({"scale", "add", "mul", "div", "silu", "fill", "rope"})


# op -> (number of args, which args may be None)
ARITY: dict[str, tuple[int, frozenset[int]]] = {
    "get_rows": (2, frozenset()),
    "mul_mat": (2, frozenset()),
    "mul_mat_id": (3, frozenset()),
    "add": (2, frozenset()),
    "mul": (2, frozenset()),
    "scale": (1, frozenset()),
    "rms_norm": (1, frozenset()),
    "rope": (3, frozenset({2})),
    "soft_max_ext": (2, frozenset({1})),
    "flash_attn_ext": (4, frozenset({3})),
    "silu": (1, frozenset()),
    "cpy": (2, frozenset()),
    "set_rows": (3, frozenset()),
    "view": (1, frozenset()),
    "view_tensor": (1, frozenset()),
    "reshape": (1, frozenset()),
    "permute": (1, frozenset()),
    "transpose": (1, frozenset()),
    "cont": (1, frozenset()),
    "dup": (1, frozenset()),
    "concat": (2, frozenset()),
    "div": (2, frozenset()),
    "sum_rows": (1, frozenset()),
    "argsort": (1, frozenset()),
    "clamp": (1, frozenset()),
    "glu": (2, frozenset({1})),
    "pad": (1, frozenset()),
    "argmax": (1, frozenset()),
    "top_k": (1, frozenset()),
    "sub": (2, frozenset()),
    "sum": (1, frozenset()),
    "log": (1, frozenset()),
    "exp": (1, frozenset()),
    "sigmoid": (1, frozenset()),
    "step": (1, frozenset()),
    "relu": (1, frozenset()),
    "sqr": (1, frozenset()),
    "cumsum": (1, frozenset()),
    "fill": (1, frozenset()),
    "cast": (1, frozenset()),
    "ssm_conv": (2, frozenset()),
    "ssm_scan": (7, frozenset()),
}
OPS = frozenset(ARITY)
# what ``ggml_op_name`` calls each op's node (silu is a unary op)
GGML_OP_NAMES: dict[str, str] = {
    op: {"silu": "UNARY", "exp": "UNARY", "sigmoid": "UNARY", "step": "UNARY", "relu": "UNARY", "soft_max_ext": "SOFT_MAX", "view_tensor": "NONE", "cast": "CPY"}.get(op, op.upper())
    for op in OPS
} | {"none": "NONE"}
# ``ggml_view_tensor`` keeps op NONE and no src: ggml's graph makes it a leaf that views a tensor
LEAF_VIEW_OPS = frozenset({"view_tensor"})


CAST_SELF = "\0self"  # in ggml_srcs("cast", ...): the tensor itself


def ggml_srcs(op: str, args: Sequence[str | None]) -> tuple[str | None, ...]:
    """The ``src[]`` array ggml's constructor stores for an op, given its arguments in call order.

    ``ggml_set_rows(a, b, c)`` stores ``{b, c, a}``; ``ggml_view_tensor(a)`` none (``a`` is only
    its view source); every other op here stores its arguments in order (absent optional ones
    as NULL).
    """
    if op == "set_rows":
        return (args[1], args[2], args[0])
    if op == "cast":  # ggml_cast: a CPY whose src[1] is the result itself (TensorSpec.srcs names it)
        return (args[0], CAST_SELF)
    if op in LEAF_VIEW_OPS:
        return ()
    return tuple(args)


def infer(op: str, args: Sequence[Geometry | None], names: Sequence[str | None], params: Mapping[str, object]) -> Geometry:
    """Result layout of ``op`` applied to ``args`` (each a ``Geometry`` or None) named ``names``."""
    if op not in ARITY:
        raise SpecError(f"unknown op {op!r}")
    n, optional = ARITY[op]
    if len(args) != n:
        raise SpecError(f"{op} takes {n} sources, got {len(args)}")
    for i, a in enumerate(args):
        if a is None and i not in optional:
            raise SpecError(f"{op}: source {i} is required")
    a = args[0]
    assert a is not None
    if params.get("inplace"):
        _check(op in INPLACE, f"{op}: no in-place form")
        infer(op, args, names, {k: v for k, v in params.items() if k != "inplace"})
        return _view(str(names[0]), a, a.type, a.ne, a.nb)
    return INFER[op](a, args, names, params)


def _cumsum(a: Geometry) -> Geometry:
    _check(a.type == "f32", "cumsum: f32 only")
    return _same(a)


def _fill(a: Geometry) -> Geometry:
    _check(a.type in ("f32", "f16"), "fill: f32 only")
    _check(is_contiguous(a), "fill: source must be contiguous")
    return _same(a)


def _cpy(a: Geometry, b: Geometry | None, dst: str) -> Geometry:
    assert b is not None
    _check(nelements(a) == nelements(b), "cpy: element counts differ")
    return _view(dst, b, b.type, b.ne, b.nb)


def _set_rows(a: Geometry, b: Geometry | None, c: Geometry | None, dst: str) -> Geometry:
    assert b is not None and c is not None
    _check(a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "set_rows: shapes")
    _check(b.ne[1] == c.ne[0] and c.ne[3] == 1, "set_rows: index count")
    _check(b.type == "f32" and c.type in ("i32", "i64"), "set_rows: types")
    _check(is_contiguous_rows(a) and is_contiguous_rows(b), "set_rows: rows must be contiguous")
    return _view(dst, a, a.type, a.ne, a.nb)


# what each op makes of its first source ``a``, its sources, their names and its parameters
Inferrer = Callable[[Geometry, Sequence["Geometry | None"], Sequence["str | None"], Mapping[str, object]], Geometry]


def _unary_of(op: str) -> Inferrer:
    return lambda a, args, names, p: _unary(a, op)


def _view_of(op: str) -> Inferrer:
    return lambda a, args, names, p: _view_op(op, a, str(names[0]), p)


INFER: dict[str, Inferrer] = {
    "pad": lambda a, args, names, p: _pad(a, [int(x) for x in p["pad"]]),  # type: ignore[attr-defined]
    "argmax": lambda a, args, names, p: _argmax(a),
    "top_k": lambda a, args, names, p: _top_k(a, int(p["k"])),  # type: ignore[call-overload]
    "ssm_conv": lambda a, args, names, p: _ssm_conv(a, args[1]),  # type: ignore[arg-type]
    "ssm_scan": lambda a, args, names, p: _ssm_scan(a, *args[1:], k=int(p.get("k", 1))),  # type: ignore[arg-type,call-overload]
    "get_rows": lambda a, args, names, p: _get_rows(a, args[1]),  # type: ignore[arg-type]
    "mul_mat": lambda a, args, names, p: _mul_mat(a, args[1]),  # type: ignore[arg-type]
    "mul_mat_id": lambda a, args, names, p: _mul_mat_id(a, args[1], args[2]),  # type: ignore[arg-type]
    **{op: (lambda a, args, names, p: _binary(a, args[1])) for op in ("add", "mul", "div", "sub")},  # type: ignore[arg-type]
    "sum": lambda a, args, names, p: new_tensor(a.type, (1,)),
    "cast": lambda a, args, names, p: new_tensor(str(p["type"]), a.ne),
    "cumsum": lambda a, args, names, p: _cumsum(a),
    "fill": lambda a, args, names, p: _fill(a),
    "sum_rows": lambda a, args, names, p: _sum_rows(a),
    "argsort": lambda a, args, names, p: _argsort(a),
    "glu": lambda a, args, names, p: _glu(a, args[1]),
    **{op: _unary_of(op) for op in ("scale", "rms_norm", "silu", "clamp", "log", "exp", "sigmoid", "step", "relu", "sqr")},
    "rope": lambda a, args, names, p: _rope(a, args[1], args[2]),  # type: ignore[arg-type]
    "soft_max_ext": lambda a, args, names, p: _soft_max_ext(a, args[1]),
    "flash_attn_ext": lambda a, args, names, p: _flash_attn_ext(a, args[1], args[2], args[3]),  # type: ignore[arg-type]
    "concat": lambda a, args, names, p: _concat(a, args[1], int(p.get("dim", 0))),  # type: ignore[arg-type,call-overload]
    "dup": lambda a, args, names, p: _same(a),  # ggml_dup: ggml_dup_tensor of its source, a contiguous copy
    "cont": lambda a, args, names, p: _cont(a, p.get("ne")),  # type: ignore[arg-type]
    "view_tensor": lambda a, args, names, p: _view(str(names[0]), a, a.type, a.ne, a.nb),
    "cpy": lambda a, args, names, p: _cpy(a, args[1], str(names[1])),
    "set_rows": lambda a, args, names, p: _set_rows(a, args[1], args[2], str(names[0])),
    **{op: _view_of(op) for op in ("reshape", "transpose", "permute", "view")},
}
if set(INFER) != set(ARITY):
    raise ImportError(f"ops without an inferrer, or inferrers of no op: {sorted(set(INFER) ^ set(ARITY))}")


def _view_op(op: str, a: Geometry, src: str, params: Mapping[str, object]) -> Geometry:
    if op == "reshape":
        _check(is_contiguous(a), "reshape: source must be contiguous")
        ne = pad4(params["ne"])  # type: ignore[arg-type]
        _check(ne[0] * ne[1] * ne[2] * ne[3] == nelements(a), "reshape: element count differs")
        return _view(src, a, a.type, ne, contiguous_nb(a.type, ne))
    if op == "transpose":
        return _view(src, a, a.type, (a.ne[1], a.ne[0], a.ne[2], a.ne[3]), (a.nb[1], a.nb[0], a.nb[2], a.nb[3]))
    if op == "permute":
        axes = [int(x) for x in params["axes"]]  # type: ignore[attr-defined]
        _check(sorted(axes) == [0, 1, 2, 3], f"permute: bad axes {axes}")
        pne, pnb = [0] * 4, [0] * 4
        for i, ax in enumerate(axes):
            pne[ax], pnb[ax] = a.ne[i], a.nb[i]
        return _view(src, a, a.type, pne, pnb)
    # view: ne (1..4 dims), nb for dims 1.. and a byte offset, like ggml_view_Nd
    ne = pad4(params["ne"])  # type: ignore[arg-type]
    dims = len(params["ne"])  # type: ignore[arg-type]
    strides = [int(x) for x in params.get("nb", [])]  # type: ignore[attr-defined]
    _check(len(strides) == dims - 1, "view: needs one stride per dim after the first")
    nb = [TYPES[a.type][1]] + strides
    while len(nb) < 4:
        nb.append(nb[-1] * ne[len(nb) - 1])
    offs = int(params.get("offset", 0))  # type: ignore[call-overload]
    view = _view(src, a, a.type, ne, nb, offs)
    _check(nbytes(view) == 0 or offs + nbytes(view) <= nbytes(a), "view: out of the source's bounds")  # ggml_view_impl
    return view


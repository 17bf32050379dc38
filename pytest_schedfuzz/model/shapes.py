"""Shape inference for graph specs, following the constructors in ggml's ``ggml.c``.

Op parameters (``TensorSpec.params``), as the engine passes them to ggml: scale: ``scale``;
rms_norm: ``eps``; rope: ``n_dims``, ``mode`` (0); soft_max_ext: ``scale``, ``max_bias``;
flash_attn_ext: ``scale``, ``max_bias``, ``logit_softcap``; concat: ``dim``; view: ``ne``,
``nb`` (strides of dims 1..), ``offset``; reshape: ``ne``; permute: ``axes``; cont: ``ne``
(optional: ``ggml_cont_Nd``); argsort: ``order`` (0 ascending); clamp: ``min``, ``max``; glu:
``glu`` (``ggml_glu_op``: 0 reglu, 1 geglu, 2 swiglu, ...) and ``swapped``; pad: ``pad`` (the
eight paddings of ``ggml_pad_ext``); ssm_scan: ``k`` (states kept; 0.25.3); top_k: ``k``; fill: ``value``; cast: ``type``. ``inplace``: the
``_inplace`` constructor (``ops.INPLACE``), whose result views its first source. Any op may carry
``op_params``: the tensor's ``op_params`` words as a graph captured from llama.cpp had them,
written over the constructor's (its rope frequencies, a matmul's precision).

One function per op (named for it; ``ops.OPS`` says which is whose) computes the result's ``ne``
(elements per dim), ``nb`` (bytes per dim), type and, for ops that return a view, which source
the result views. Both the reference and the real-engine target rely on these figures; the target
checks them against what ggml built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

CAST_SELF = "\0self"  # in ops.ggml_srcs("cast", ...): the tensor itself


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


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise SpecError(msg)


def same(a: Geometry) -> Geometry:
    return new_tensor(a.type, a.ne)


def _f32(ne: Sequence[int]) -> Geometry:
    return new_tensor("f32", ne)


def view(name: str, src: Geometry, type_: str, ne: Sequence[int], nb: Sequence[int], offs: int = 0) -> Geometry:
    root = src.view_src or name
    return Geometry(type_, pad4(ne), (nb[0], nb[1], nb[2], nb[3]), root, src.view_offs + offs)


def get_rows(a: Geometry, b: Geometry) -> Geometry:
    check(b.type == "i32", "get_rows: indices must be i32")
    check(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "get_rows: shapes do not match")
    return new_tensor("i32" if a.type == "i32" else "f32", (a.ne[0], b.ne[0], b.ne[1], b.ne[2]))


def mul_mat(a: Geometry, b: Geometry) -> Geometry:
    check(a.ne[0] == b.ne[0], f"mul_mat: ne0 differ ({a.ne[0]} vs {b.ne[0]})")
    check(not is_transposed(a), "mul_mat: src0 is transposed")
    check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat: cannot broadcast")
    check(b.type == "f32", "mul_mat: src1 must be f32")
    return _f32((a.ne[1], b.ne[1], b.ne[2], b.ne[3]))


def mul_mat_id(as_: Geometry, b: Geometry, ids: Geometry) -> Geometry:
    check(ids.type == "i32", "mul_mat_id: ids must be i32")
    check(not is_transposed(as_), "mul_mat_id: experts are transposed")
    check(as_.ne[3] == 1 and b.ne[3] == 1 and ids.ne[2] == 1 and ids.ne[3] == 1, "mul_mat_id: must be 3d")
    check(ids.ne[1] == b.ne[2], "mul_mat_id: ids.ne1 != b.ne2")
    check(as_.ne[0] == b.ne[0], "mul_mat_id: ne0 differ")
    check(ids.ne[0] % b.ne[1] == 0, "mul_mat_id: cannot broadcast")
    return _f32((as_.ne[1], ids.ne[0], b.ne[2], 1))


def binary(a: Geometry, b: Geometry) -> Geometry:
    # ggml_can_repeat: an empty tensor repeats only to an empty one
    can = min(a.ne) == 0 if min(b.ne) == 0 else all(x % y == 0 for x, y in zip(a.ne, b.ne))
    check(can, f"binary op: {b.ne} cannot repeat to {a.ne}")
    check(a.type == "f32" and b.type == "f32", "binary op: f32 only")
    return same(a)


def unary(a: Geometry, op: str) -> Geometry:
    check(a.type == "f32", "unary op: f32 only")
    # ggml_unary_impl asserts contiguous rows, ggml_scale_impl a padded 1d tensor: ask for both
    check(op in ("rms_norm", "clamp") or is_contiguous(a), f"{op}: source must be contiguous")
    return same(a)


def rope(a: Geometry, pos: Geometry, freqs: Geometry | None) -> Geometry:
    check(pos.type == "i32" and pos.ne[1:] == (1, 1, 1), "rope: positions must be an i32 vector")
    check(a.ne[2] == pos.ne[0], f"rope: {a.ne[2]} tokens but {pos.ne[0]} positions")
    check(freqs is None or freqs.type == "f32", "rope: freq factors must be f32")
    return same(a)


def soft_max_ext(a: Geometry, mask: Geometry | None) -> Geometry:
    check(is_contiguous(a), "soft_max_ext: src must be contiguous")
    if mask is not None:
        check(mask.type in ("f16", "f32") and is_contiguous(mask), "soft_max_ext: bad mask")
        check(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1], "soft_max_ext: mask shape")
        check(a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0, "soft_max_ext: mask broadcast")
    return same(a)


def flash_attn_ext(q: Geometry, k: Geometry, v: Geometry, mask: Geometry | None) -> Geometry:
    check(k.ne[0] == q.ne[0] and q.ne[2] % k.ne[2] == 0, "flash_attn_ext: k/q mismatch")
    check(q.ne[3] == k.ne[3] == v.ne[3], "flash_attn_ext: ne3 differ")
    if mask is not None:
        check(mask.type == "f16" and is_contiguous(mask), "flash_attn_ext: mask must be contiguous f16")
        # ggml does not check it, and its kernels read a mask row of the kv length: shorter, they
        # read past the mask (garbage, then a NaN assert far away)
        check(mask.ne[0] >= k.ne[1] and mask.ne[1] >= q.ne[1], "flash_attn_ext: mask smaller than kv length x tokens")
        check(q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0, "flash_attn_ext: mask broadcast")
    return _f32((v.ne[0], q.ne[2], q.ne[1], q.ne[3]))


def concat(a: Geometry, b: Geometry, dim: int) -> Geometry:
    check(0 <= dim < 4 and a.type == b.type, "concat: bad dim or types")
    ne = list(a.ne)
    for d in range(4):
        if d == dim:
            ne[d] = a.ne[d] + b.ne[d]
        else:
            check(a.ne[d] == b.ne[d], "concat: shapes differ outside dim")
    return new_tensor(a.type, ne)


def sum_rows(a: Geometry) -> Geometry:
    """``ggml_sum_rows``: one element per row."""
    return new_tensor(a.type, (1, a.ne[1], a.ne[2], a.ne[3]))


def argsort(a: Geometry) -> Geometry:
    """``ggml_argsort``: the i32 indices that sort each row."""
    return new_tensor("i32", a.ne)


def glu(a: Geometry, b: Geometry | None) -> Geometry:
    """``ggml_glu_impl``: with ``b`` (``ggml_glu_split``) gate and value have one shape; without,
    the two halves of each row of ``a``."""
    check(is_contiguous_rows(a), "glu: rows must be contiguous")
    if b is None:
        check(a.ne[0] % 2 == 0, "glu: a row of odd length has no halves")
        return new_tensor(a.type, (a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3]))
    check(a.ne == b.ne and a.type == b.type, "glu: gate and value differ in shape or type")
    return same(a)


def cont(a: Geometry, ne: Sequence[int] | None) -> Geometry:
    """``ggml_cont`` (``ggml_cont_Nd`` with ``ne``: the same elements in another shape)."""
    if ne is None:
        return same(a)
    shape = pad4(ne)
    check(shape[0] * shape[1] * shape[2] * shape[3] == nelements(a), "cont: element count differs")
    return new_tensor(a.type, shape)


def pad(a: Geometry, pads: Sequence[int]) -> Geometry:
    """``ggml_pad_ext``: ``pads`` = (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)."""
    check(len(pads) == 8 and min(pads) >= 0, "pad: eight paddings of at least 0")
    return new_tensor(a.type, tuple(a.ne[d] + pads[2 * d] + pads[2 * d + 1] for d in range(4)))


def top_k(a: Geometry, k: int) -> Geometry:
    """``ggml_top_k`` (0.25.3's own op, GGML_OP_TOP_K): the i32 indices of each row's ``k`` largest."""
    check(1 <= k <= a.ne[0], f"top_k: k {k} must be 1 .. {a.ne[0]}")
    return new_tensor("i32", (k, a.ne[1], a.ne[2], a.ne[3]))


def argmax(a: Geometry) -> Geometry:
    """``ggml_argmax``: the i32 index of each row's largest element, of a matrix."""
    check(a.ne[2] == a.ne[3] == 1, "argmax: a matrix only")
    return new_tensor("i32", (a.ne[1],))


def ssm_conv(sx: Geometry, c: Geometry) -> Geometry:
    """``ggml_ssm_conv``: ``sx`` [d_conv - 1 + n_t, d_inner, n_s] by the kernels ``c`` [d_conv, d_inner]."""
    check(sx.ne[3] == 1 and c.ne[2] == c.ne[3] == 1, "ssm_conv: sx is 3d, c a matrix")
    n_t = sx.ne[0] - c.ne[0] + 1
    check(n_t >= 0 and sx.ne[1] == c.ne[1], "ssm_conv: shapes do not match")
    return _f32((c.ne[1], n_t, sx.ne[2]))


def ssm_scan(s: Geometry, x: Geometry, dt: Geometry, a: Geometry, b: Geometry, c: Geometry, ids: Geometry, k: int) -> Geometry:
    """``ggml_ssm_scan``: y and the ``k`` last states, concatenated in one f32 vector."""
    check(k >= 1 and ids.type == "i32" and b.ne == c.ne, "ssm_scan: K, ids or B/C shapes")
    check(is_contiguous(s) and is_contiguous(dt) and is_contiguous(a), "ssm_scan: s, dt and A must be contiguous")
    check(dt.ne[:3] == x.ne[1:4] and s.ne[1:3] == x.ne[0:2] and ids.ne[0] == x.ne[3], "ssm_scan: shapes do not match")
    return _f32((nelements(x) + k * s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0],))


def cumsum(a: Geometry) -> Geometry:
    check(a.type == "f32", "cumsum: f32 only")
    return same(a)


def fill(a: Geometry) -> Geometry:
    check(a.type in ("f32", "f16"), "fill: f32 only")
    check(is_contiguous(a), "fill: source must be contiguous")
    return same(a)


def cpy(a: Geometry, b: Geometry | None, dst: str) -> Geometry:
    assert b is not None
    check(nelements(a) == nelements(b), "cpy: element counts differ")
    return view(dst, b, b.type, b.ne, b.nb)


def set_rows(a: Geometry, b: Geometry | None, c: Geometry | None, dst: str) -> Geometry:
    assert b is not None and c is not None
    check(a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "set_rows: shapes")
    check(b.ne[1] == c.ne[0] and c.ne[3] == 1, "set_rows: index count")
    check(b.type == "f32" and c.type in ("i32", "i64"), "set_rows: types")
    check(is_contiguous_rows(a) and is_contiguous_rows(b), "set_rows: rows must be contiguous")
    return view(dst, a, a.type, a.ne, a.nb)


def view_op(op: str, a: Geometry, src: str, params: Mapping[str, object]) -> Geometry:
    if op == "reshape":
        check(is_contiguous(a), "reshape: source must be contiguous")
        ne = pad4(params["ne"])  # type: ignore[arg-type]
        check(ne[0] * ne[1] * ne[2] * ne[3] == nelements(a), "reshape: element count differs")
        return view(src, a, a.type, ne, contiguous_nb(a.type, ne))
    if op == "transpose":
        return view(src, a, a.type, (a.ne[1], a.ne[0], a.ne[2], a.ne[3]), (a.nb[1], a.nb[0], a.nb[2], a.nb[3]))
    if op == "permute":
        axes = [int(x) for x in params["axes"]]  # type: ignore[attr-defined]
        check(sorted(axes) == [0, 1, 2, 3], f"permute: bad axes {axes}")
        pne, pnb = [0] * 4, [0] * 4
        for i, ax in enumerate(axes):
            pne[ax], pnb[ax] = a.ne[i], a.nb[i]
        return view(src, a, a.type, pne, pnb)
    # view: ne (1..4 dims), nb for dims 1.. and a byte offset, like ggml_view_Nd
    ne = pad4(params["ne"])  # type: ignore[arg-type]
    dims = len(params["ne"])  # type: ignore[arg-type]
    strides = [int(x) for x in params.get("nb", [])]  # type: ignore[attr-defined]
    check(len(strides) == dims - 1, "view: needs one stride per dim after the first")
    nb = [TYPES[a.type][1]] + strides
    while len(nb) < 4:
        nb.append(nb[-1] * ne[len(nb) - 1])
    offs = int(params.get("offset", 0))  # type: ignore[call-overload]
    out = view(src, a, a.type, ne, nb, offs)
    check(nbytes(out) == 0 or offs + nbytes(out) <= nbytes(a), "view: out of the source's bounds")  # ggml_view_impl
    return out


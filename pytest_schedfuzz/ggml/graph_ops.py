"""``graph.c``'s op-dependent C, written from the ops' table (``model.ops.OPS``): the constructors
the ops call (``OP_FNS``), the ops in ``program.GraphProgram.OPS``'s order (``OPS``), and
``construct``, which builds a record by the first of its op's builds whose condition holds.
``build.build_helpers`` writes both headers beside the sources it compiles."""

from __future__ import annotations

from ..model import ops

# how graph.c passes a build's token (``ops``' docstring) and the letter of its type in a signature's
# name: letter -> (C expression of index k, signature letter)
TOKENS: dict[str, tuple[str, str]] = {
    "a": ("a[{k}]", "t"),
    "i": ("(int)p[{k}]", "i"),
    "t": ("(int)p[{k}]", "i"),
    "b": ("p[{k}] != 0", "b"),
    "l": ("p[{k}]", "l"),
    "z": ("(size_t)p[{k}]", "z"),
    "f": ("(float)f[{k}]", "f"),
    "n": ("r[R_NE + {k}]", "l"),
}
# the C type of each letter of a signature's name
SIGNATURE_TYPES = {"t": "T *", "i": "int", "b": "bool", "l": "int64_t", "z": "size_t", "f": "float"}
if set(TOKENS) != set(ops.TOKEN_LETTERS):
    raise ImportError(f"graph_ops.TOKENS and ops.TOKEN_LETTERS differ: {sorted(set(TOKENS) ^ set(ops.TOKEN_LETTERS))}")


def _letter(tok: str) -> str:
    kind = ops.token(tok)
    if kind is not None:
        return TOKENS[kind[0]][1]
    return "f" if tok.endswith("f") and "." in tok else "i"  # a literal: 1.0f, or an int


def signature(build: ops.Build) -> str:
    """The name of its constructor's function-pointer type: its arguments after the context."""
    return "s_" + "".join(_letter(t) for t in build.args)


def _c_args(build: ops.Build) -> str:
    out = []
    for tok in build.args:
        kind = ops.token(tok)
        out.append(TOKENS[kind[0]][0].format(k=kind[1]) if kind is not None else tok)
    return ", ".join(out)


def constructors() -> list[str]:
    """Every constructor an op's build calls, in the table's order, once each."""
    return list(dict.fromkeys(b.fn for op in ops.OPS.values() for b in op.builds))


def lists_header() -> str:
    """``schedfuzz_graph_ops.h``: ``OP_FNS`` and ``OPS``."""
    fns = " ".join(f"X({fn})" for fn in constructors())
    names = " ".join(f"X({name})" for name in ("leaf", "persistent", *ops.OPS))
    return f"/* written by ggml/graph_ops.py from model/ops.py: do not edit */\n#define OP_FNS(X) {fns}\n#define OPS(X) {names}\n"


def construct_header() -> str:
    """``schedfuzz_graph_construct.h``: the signatures and ``construct``."""
    builds = [b for op in ops.OPS.values() for b in op.builds]
    sigs = dict.fromkeys(signature(b) for b in builds)
    lines = ["/* written by ggml/graph_ops.py from model/ops.py: do not edit */"]
    for sig in sigs:
        params = ", ".join(["C *", *(SIGNATURE_TYPES[c] for c in sig[2:])])
        lines.append(f"typedef T *(*{sig})({params});")
    lines += ["static T *construct(C *ctx, const int64_t *r, const double *f, T *const *a, int *missing) {",
              "    const int64_t *p = r + R_INTS;",
              "    int inplace = (r[R_FLAGS] & FLAG_INPLACE) != 0;",
              "    (void)p; (void)f; (void)inplace;",
              "    switch (r[R_OP]) {"]
    for op in ops.OPS.values():
        lines.append(f"    case OP_{op.name}:")
        for b in op.builds:
            call = f"return CALL({b.fn}, {signature(b)}, ctx, {_c_args(b)});"
            lines.append(f"        if ({ops.WHEN[b.when][0]}) {call}" if b.when else f"        {call}")
        if op.builds[-1].when:
            lines.append("        break;")
    lines += ["    default:", "        break;", "    }", "    *missing = BUILD_BAD_OP;", "    return NULL;", "}", ""]
    return "\n".join(lines)


HEADERS = {"schedfuzz_graph_ops.h": lists_header, "schedfuzz_graph_construct.h": construct_header}

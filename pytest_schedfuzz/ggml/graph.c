/* A graph spec's tensors made by ggml's own constructors, in C (``ggml.program.GraphProgram``).
 *
 * The worker encodes a spec once, as a program of fixed-size records (one per tensor, in spec
 * order), and ``schedfuzz_graph_build`` runs it at every step that schedules the graph: each
 * record calls the constructor ggml-python would have called for it (``ggml_new_tensor``,
 * ``ggml_mul_mat``, ``ggml_rope_ext``...), names the result (``ggml_set_name``), flags it
 * (``ggml_set_input``, ``ggml_set_output``), writes the spec's ``op_params`` words over the
 * constructor's, and compares the tensor ggml made with the geometry the spec's shape inference
 * gave (type, ne, nb, view source, view offset). The roots then go to
 * ``ggml_build_forward_expand`` in order. Through ctypes each tensor cost about 15 us.
 *
 * No ggml header is needed, so that one build serves every ggml: the constructors are handed
 * in as pointers (looked up by name in the loaded library, NULL where it has none: a record
 * that needs one is then refused), and the offsets of the ``ggml_tensor`` fields read or
 * written, from ggml-python's struct, which the worker checks against the library.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef void T; /* struct ggml_tensor */
typedef void C; /* struct ggml_context */

/* The ops' constructors and the ops, written from ``model/ops.py``'s table by ``ggml/graph_ops.py``
 * (``OP_FNS``, ``OPS``; ``construct`` below). */
#include "schedfuzz_graph_ops.h"

/* The constructors, in the order the worker hands them in (``schedfuzz_graph_fn_names``). */
#define FNS(X) \
    X(ggml_new_tensor) X(ggml_set_name) X(ggml_set_input) X(ggml_set_output) \
    X(ggml_new_graph_custom) X(ggml_build_forward_expand) OP_FNS(X)

#define ENUM(name) F_##name,
#define NAME(name) #name ","
enum { FNS(ENUM) N_FNS };
static void *fns[N_FNS];

/* The ops a record may build, in the order of ``program.GraphProgram.OPS`` (checked at load). */
#define OP_ENUM(name) OP_##name,
enum { OPS(OP_ENUM) N_OPS };

/* One record: int64 words, then REAL_WORDS doubles in a parallel array. */
enum {
    R_OP, R_TYPE, R_NDIMS, R_NE, /* 4 */
    R_ARGS = R_NE + 4,          /* 8 program indices, -1: NULL */
    R_FLAGS = R_ARGS + 8,
    R_INTS,                     /* 8 integer parameters */
    R_PTR = R_INTS + 8,         /* persistent: the tensor; else the offset of its name in the names */
    R_WORDS,                    /* offset of its op_params words in the words, -1: none */
    R_N_WORDS,
    R_GEO,                      /* type, ne[4], nb[4], view source (program index, -1: none), view offset */
    RECORD_WORDS = R_GEO + 11,
    REAL_WORDS = 4,
};
enum { FLAG_INPUT = 1, FLAG_OUTPUT = 2, FLAG_INPLACE = 4, FLAG_VERSION_K = 8, FLAG_NAME = 16 };
/* build results besides a tensor index */
enum { BUILD_OK = -1, BUILD_NULL = -2, BUILD_MISSING = -3, BUILD_BAD_OP = -4 };

/* ggml_tensor field offsets, as ggml-python lays the struct out */
enum { OFF_TYPE, OFF_NE, OFF_NB, OFF_OP_PARAMS, OFF_VIEW_SRC, OFF_VIEW_OFFS, N_OFFS };
static size_t offs[N_OFFS];
static int op_params_words;

const char *schedfuzz_graph_fn_names(void) { return FNS(NAME); }
#define OP_NAME(name) #name ","
const char *schedfuzz_graph_op_names(void) { return OPS(OP_NAME); }
int schedfuzz_graph_record_words(void) { return RECORD_WORDS; }

void schedfuzz_graph_init(void *const *fn_pointers, const size_t *offsets, int n_op_params_words) {
    memcpy(fns, fn_pointers, sizeof fns);
    memcpy(offs, offsets, sizeof offs);
    op_params_words = n_op_params_words;
}

#define FIELD(t, off, type) ((type *)((char *)(t) + offs[off]))
#define CALL(name, sig, ...) (fns[F_##name] ? ((sig)fns[F_##name])(__VA_ARGS__) : (*missing = F_##name, (T *)0))

/* ``construct``: what record ``r`` builds over its arguments ``a``, by the first of its op's builds
 * whose condition holds; NULL (``*missing`` set where a constructor is absent from this ggml) if
 * nothing. */
#include "schedfuzz_graph_construct.h"

/* Whether tensor ``t`` has the geometry record ``g`` holds (``tensors`` to name its view source). */
static int same_geometry(T *t, const int64_t *g, T *const *tensors) {
    if (*FIELD(t, OFF_TYPE, int) != g[0])
        return 0;
    for (int i = 0; i < 4; i++)
        if (FIELD(t, OFF_NE, int64_t)[i] != g[1 + i] || (int64_t)FIELD(t, OFF_NB, size_t)[i] != g[5 + i])
            return 0;
    T *view_src = *FIELD(t, OFF_VIEW_SRC, T *);
    if (g[9] < 0)
        return view_src == NULL;
    return view_src == tensors[g[9]] && (int64_t)*FIELD(t, OFF_VIEW_OFFS, size_t) == g[10];
}

/* Run the program's ``n`` records in ``ctx`` into ``tensors``, then make the graph of ``roots``
 * (a ``ggml_new_graph_custom`` of ``graph_size``) into ``*graph``. Returns BUILD_OK; or the index
 * of the first record whose tensor ggml made with another geometry than the spec's (the graph is
 * then not made); or BUILD_NULL / BUILD_MISSING / BUILD_BAD_OP with ``*failed`` the record's
 * index (and ``*missing`` the constructor absent from this ggml). */
int schedfuzz_graph_build(C *ctx, const int64_t *program, const double *reals, int n, const char *names, const int32_t *words,
                          const int32_t *roots, int n_roots, size_t graph_size, T **tensors, void **graph, int *failed, int *missing) {
    *graph = NULL;
    for (int i = 0; i < n; i++) {
        const int64_t *r = program + (size_t)i * RECORD_WORDS;
        T *a[8];
        for (int k = 0; k < 8; k++)
            a[k] = r[R_ARGS + k] >= 0 ? tensors[r[R_ARGS + k]] : NULL;
        T *t;
        *missing = -1;
        if (r[R_OP] == OP_persistent)
            t = (T *)(intptr_t)r[R_PTR];
        else if (r[R_OP] == OP_leaf)
            t = ((T * (*)(C *, int, int, const int64_t *)) fns[F_ggml_new_tensor])(ctx, (int)r[R_TYPE], (int)r[R_NDIMS], r + R_NE);
        else
            t = construct(ctx, r, reals + (size_t)i * REAL_WORDS, a, missing);
        if (t == NULL) {
            *failed = i;
            return *missing == BUILD_BAD_OP ? BUILD_BAD_OP : *missing >= 0 ? BUILD_MISSING : BUILD_NULL;
        }
        tensors[i] = t;
        if (r[R_FLAGS] & FLAG_NAME)
            ((T * (*)(T *, const char *)) fns[F_ggml_set_name])(t, names + r[R_PTR]);
        if (r[R_FLAGS] & FLAG_INPUT)
            ((void (*)(T *))fns[F_ggml_set_input])(t);
        if (r[R_FLAGS] & FLAG_OUTPUT)
            ((void (*)(T *))fns[F_ggml_set_output])(t);
        if (r[R_WORDS] >= 0) {
            int32_t *params = FIELD(t, OFF_OP_PARAMS, int32_t);
            for (int k = 0; k < op_params_words; k++)
                params[k] = k < r[R_N_WORDS] ? words[r[R_WORDS] + k] : 0;
        }
        if (!same_geometry(t, r + R_GEO, tensors))
            return i;
    }
    void *gf = ((void *(*)(C *, size_t, bool))fns[F_ggml_new_graph_custom])(ctx, graph_size, false);
    if (gf == NULL) {
        *failed = n;
        return BUILD_NULL;
    }
    for (int k = 0; k < n_roots; k++)
        ((void (*)(void *, T *))fns[F_ggml_build_forward_expand])(gf, tensors[roots[k]]);
    *graph = gf;
    return BUILD_OK;
}

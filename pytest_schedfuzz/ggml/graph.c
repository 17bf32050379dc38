/* A graph spec's tensors made by ggml's own constructors, in C (``ggml.engine.GraphProgram``).
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

/* The constructors, in the order the worker hands them in (``schedfuzz_graph_fn_names``). */
#define FNS(X) \
    X(ggml_new_tensor) X(ggml_set_name) X(ggml_set_input) X(ggml_set_output) \
    X(ggml_new_graph_custom) X(ggml_build_forward_expand) \
    X(ggml_fill) X(ggml_fill_inplace) X(ggml_cast) X(ggml_scale) X(ggml_scale_inplace) \
    X(ggml_add_inplace) X(ggml_mul_inplace) X(ggml_div_inplace) X(ggml_silu_inplace) \
    X(ggml_pad_ext) X(ggml_argmax) X(ggml_ssm_conv) X(ggml_sub) X(ggml_sum) X(ggml_log) X(ggml_exp) X(ggml_sigmoid) \
    X(ggml_step) X(ggml_relu) X(ggml_sqr) X(ggml_cumsum) X(ggml_top_k) X(ggml_ssm_scan) X(ggml_get_rows) X(ggml_mul_mat) \
    X(ggml_add) X(ggml_mul) X(ggml_div) X(ggml_cpy) X(ggml_silu) X(ggml_transpose) X(ggml_view_tensor) \
    X(ggml_sum_rows) X(ggml_dup) X(ggml_cont) X(ggml_cont_4d) X(ggml_argsort) X(ggml_clamp) X(ggml_glu) \
    X(ggml_glu_split) X(ggml_mul_mat_id) X(ggml_set_rows) X(ggml_rms_norm) X(ggml_rope_ext) \
    X(ggml_rope_ext_inplace) X(ggml_soft_max_ext) X(ggml_flash_attn_ext) X(ggml_concat) X(ggml_permute) \
    X(ggml_reshape_1d) X(ggml_reshape_2d) X(ggml_reshape_3d) X(ggml_reshape_4d) \
    X(ggml_view_1d) X(ggml_view_2d) X(ggml_view_3d) X(ggml_view_4d)

#define ENUM(name) F_##name,
#define NAME(name) #name ","
enum { FNS(ENUM) N_FNS };
static void *fns[N_FNS];

/* The ops a record may build, in the order of ``engine.GraphProgram.OPS`` (checked at load). */
#define OPS(X) \
    X(leaf) X(persistent) X(fill) X(cast) X(pad) X(argmax) X(ssm_conv) X(sub) X(sum) X(log) X(exp) X(sigmoid) \
    X(step) X(relu) X(sqr) X(cumsum) X(top_k) X(ssm_scan) X(get_rows) X(mul_mat) X(add) X(mul) X(div) X(cpy) X(silu) \
    X(transpose) X(view_tensor) X(sum_rows) X(dup) X(cont) X(argsort) X(clamp) X(glu) X(mul_mat_id) X(set_rows) \
    X(scale) X(rms_norm) X(rope) X(soft_max_ext) X(flash_attn_ext) X(concat) X(permute) X(reshape) X(view)
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

/* the constructors' signatures, named by their arguments after the context: t tensor, i int,
 * l int64_t, z size_t, f float, b bool */
typedef T *(*t_t)(C *, T *);
typedef T *(*t_tt)(C *, T *, T *);
typedef T *(*t_ttt)(C *, T *, T *, T *);
typedef T *(*t_tf)(C *, T *, float);
typedef T *(*t_tff)(C *, T *, float, float);
typedef T *(*t_ti)(C *, T *, int);
typedef T *(*t_tti)(C *, T *, T *, int);
typedef T *(*t_tib)(C *, T *, int, bool);
typedef T *(*t_tiiii)(C *, T *, int, int, int, int);
typedef T *(*t_tiiiiiiii)(C *, T *, int, int, int, int, int, int, int, int);
typedef T *(*t_ttttttt)(C *, T *, T *, T *, T *, T *, T *, T *);
typedef T *(*t_tttttttl)(C *, T *, T *, T *, T *, T *, T *, T *, int64_t);
typedef T *(*t_tl)(C *, T *, int64_t);
typedef T *(*t_tll)(C *, T *, int64_t, int64_t);
typedef T *(*t_tlll)(C *, T *, int64_t, int64_t, int64_t);
typedef T *(*t_tllll)(C *, T *, int64_t, int64_t, int64_t, int64_t);
typedef T *(*t_tlz)(C *, T *, int64_t, size_t);
typedef T *(*t_tllzz)(C *, T *, int64_t, int64_t, size_t, size_t);
typedef T *(*t_tlllzzz)(C *, T *, int64_t, int64_t, int64_t, size_t, size_t, size_t);
typedef T *(*t_tllllzzzz)(C *, T *, int64_t, int64_t, int64_t, int64_t, size_t, size_t, size_t, size_t);
typedef T *(*t_tttiiiffffff)(C *, T *, T *, T *, int, int, int, float, float, float, float, float, float);
typedef T *(*t_ttff)(C *, T *, T *, float, float);
typedef T *(*t_ttttfff)(C *, T *, T *, T *, T *, float, float, float);

/* What record ``r`` builds over its arguments ``a``; NULL (``*missing`` set where a constructor
 * is absent from this ggml) if nothing. */
static T *construct(C *ctx, const int64_t *r, const double *f, T *const *a, int *missing) {
    const int64_t *p = r + R_INTS;
    int inplace = (r[R_FLAGS] & FLAG_INPLACE) != 0;
    switch (r[R_OP]) {
    case OP_fill:
        return inplace ? CALL(ggml_fill_inplace, t_tf, ctx, a[0], (float)f[0]) : CALL(ggml_fill, t_tf, ctx, a[0], (float)f[0]);
    case OP_cast:
        return CALL(ggml_cast, t_ti, ctx, a[0], (int)p[0]);
    case OP_scale:
        return inplace ? CALL(ggml_scale_inplace, t_tf, ctx, a[0], (float)f[0]) : CALL(ggml_scale, t_tf, ctx, a[0], (float)f[0]);
    case OP_add:
        return inplace ? CALL(ggml_add_inplace, t_tt, ctx, a[0], a[1]) : CALL(ggml_add, t_tt, ctx, a[0], a[1]);
    case OP_mul:
        return inplace ? CALL(ggml_mul_inplace, t_tt, ctx, a[0], a[1]) : CALL(ggml_mul, t_tt, ctx, a[0], a[1]);
    case OP_div:
        return inplace ? CALL(ggml_div_inplace, t_tt, ctx, a[0], a[1]) : CALL(ggml_div, t_tt, ctx, a[0], a[1]);
    case OP_silu:
        return inplace ? CALL(ggml_silu_inplace, t_t, ctx, a[0]) : CALL(ggml_silu, t_t, ctx, a[0]);
    case OP_pad:
        return CALL(ggml_pad_ext, t_tiiiiiiii, ctx, a[0],
                    (int)p[0], (int)p[1], (int)p[2], (int)p[3], (int)p[4], (int)p[5], (int)p[6], (int)p[7]);
    case OP_argmax: return CALL(ggml_argmax, t_t, ctx, a[0]);
    case OP_ssm_conv: return CALL(ggml_ssm_conv, t_tt, ctx, a[0], a[1]);
    case OP_sub: return CALL(ggml_sub, t_tt, ctx, a[0], a[1]);
    case OP_sum: return CALL(ggml_sum, t_t, ctx, a[0]);
    case OP_log: return CALL(ggml_log, t_t, ctx, a[0]);
    case OP_exp: return CALL(ggml_exp, t_t, ctx, a[0]);
    case OP_sigmoid: return CALL(ggml_sigmoid, t_t, ctx, a[0]);
    case OP_step: return CALL(ggml_step, t_t, ctx, a[0]);
    case OP_relu: return CALL(ggml_relu, t_t, ctx, a[0]);
    case OP_sqr: return CALL(ggml_sqr, t_t, ctx, a[0]);
    case OP_cumsum: return CALL(ggml_cumsum, t_t, ctx, a[0]);
    case OP_top_k: return CALL(ggml_top_k, t_ti, ctx, a[0], (int)p[0]);
    case OP_ssm_scan:
        if (r[R_FLAGS] & FLAG_VERSION_K) /* 0.25.3 added K, the states kept */
            return CALL(ggml_ssm_scan, t_tttttttl, ctx, a[0], a[1], a[2], a[3], a[4], a[5], a[6], p[0]);
        return CALL(ggml_ssm_scan, t_ttttttt, ctx, a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
    case OP_get_rows: return CALL(ggml_get_rows, t_tt, ctx, a[0], a[1]);
    case OP_mul_mat: return CALL(ggml_mul_mat, t_tt, ctx, a[0], a[1]);
    case OP_cpy: return CALL(ggml_cpy, t_tt, ctx, a[0], a[1]);
    case OP_transpose: return CALL(ggml_transpose, t_t, ctx, a[0]);
    case OP_view_tensor: return CALL(ggml_view_tensor, t_t, ctx, a[0]);
    case OP_sum_rows: return CALL(ggml_sum_rows, t_t, ctx, a[0]);
    case OP_dup: return CALL(ggml_dup, t_t, ctx, a[0]);
    case OP_cont:
        if (p[4]) /* a shape given: ggml_cont_4d */
            return CALL(ggml_cont_4d, t_tllll, ctx, a[0], p[0], p[1], p[2], p[3]);
        return CALL(ggml_cont, t_t, ctx, a[0]);
    case OP_argsort: return CALL(ggml_argsort, t_ti, ctx, a[0], (int)p[0]);
    case OP_clamp: return CALL(ggml_clamp, t_tff, ctx, a[0], (float)f[0], (float)f[1]);
    case OP_glu:
        if (a[1] == NULL)
            return CALL(ggml_glu, t_tib, ctx, a[0], (int)p[0], p[1] != 0);
        return CALL(ggml_glu_split, t_tti, ctx, a[0], a[1], (int)p[0]);
    case OP_mul_mat_id: return CALL(ggml_mul_mat_id, t_ttt, ctx, a[0], a[1], a[2]);
    case OP_set_rows: return CALL(ggml_set_rows, t_ttt, ctx, a[0], a[1], a[2]);
    case OP_rms_norm: return CALL(ggml_rms_norm, t_tf, ctx, a[0], (float)f[0]);
    case OP_rope: {
        /* ggml_rope_ext(a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
         *               ext_factor, attn_factor, beta_fast, beta_slow) */
        if (inplace)
            return CALL(ggml_rope_ext_inplace, t_tttiiiffffff, ctx, a[0], a[1], a[2], (int)p[0], (int)p[1], 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
        return CALL(ggml_rope_ext, t_tttiiiffffff, ctx, a[0], a[1], a[2], (int)p[0], (int)p[1], 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    }
    case OP_soft_max_ext: return CALL(ggml_soft_max_ext, t_ttff, ctx, a[0], a[1], (float)f[0], (float)f[1]);
    case OP_flash_attn_ext:
        return CALL(ggml_flash_attn_ext, t_ttttfff, ctx, a[0], a[1], a[2], a[3],
                    (float)f[0], (float)f[1], (float)f[2]);
    case OP_concat: return CALL(ggml_concat, t_tti, ctx, a[0], a[1], (int)p[0]);
    case OP_permute:
        return CALL(ggml_permute, t_tiiii, ctx, a[0], (int)p[0], (int)p[1], (int)p[2], (int)p[3]);
    case OP_reshape:
        switch (r[R_NDIMS]) {
        case 1: return CALL(ggml_reshape_1d, t_tl, ctx, a[0], r[R_NE]);
        case 2: return CALL(ggml_reshape_2d, t_tll, ctx, a[0], r[R_NE], r[R_NE + 1]);
        case 3: return CALL(ggml_reshape_3d, t_tlll, ctx, a[0], r[R_NE], r[R_NE + 1], r[R_NE + 2]);
        default:
            return CALL(ggml_reshape_4d, t_tllll, ctx, a[0], r[R_NE], r[R_NE + 1], r[R_NE + 2], r[R_NE + 3]);
        }
    case OP_view: { /* ne in the record, nb[1..3] and the offset in the integer parameters */
        const int64_t *ne = r + R_NE;
        size_t offset = (size_t)p[3];
        switch (r[R_NDIMS]) {
        case 1: return CALL(ggml_view_1d, t_tlz, ctx, a[0], ne[0], offset);
        case 2: return CALL(ggml_view_2d, t_tllzz, ctx, a[0], ne[0], ne[1], (size_t)p[0], offset);
        case 3:
            return CALL(ggml_view_3d, t_tlllzzz, ctx, a[0], ne[0], ne[1], ne[2],
                        (size_t)p[0], (size_t)p[1], offset);
        default:
            return CALL(ggml_view_4d, t_tllllzzzz, ctx, a[0],
                        ne[0], ne[1], ne[2], ne[3], (size_t)p[0], (size_t)p[1], (size_t)p[2], offset);
        }
    }
    default:
        *missing = BUILD_BAD_OP;
        return NULL;
    }
}

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

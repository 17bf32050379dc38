/* schedfuzz's window on a scheduler it does not own: preloaded (LD_PRELOAD) into the llama.cpp
 * worker, it interposes every scheduler entry point libllama calls through its PLT, calls the
 * real ones (dlsym RTLD_NEXT) unchanged, and reports each call to a hook the worker installs.
 *
 * ggml_backend_sched_split_graph is interposed too: libggml-base calls it through its own PLT
 * from reserve, reserve_size and alloc_graph (a shared library built without
 * -fno-semantic-interposition), and llama.cpp calls it directly (the flash-attention probe).
 * Every call of it moves ggml's debug_graph_size, so the worker sees every one of them and its
 * view of the graph size follows ggml's. A reserve or alloc that reports no split_graph inside
 * tells the worker that this build binds the call directly, and the worker refuses to judge.
 *
 * Where ggml has ggml_backend_sched_set_realloc_callback (the seeds' API, ggml master), every
 * scheduler gets a callback of the hook's at creation, and a callback llama.cpp registers is
 * wrapped: ggml itself then tells the worker, at each re-reservation, whether the backend
 * assignment and the graph size changed (HOOK_REALLOC), before llama.cpp's callback runs.
 *
 * ggml-alloc's ggml_gallocr_alloc_graph and ggml_gallocr_reserve_n are interposed too: the
 * scheduler's alloc_splits calls them through libggml-base's PLT, so that the re-plan decision
 * is seen on any build, a Release one without the callback included. In a scheduler alloc, a
 * reserve_n after an alloc_graph that failed is a re-plan for a graph that no longer fits; a
 * reserve_n with no alloc_graph before it is one for changed backend ids (alloc_splits does
 * not try to allocate then). ggml-alloc's own re-plan of a single buffer happens inside
 * alloc_graph, through ggml_gallocr_reserve (its PLT too): reported as such (HOOK_GALLOC_OWN),
 * and its inner reserve_n is not.
 *
 * It includes no ggml header: the hook reads the graph through ggml's own public functions. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*schedfuzz_hook_t)(int phase, void * sched, void * graph, long a, long b, long c);

enum {
    HOOK_SCHED_NEW = 0,
    HOOK_RESERVE_BEGIN = 1, HOOK_RESERVE_END = 2,
    HOOK_ALLOC_BEGIN = 3, HOOK_ALLOC_END = 4,
    HOOK_SCHED_FREE = 5,
    HOOK_SPLIT_BEGIN = 6, HOOK_SPLIT_END = 7,
    HOOK_RESERVE_SIZE_BEGIN = 8, HOOK_RESERVE_SIZE_END = 9,
    HOOK_REALLOC = 10, HOOK_REALLOC_OWNER = 11,
    HOOK_SET_TENSOR_BACKEND = 12, HOOK_RESET = 13,
    HOOK_COMPUTE_BEGIN = 14, HOOK_COMPUTE_END = 15,
    HOOK_GALLOC_ALLOC = 16, HOOK_GALLOC_RESERVE = 17, HOOK_GALLOC_OWN = 18,
};

static schedfuzz_hook_t hook = NULL;

void schedfuzz_set_hook(schedfuzz_hook_t h) { hook = h; }

static void * real(const char * name) {
    void * f = dlsym(RTLD_NEXT, name);
    if (f == NULL) {
        /* nothing sensible to do without the real scheduler */
        __builtin_trap();
    }
    return f;
}

/* the realloc callback: ggml's typedef, (sched, graph, backend_ids_changed, graph_size_changed, user_data) */
typedef void (*realloc_cb_t)(void *, void *, bool, bool, void *);
typedef void (*set_realloc_cb_t)(void *, realloc_cb_t, void *);

/* the callback each live scheduler's owner registered (NULL: none), to call after reporting */
#define MAX_SCHEDS 64
static struct { void * sched; realloc_cb_t cb; void * user_data; } owners[MAX_SCHEDS];

static int owner_slot(void * sched, bool make) {
    for (int i = 0; i < MAX_SCHEDS; i++) if (owners[i].sched == sched) return i;
    if (!make) return -1;
    for (int i = 0; i < MAX_SCHEDS; i++) if (owners[i].sched == NULL) { owners[i].sched = sched; return i; }
    return -1;
}

static void on_realloc(void * sched, void * graph, bool backend_ids_changed, bool graph_size_changed, void * user_data) {
    (void) user_data;
    if (hook) hook(HOOK_REALLOC, sched, graph, backend_ids_changed, graph_size_changed, 0);
    int i = owner_slot(sched, false);
    if (i >= 0 && owners[i].cb) owners[i].cb(sched, graph, backend_ids_changed, graph_size_changed, owners[i].user_data);
}

static set_realloc_cb_t real_set_realloc(void) {
    static set_realloc_cb_t f;
    static bool looked;
    if (!looked) { f = (set_realloc_cb_t) dlsym(RTLD_NEXT, "ggml_backend_sched_set_realloc_callback"); looked = true; }
    return f;
}

void ggml_backend_sched_set_realloc_callback(void * sched, realloc_cb_t cb, void * user_data) {
    set_realloc_cb_t f = real_set_realloc();
    if (f == NULL) __builtin_trap(); /* called, so this ggml has it */
    int i = owner_slot(sched, true);
    if (i < 0) { f(sched, cb, user_data); return; } /* more live schedulers than slots: unobserved (the worker notices) */
    owners[i].cb = cb;
    owners[i].user_data = user_data;
    f(sched, on_realloc, NULL);
    if (hook && cb) hook(HOOK_REALLOC_OWNER, sched, NULL, 0, 0, 0); /* its owner (llama.cpp) counts reallocations */
}

void * ggml_backend_sched_new(void * backends, void * bufts, int n_backends, size_t graph_size, bool parallel, bool op_offload) {
    static void * (*f)(void *, void *, int, size_t, bool, bool);
    if (!f) f = (void * (*)(void *, void *, int, size_t, bool, bool)) real("ggml_backend_sched_new");
    void * sched = f(backends, bufts, n_backends, graph_size, parallel, op_offload);
    set_realloc_cb_t set = real_set_realloc();
    if (set) ggml_backend_sched_set_realloc_callback(sched, NULL, NULL); /* observed even if its owner registers none */
    /* b: parallel, plus 2 where ggml reports its realloc decisions to the hook (it has the callback) */
    if (hook) hook(HOOK_SCHED_NEW, sched, NULL, (long) graph_size, parallel | (set ? 2 : 0), op_offload);
    return sched;
}

void ggml_backend_sched_free(void * sched) {
    static void (*f)(void *);
    if (!f) f = (void (*)(void *)) real("ggml_backend_sched_free");
    if (hook) hook(HOOK_SCHED_FREE, sched, NULL, 0, 0, 0);
    int i = owner_slot(sched, false);
    if (i >= 0) { owners[i].sched = NULL; owners[i].cb = NULL; owners[i].user_data = NULL; }
    f(sched);
}

/* split_graph: reported at its end, while every node still has its backend (reserve resets them) */
void ggml_backend_sched_split_graph(void * sched, void * graph) {
    static void (*f)(void *, void *);
    if (!f) f = (void (*)(void *, void *)) real("ggml_backend_sched_split_graph");
    if (hook) hook(HOOK_SPLIT_BEGIN, sched, graph, 0, 0, 0);
    f(sched, graph);
    if (hook) hook(HOOK_SPLIT_END, sched, graph, 0, 0, 0);
}

void ggml_backend_sched_reserve_size(void * sched, void * graph, size_t * sizes) {
    static void (*f)(void *, void *, size_t *);
    if (!f) f = (void (*)(void *, void *, size_t *)) real("ggml_backend_sched_reserve_size");
    if (hook) hook(HOOK_RESERVE_SIZE_BEGIN, sched, graph, 0, 0, 0);
    f(sched, graph, sizes);
    if (hook) hook(HOOK_RESERVE_SIZE_END, sched, graph, 1, 0, 0);
}

/* llama.cpp's own assignments (the graph's forced ones), and the resets that forget them */
void ggml_backend_sched_set_tensor_backend(void * sched, void * tensor, void * backend) {
    static void (*f)(void *, void *, void *);
    if (!f) f = (void (*)(void *, void *, void *)) real("ggml_backend_sched_set_tensor_backend");
    f(sched, tensor, backend);
    if (hook) hook(HOOK_SET_TENSOR_BACKEND, sched, tensor, (long) backend, 0, 0);
}

void ggml_backend_sched_reset(void * sched) {
    static void (*f)(void *);
    if (!f) f = (void (*)(void *)) real("ggml_backend_sched_reset");
    f(sched);
    if (hook) hook(HOOK_RESET, sched, NULL, 0, 0, 0);
}

typedef bool (*graph_fn)(void *, void *);

/* reserve and alloc_graph: the same call shape, reported as phase (begin) and phase + 1 (end) */
static bool graph_call(graph_fn * f, const char * name, int phase, void * sched, void * graph) {
    if (!*f) *f = (graph_fn) real(name);
    if (hook) hook(phase, sched, graph, 0, 0, 0);
    bool ok = (*f)(sched, graph);
    if (hook) hook(phase + 1, sched, graph, ok, 0, 0);
    return ok;
}

bool ggml_backend_sched_reserve(void * sched, void * graph) {
    static graph_fn f;
    return graph_call(&f, "ggml_backend_sched_reserve", HOOK_RESERVE_BEGIN, sched, graph);
}

bool ggml_backend_sched_alloc_graph(void * sched, void * graph) {
    static graph_fn f;
    return graph_call(&f, "ggml_backend_sched_alloc_graph", HOOK_ALLOC_BEGIN, sched, graph);
}

/* the compute: an abort between its begin and end is the computation's, not the graph's build */
int ggml_backend_sched_graph_compute_async(void * sched, void * graph) {
    static int (*f)(void *, void *);
    if (!f) f = (int (*)(void *, void *)) real("ggml_backend_sched_graph_compute_async");
    if (hook) hook(HOOK_COMPUTE_BEGIN, sched, graph, 0, 0, 0);
    int status = f(sched, graph);
    if (hook) hook(HOOK_COMPUTE_END, sched, graph, status, 0, 0);
    return status;
}

/* ggml-alloc's calls, counted for the worker's start-up probe (schedfuzz_galloc_counts) and reported
 * at their end, outermost only: a reserve_n ggml_gallocr_alloc_graph makes by itself is not the
 * scheduler's */
static int galloc_depth;
static long galloc_counts[3];  /* alloc_graph calls, of which failed, reserve_n calls (outermost) */

void schedfuzz_galloc_counts(long * out) { memcpy(out, galloc_counts, sizeof galloc_counts); }

bool ggml_gallocr_alloc_graph(void * galloc, void * graph) {
    static graph_fn f;
    if (!f) f = (graph_fn) real("ggml_gallocr_alloc_graph");
    galloc_depth++;
    bool ok = f(galloc, graph);
    galloc_depth--;
    if (galloc_depth == 0) {
        galloc_counts[0]++;
        galloc_counts[1] += !ok;
        if (hook) hook(HOOK_GALLOC_ALLOC, galloc, graph, ok, 0, 0);
    }
    return ok;
}

/* ggml_gallocr_alloc_graph re-planning its single buffer by itself: the reserve it calls */
bool ggml_gallocr_reserve(void * galloc, void * graph) {
    static graph_fn f;
    if (!f) f = (graph_fn) real("ggml_gallocr_reserve");
    bool own = galloc_depth == 1;  /* inside alloc_graph (a reserve of a caller's own is reported as its reserve_n) */
    galloc_depth += own;
    bool ok = f(galloc, graph);
    galloc_depth -= own;
    if (own && hook) hook(HOOK_GALLOC_OWN, galloc, graph, ok, 0, 0);
    return ok;
}

bool ggml_gallocr_reserve_n(void * galloc, void * graph, const int * node_buffer_ids, const int * leaf_buffer_ids) {
    static bool (*f)(void *, void *, const int *, const int *);
    if (!f) f = (bool (*)(void *, void *, const int *, const int *)) real("ggml_gallocr_reserve_n");
    galloc_depth++;
    bool ok = f(galloc, graph, node_buffer_ids, leaf_buffer_ids);
    galloc_depth--;
    if (galloc_depth == 0) {
        galloc_counts[2]++;
        if (hook) hook(HOOK_GALLOC_RESERVE, galloc, graph, ok, 0, 0);
    }
    return ok;
}

/* the backend (its index among the scheduler's; -1: none) ggml's split_graph gave each of the
 * n tensors: one call for a whole graph instead of one per tensor from Python */
void schedfuzz_tensor_backends(void * sched, void * const * tensors, int n, int * out) {
    static void * (*tensor_backend)(void *, void *);
    static int (*n_backends)(void *);
    static void * (*get_backend)(void *, int);
    if (!tensor_backend) {
        tensor_backend = (void * (*)(void *, void *)) real("ggml_backend_sched_get_tensor_backend");
        n_backends = (int (*)(void *)) real("ggml_backend_sched_get_n_backends");
        get_backend = (void * (*)(void *, int)) real("ggml_backend_sched_get_backend");
    }
    void * backends[64];
    int nb = n_backends(sched);
    if (nb > 64) nb = 64;
    for (int j = 0; j < nb; j++) backends[j] = get_backend(sched, j);
    for (int i = 0; i < n; i++) {
        void * b = tensor_backend(sched, tensors[i]);
        out[i] = -1;
        for (int j = 0; j < nb && b; j++) if (backends[j] == b) { out[i] = j; break; }
    }
}

/* A graph handed to the scheduler, written as one fixed-size record per tensor (its nodes, then
 * its leafs), for the worker's capture: a Python read of each tensor's fields was a fifth of the
 * worker's time. The fields are read at the offsets the worker gives (ggml-python's ggml_tensor,
 * checked against the library at its startup), so the hook still includes no ggml header.
 * Pointers are written as what they name: a source or view source as its index (node i: i; leaf
 * j: -2 - j; none: -1; outside the graph: INT32_MIN), a buffer as its index among the graph's
 * distinct buffers (first seen first; -1: none), whose addresses go to `buffers`. Equal graphs
 * give equal bytes, in any process. Returns the number of distinct buffers, or -1 when there are
 * more than `max_buffers`. */
struct schedfuzz_tensor_layout {
    int32_t type, buffer, ne, nb, op, op_params, flags, src, view_src, view_offs, name;  /* offsets */
    int32_t n_src, n_op_params, name_size;
};

#define REC_SRC 10
#define REC_PARAMS 16
#define REC_NAME 64
#define REC_WORD 32
struct __attribute__((packed)) schedfuzz_tensor_record {
    int32_t flags, view_src, buffer;
    int32_t src[REC_SRC];
    int32_t op_params[REC_PARAMS];
    int64_t ne[4];
    uint64_t nb[4];
    uint64_t view_offs;
    char name[REC_NAME];
    char op[REC_WORD], desc[REC_WORD], type[REC_WORD];  /* ggml_op_name, ggml_op_desc, ggml_type_name */
};

static void put_word(char * to, const char * word) {
    if (word != NULL) memcpy(to, word, strnlen(word, REC_WORD - 1));
}

int schedfuzz_tensor_record_size(void) { return (int) sizeof(struct schedfuzz_tensor_record); }

/* the leading fields of struct ggml_cgraph (ggml-impl.h), as the worker's CGraphHead */
struct cgraph_head { int size, n_nodes, n_leafs; void ** nodes; void ** grads; void ** grad_accs; void ** leafs; };

static size_t slot_of(void * p, size_t mask) { return (size_t) (((uintptr_t) p >> 4) * 0x9E3779B97F4A7C15ull) & mask; }

/* the index a tensor of the graph was given (open addressing), -1 for none, INT32_MIN outside */
static int32_t index_of(void * p, void * const * keys, const int32_t * vals, size_t mask) {
    if (p == NULL) return -1;
    size_t s = slot_of(p, mask);
    while (keys[s] != NULL && keys[s] != p) s = (s + 1) & mask;
    return keys[s] == p ? vals[s] : INT32_MIN;
}

int schedfuzz_graph_records(void * graph, const struct schedfuzz_tensor_layout * l, struct schedfuzz_tensor_record * out,
                            void ** buffers, int max_buffers) {
    const struct cgraph_head * g = (const struct cgraph_head *) graph;
    int n = g->n_nodes + g->n_leafs;
    size_t cap = 16;
    while (cap < 2 * (size_t) n) cap <<= 1;
    void ** keys = calloc(cap, sizeof(void *));
    int32_t * vals = malloc(cap * sizeof(int32_t));
    if (keys == NULL || vals == NULL) { free(keys); free(vals); return -1; }
    for (int i = 0; i < n; i++) {
        void * t = i < g->n_nodes ? g->nodes[i] : g->leafs[i - g->n_nodes];
        size_t s = slot_of(t, cap - 1);
        while (keys[s] != NULL && keys[s] != t) s = (s + 1) & (cap - 1);
        keys[s] = t;  /* a tensor both a node and a leaf is named as the leaf, as the worker named it */
        vals[s] = i < g->n_nodes ? i : -2 - (i - g->n_nodes);
    }
    static const char * (*op_name)(int32_t);
    static const char * (*op_desc)(const void *);
    static const char * (*type_name)(int32_t);
    if (!op_name) {
        op_name = (const char * (*)(int32_t)) real("ggml_op_name");
        op_desc = (const char * (*)(const void *)) real("ggml_op_desc");
        type_name = (const char * (*)(int32_t)) real("ggml_type_name");
    }
    int n_buffers = 0;
    for (int i = 0; i < n; i++) {
        const char * t = (const char *) (i < g->n_nodes ? g->nodes[i] : g->leafs[i - g->n_nodes]);
        struct schedfuzz_tensor_record * r = &out[i];
        memset(r, 0, sizeof *r);
        int32_t op, type;
        memcpy(&op, t + l->op, 4);
        memcpy(&type, t + l->type, 4);
        put_word(r->op, op_name(op));
        put_word(r->desc, op_desc(t));
        put_word(r->type, type_name(type));
        memcpy(&r->flags, t + l->flags, 4);
        memcpy(r->ne, t + l->ne, sizeof r->ne);
        memcpy(r->nb, t + l->nb, sizeof r->nb);
        memcpy(r->op_params, t + l->op_params, 4 * (size_t) l->n_op_params);
        memcpy(&r->view_offs, t + l->view_offs, 8);
        memcpy(r->name, t + l->name, strnlen(t + l->name, (size_t) l->name_size));  /* not what follows its end */
        void * p;
        for (int k = 0; k < l->n_src; k++) { memcpy(&p, t + l->src + 8 * k, 8); r->src[k] = index_of(p, keys, vals, cap - 1); }
        memcpy(&p, t + l->view_src, 8);
        r->view_src = index_of(p, keys, vals, cap - 1);
        memcpy(&p, t + l->buffer, 8);
        r->buffer = -1;
        if (p != NULL) {
            int b = 0;
            while (b < n_buffers && buffers[b] != p) b++;
            if (b == n_buffers) {
                if (n_buffers == max_buffers) { free(keys); free(vals); return -1; }
                buffers[n_buffers++] = p;
            }
            r->buffer = b;
        }
    }
    free(keys);
    free(vals);
    return n_buffers;
}

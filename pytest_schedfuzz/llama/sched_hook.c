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
 * It includes no ggml header: the hook reads the graph through ggml's own public functions. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>

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

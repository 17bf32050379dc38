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

void * ggml_backend_sched_new(void * backends, void * bufts, int n_backends, size_t graph_size, bool parallel, bool op_offload) {
    static void * (*f)(void *, void *, int, size_t, bool, bool);
    if (!f) f = (void * (*)(void *, void *, int, size_t, bool, bool)) real("ggml_backend_sched_new");
    void * sched = f(backends, bufts, n_backends, graph_size, parallel, op_offload);
    if (hook) hook(HOOK_SCHED_NEW, sched, NULL, (long) graph_size, parallel, op_offload);
    return sched;
}

void ggml_backend_sched_free(void * sched) {
    static void (*f)(void *);
    if (!f) f = (void (*)(void *)) real("ggml_backend_sched_free");
    if (hook) hook(HOOK_SCHED_FREE, sched, NULL, 0, 0, 0);
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

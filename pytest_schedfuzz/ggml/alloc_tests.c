/* ggml's own allocator tests (tests/test-alloc.cpp of the llama.cpp that llama-cpp-python 0.3.36
 * vendors: ggml 0.25.3), translated to C case by case, that print what ggml-alloc did instead of
 * only asserting it: the oracle test (tests/oracle/test_ggml_alloc_tests.py) runs them on the real
 * libggml-base and holds schedfuzz's reference allocator (reference/alloc.py) to every placement.
 *
 * The dummy backend is test-alloc.cpp's: a buffer type of a given alignment and maximum size that
 * never refuses an allocation, whose buffers all have the base address 16 and are tracked in
 * allocation order (so a tensor's chunk is the index of its buffer among the gallocr's ones of
 * that buffer type, and its offset is its data minus 16). The graphs, the calls
 * (ggml_gallocr_new_n, ggml_gallocr_reserve_n, ggml_gallocr_alloc_graph, a scheduler with a
 * graph_optimize that adds an allocation dependency) and the checks (check_all_allocated,
 * check_max_size, check_no_overlap) are the test's; a failed check is reported, not asserted, so
 * that every case reports. test-alloc.cpp's bounds on allocated_total() are asserted by the
 * Python test, on the totals printed here.
 *
 * Output: one JSON object per line, a snapshot of a case after each allocation it checks:
 *   {"case", "graph" (its index in the case), "results" (what the gallocr/sched calls returned),
 *    "nodes", "leafs" (names in graph order), "tensors" (every tensor of the case's contexts:
 *    name, op, type, ne, nb, input, output, view_src, view_offs, srcs, nbytes, and where it is:
 *    buffer (the gallocr's buffer id; -1 without a buffer), external (in a buffer allocated
 *    outside the gallocr), chunk, offset), "buffers" (per gallocr buffer id: its chunks' sizes),
 *    "buffer_sizes" (ggml_gallocr_get_buffer_size per id), "allocated_total" and "external" (per
 *    dummy backend: the bytes of its live buffers, and of those allocated outside the gallocr),
 *    "violations" (the failed checks)}
 *
 * Built by pytest_schedfuzz.ggml.alloc_tests against ggml 0.25.3's headers and libggml-base. */
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"
#include "ggml-impl.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUFFERS 64
#define MAX_CTXS 3
#define MAX_VIOLATIONS 32

static uint8_t * const alloc_base = (uint8_t *) 16;

/* dummy_backend_context and dummy_backend of test-alloc.cpp, in one struct */
struct dummy_backend {
    size_t max_buffer_size;
    size_t alignment;
    struct ggml_backend_buffer_i buffer_interface;
    struct ggml_backend_device device;
    struct ggml_backend backend;
    struct ggml_backend_buffer_type buffer_type;
    ggml_backend_buffer_t buffers[MAX_BUFFERS]; /* live buffers, in allocation order */
    int n_buffers;
    int n_external; /* the first n_external were allocated outside the gallocr */
};

static size_t allocated_total(const struct dummy_backend * b, int from, int to) {
    size_t n = 0;
    for (int i = from; i < to; i++) {
        n += ggml_backend_buffer_get_size(b->buffers[i]);
    }
    return n;
}

static const char * dummy_buft_get_name(ggml_backend_buffer_type_t buft) {
    (void) buft;
    return "dummy_buffer_type";
}

static ggml_backend_buffer_t dummy_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    struct dummy_backend * ctx = buft->context;
    GGML_ASSERT(ctx->n_buffers < MAX_BUFFERS);
    ggml_backend_buffer_t buffer = ggml_backend_buffer_init(buft, ctx->buffer_interface, ctx, size);
    ctx->buffers[ctx->n_buffers++] = buffer;
    return buffer;
}

static size_t dummy_buft_get_alignment(ggml_backend_buffer_type_t buft) {
    return ((struct dummy_backend *) buft->context)->alignment;
}

static size_t dummy_buft_get_max_size(ggml_backend_buffer_type_t buft) {
    return ((struct dummy_backend *) buft->context)->max_buffer_size;
}

static bool dummy_buft_is_host(ggml_backend_buffer_type_t buft) {
    (void) buft;
    return true;
}

static void dummy_buffer_free_buffer(ggml_backend_buffer_t buffer) {
    struct dummy_backend * ctx = buffer->context;
    int i = 0;
    while (i < ctx->n_buffers && ctx->buffers[i] != buffer) {
        i++;
    }
    GGML_ASSERT(i < ctx->n_buffers);
    memmove(&ctx->buffers[i], &ctx->buffers[i + 1], (size_t) (ctx->n_buffers - i - 1) * sizeof(ctx->buffers[0]));
    ctx->n_buffers--;
}

static void * dummy_buffer_get_base(ggml_backend_buffer_t buffer) {
    (void) buffer;
    return alloc_base;
}

static enum ggml_status dummy_buffer_init_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor) {
    (void) buffer; (void) tensor;
    return GGML_STATUS_SUCCESS;
}

static void dummy_buffer_memset_tensor(ggml_backend_buffer_t b, struct ggml_tensor * t, uint8_t v, size_t o, size_t s) {
    (void) b; (void) t; (void) v; (void) o; (void) s;
}

static void dummy_buffer_set_tensor(ggml_backend_buffer_t b, struct ggml_tensor * t, const void * d, size_t o, size_t s) {
    (void) b; (void) t; (void) d; (void) o; (void) s;
}

static void dummy_buffer_get_tensor(ggml_backend_buffer_t b, const struct ggml_tensor * t, void * d, size_t o, size_t s) {
    (void) b; (void) t; (void) d; (void) o; (void) s;
}

static void dummy_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    (void) buffer; (void) value;
}

static enum ggml_backend_dev_type dummy_device_get_type(ggml_backend_dev_t dev) {
    (void) dev;
    return GGML_BACKEND_DEVICE_TYPE_CPU;
}

static bool dummy_device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    (void) dev; (void) op;
    return true;
}

static bool dummy_device_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    return dev->context == buft->context;
}

static const char * dummy_backend_get_name(ggml_backend_t backend) {
    (void) backend;
    return "dummy_backend";
}

/* dummy_backend_init; the struct must stay where it is (its buffer type points into it) */
static struct dummy_backend * dummy_backend_init(size_t max_buffer_size, size_t alignment) {
    struct dummy_backend * b = calloc(1, sizeof(*b));
    GGML_ASSERT(b != NULL);
    b->alignment = alignment;
    b->max_buffer_size = max_buffer_size;

    b->buffer_interface.free_buffer = dummy_buffer_free_buffer;
    b->buffer_interface.get_base = dummy_buffer_get_base;
    b->buffer_interface.init_tensor = dummy_buffer_init_tensor;
    b->buffer_interface.memset_tensor = dummy_buffer_memset_tensor;
    b->buffer_interface.set_tensor = dummy_buffer_set_tensor;
    b->buffer_interface.get_tensor = dummy_buffer_get_tensor;
    b->buffer_interface.clear = dummy_buffer_clear;

    b->device.context = b;
    b->device.iface.get_type = dummy_device_get_type;
    b->device.iface.supports_op = dummy_device_supports_op;
    b->device.iface.supports_buft = dummy_device_supports_buft;

    b->backend.context = b;
    b->backend.device = &b->device;
    b->backend.iface.get_name = dummy_backend_get_name;

    b->buffer_type.device = &b->device;
    b->buffer_type.context = b;
    b->buffer_type.iface.get_name = dummy_buft_get_name;
    b->buffer_type.iface.alloc_buffer = dummy_buft_alloc_buffer;
    b->buffer_type.iface.get_alignment = dummy_buft_get_alignment;
    b->buffer_type.iface.get_max_size = dummy_buft_get_max_size;
    b->buffer_type.iface.is_host = dummy_buft_is_host;
    return b;
}

/* ------------------------------------------------------------------ test utilities */

/* make_context: a context of 48 tensors and a graph */
static struct ggml_context * make_context(struct ggml_cgraph ** graph) {
    struct ggml_init_params params = {
        /*.mem_size   =*/ 48 * ggml_tensor_overhead() + ggml_graph_overhead(),
        /*.mem_buffer =*/ NULL,
        /*.no_alloc   =*/ true,
    };
    struct ggml_context * ctx = ggml_init(params);
    GGML_ASSERT(ctx != NULL);
    *graph = ggml_new_graph(ctx);
    return ctx;
}

static struct ggml_tensor * make_input_1d(struct ggml_context * ctx, int64_t n_elements) {
    struct ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_elements);
    ggml_set_input(t);
    return t;
}

static struct ggml_tensor * make_input_with_size(struct ggml_context * ctx, size_t size_bytes) {
    GGML_ASSERT(size_bytes % 4 == 0);
    return make_input_1d(ctx, (int64_t) (size_bytes / 4));
}

static void assign_names(struct ggml_context * ctx, const char * prefix) {
    int i = 0;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        ggml_format_name(t, "%s%d", prefix, i++);
    }
}

static int get_leaf_id(struct ggml_cgraph * graph, const char * name) {
    for (int i = 0; i < graph->n_leafs; ++i) {
        if (strncmp(graph->leafs[i]->name, name, GGML_MAX_NAME) == 0) {
            return i;
        }
    }
    GGML_ABORT("leaf not found: %s", name);
}

static int get_node_id(struct ggml_cgraph * graph, const char * name) {
    for (int i = 0; i < graph->n_nodes; ++i) {
        if (strncmp(graph->nodes[i]->name, name, GGML_MAX_NAME) == 0) {
            return i;
        }
    }
    GGML_ABORT("node not found: %s", name);
}

static ggml_gallocr_t allocate_graph(struct ggml_cgraph * graph, struct ggml_tensor * out, ggml_backend_buffer_type_t buft, bool * result) {
    ggml_set_output(out);
    ggml_build_forward_expand(graph, out);
    ggml_gallocr_t galloc = ggml_gallocr_new(buft);
    *result = ggml_gallocr_alloc_graph(galloc, graph);
    return galloc;
}

/* ------------------------------------------------------------------ the checks, reported */

static char violations[MAX_VIOLATIONS][256];
static int n_violations;

static void violation(const char * fmt, ...) {
    if (n_violations == MAX_VIOLATIONS) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(violations[n_violations++], sizeof(violations[0]), fmt, ap);
    va_end(ap);
}

static void check_all_allocated(struct ggml_cgraph * graph) {
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        if (t->buffer == NULL || t->data == NULL) {
            violation("check_all_allocated: %s has no buffer or no data", t->name);
        }
    }
}

static void check_max_size(struct ggml_context * ctx) {
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        size_t max_size = ggml_backend_buft_get_max_size(ggml_backend_buffer_get_type(t->buffer));
        char * base = ggml_backend_buffer_get_base(t->buffer);
        size_t offset = (size_t) ((char *) t->data - base);
        if ((char *) t->data < base || offset + ggml_nbytes(t) > max_size) {
            violation("check_max_size: %s at %zu, %zu bytes, max size %zu", t->name, offset, ggml_nbytes(t), max_size);
        }
    }
}

static bool can_reuse_memory(struct ggml_cgraph * graph, int current_i, struct ggml_tensor * current, struct ggml_tensor * other) {
    if (other->flags & GGML_TENSOR_FLAG_OUTPUT) {
        return false;
    }
    /* is `other` still alive, an input to any node after the current op? */
    for (int i = current_i; i < ggml_graph_n_nodes(graph); ++i) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        for (int s = 0; s < GGML_MAX_SRC; s++) {
            if (t == current && ggml_op_can_inplace(t->op)) {
                continue;
            }
            if (t->src[s] == other) {
                return false;
            }
            if (t->src[s] && t->src[s]->view_src == other) {
                return false;
            }
        }
    }
    return true;
}

static bool memory_overlap(struct ggml_tensor * a, struct ggml_tensor * b) {
    if (a->buffer != b->buffer) {
        return false;
    }
    int64_t a0 = (int64_t) (intptr_t) a->data;
    int64_t a1 = a0 + (int64_t) ggml_nbytes(a);
    int64_t b0 = (int64_t) (intptr_t) b->data;
    int64_t b1 = b0 + (int64_t) ggml_nbytes(b);
    return a1 > b0 && b1 > a0;
}

static struct ggml_tensor * get_view_source(struct ggml_tensor * t) {
    while (t->view_src) {
        t = t->view_src;
    }
    return t;
}

static void check_no_overlap(struct ggml_cgraph * graph) {
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        for (int j = 0; j < i; ++j) {
            struct ggml_tensor * t = ggml_graph_node(graph, i);
            struct ggml_tensor * o = ggml_graph_node(graph, j);
            if (get_view_source(t) == get_view_source(o)) {
                continue;
            }
            if (memory_overlap(t, o) && !can_reuse_memory(graph, i, t, o)) {
                violation("check_no_overlap: %s overlaps %s, which is still alive", t->name, o->name);
            }
        }
    }
}

/* ------------------------------------------------------------------ the report */

struct run {
    const char * name;
    int graph;                                 /* the snapshot's index in its case */
    struct dummy_backend * dummies[2];
    int n_dummies;
    ggml_backend_buffer_type_t bufts[2];       /* the gallocr's (or the scheduler's), by buffer id */
    int n_bufts;
    struct ggml_context * ctxs[MAX_CTXS];
    int n_ctxs;
};

static void print_names(struct ggml_tensor ** ts, int n) {
    for (int i = 0; i < n; i++) {
        printf("%s\"%s\"", i ? ", " : "", ts[i]->name);
    }
}

static void print_tensor(const struct run * r, const struct ggml_tensor * t) {
    printf("{\"name\": \"%s\", \"op\": \"%s\", \"type\": \"%s\", \"ne\": [%lld, %lld, %lld, %lld], \"nb\": [%zu, %zu, %zu, %zu]",
           t->name, ggml_op_name(t->op), ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2],
           (long long) t->ne[3], t->nb[0], t->nb[1], t->nb[2], t->nb[3]);
    printf(", \"input\": %s, \"output\": %s, \"nbytes\": %zu, \"view_offs\": %zu, \"view_src\": ", (t->flags & GGML_TENSOR_FLAG_INPUT) ? "true" : "false",
           (t->flags & GGML_TENSOR_FLAG_OUTPUT) ? "true" : "false", ggml_nbytes(t), t->view_offs);
    if (t->view_src) {
        printf("\"%s\"", t->view_src->name);
    } else {
        printf("null");
    }
    int n_srcs = GGML_MAX_SRC;
    while (n_srcs > 0 && t->src[n_srcs - 1] == NULL) {
        n_srcs--;
    }
    printf(", \"srcs\": [");
    for (int s = 0; s < n_srcs; s++) {
        if (t->src[s]) {
            printf("%s\"%s\"", s ? ", " : "", t->src[s]->name);
        } else {
            printf("%snull", s ? ", " : "");
        }
    }
    int buffer = -1, chunk = -1;
    bool external = false;
    long long offset = -1;
    if (t->buffer) {
        struct dummy_backend * d = t->buffer->buft->context;
        for (int i = 0; i < r->n_bufts && buffer < 0; i++) {
            buffer = r->bufts[i] == t->buffer->buft ? i : -1; /* the first id of its buffer type */
        }
        int k = 0;
        while (k < d->n_buffers && d->buffers[k] != t->buffer) {
            k++;
        }
        GGML_ASSERT(k < d->n_buffers);
        external = k < d->n_external;
        chunk = external ? k : k - d->n_external;
        offset = (long long) ((char *) t->data - (char *) ggml_backend_buffer_get_base(t->buffer));
    }
    printf("], \"buffer\": %d, \"external\": %s, \"chunk\": %d, \"offset\": %lld}", buffer, external ? "true" : "false", chunk, offset);
}

/* print a snapshot of run `r` after the calls that returned `results` on `graph`; the gallocr's
 * buffer sizes from `galloc`, or from `sched` */
static void report(struct run * r, struct ggml_cgraph * graph, const bool * results, int n_results, ggml_gallocr_t galloc, ggml_backend_sched_t sched) {
    printf("{\"case\": \"%s\", \"graph\": %d, \"results\": [", r->name, r->graph++);
    for (int i = 0; i < n_results; i++) {
        printf("%s%s", i ? ", " : "", results[i] ? "true" : "false");
    }
    printf("], \"nodes\": [");
    print_names(graph->nodes, graph->n_nodes);
    printf("], \"leafs\": [");
    print_names(graph->leafs, graph->n_leafs);
    printf("], \"tensors\": [");
    int n = 0;
    for (int c = 0; c < r->n_ctxs; c++) {
        for (struct ggml_tensor * t = ggml_get_first_tensor(r->ctxs[c]); t; t = ggml_get_next_tensor(r->ctxs[c], t)) {
            printf("%s", n++ ? ", " : "");
            print_tensor(r, t);
        }
    }
    printf("], \"buffers\": [");
    for (int i = 0; i < r->n_bufts; i++) {
        struct dummy_backend * d = r->bufts[i]->context;
        printf("%s[", i ? ", " : "");
        for (int k = d->n_external; k < d->n_buffers; k++) {
            printf("%s%zu", k > d->n_external ? ", " : "", ggml_backend_buffer_get_size(d->buffers[k]));
        }
        printf("]");
    }
    printf("], \"buffer_sizes\": [");
    for (int i = 0; i < r->n_bufts; i++) {
        size_t size = galloc ? ggml_gallocr_get_buffer_size(galloc, i)
                             : ggml_backend_sched_get_buffer_size(sched, &((struct dummy_backend *) r->bufts[i]->context)->backend);
        printf("%s%zu", i ? ", " : "", size);
    }
    printf("], \"allocated_total\": [");
    for (int i = 0; i < r->n_dummies; i++) {
        printf("%s%zu", i ? ", " : "", allocated_total(r->dummies[i], 0, r->dummies[i]->n_buffers));
    }
    printf("], \"external\": [");
    for (int i = 0; i < r->n_dummies; i++) {
        printf("%s%zu", i ? ", " : "", allocated_total(r->dummies[i], 0, r->dummies[i]->n_external));
    }
    printf("], \"violations\": [");
    for (int i = 0; i < n_violations; i++) {
        printf("%s\"%s\"", i ? ", " : "", violations[i]);
    }
    printf("]}\n");
    fflush(stdout);
    n_violations = 0;
}

/* a run of one dummy backend, its buffer type the gallocr's only one, and one context */
static struct run single(const char * name, struct dummy_backend * b, struct ggml_context * ctx) {
    struct run r = { .name = name, .dummies = { b }, .n_dummies = 1, .bufts = { &b->buffer_type }, .n_bufts = 1, .ctxs = { ctx }, .n_ctxs = 1 };
    return r;
}

static void finish(struct run * r, ggml_gallocr_t galloc) {
    ggml_gallocr_free(galloc);
    for (int c = 0; c < r->n_ctxs; c++) {
        ggml_free(r->ctxs[c]);
    }
    for (int i = 0; i < r->n_dummies; i++) {
        free(r->dummies[i]);
    }
}

/* one graph on one dummy backend, as most cases of test-alloc.cpp do it: allocated, checked
   with the test's own checks, reported, freed */
static void run_single(const char * name, struct dummy_backend * b, struct ggml_context * ctx, struct ggml_cgraph * graph,
                       struct ggml_tensor * out) {
    bool ok;
    ggml_gallocr_t galloc = allocate_graph(graph, out, &b->buffer_type, &ok);
    check_all_allocated(graph);
    check_no_overlap(graph);
    check_max_size(ctx);
    struct run r = single(name, b, ctx);
    report(&r, graph, &ok, 1, galloc, NULL);
    finish(&r, galloc);
}

/* ------------------------------------------------------------------ test cases */

/* the first backend buffer is exhausted and further tensors need a second one */
static void test_max_size_too_many_tensors(void) {
    struct dummy_backend * backend = dummy_backend_init(16, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[7];
    x[0] = make_input_with_size(ctx, 8);
    x[1] = make_input_with_size(ctx, 8);
    x[2] = make_input_with_size(ctx, 8);
    x[3] = ggml_mul(ctx, x[0], x[1]);
    x[4] = ggml_add(ctx, x[1], x[2]);
    x[5] = ggml_add(ctx, x[3], x[0]);
    x[6] = ggml_add(ctx, x[4], x[5]);
    assign_names(ctx, "x");

    run_single("test_max_size_too_many_tensors", backend, ctx, graph, x[6]);
}

/* space is left in the first buffer, but not enough for a larger tensor */
static void test_max_size_tensor_too_large(void) {
    struct dummy_backend * backend = dummy_backend_init(32, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[3];
    x[0] = make_input_with_size(ctx, 16);   /* chunk 0, [0 , 16) */
    x[1] = make_input_with_size(ctx, 8);    /* chunk 0, [16, 24) */
    x[2] = ggml_concat(ctx, x[0], x[1], 0); /* chunk 1, [0 , 24) */
    assign_names(ctx, "x");

    run_single("test_max_size_tensor_too_large", backend, ctx, graph, x[2]);
}

/* a single tensor exceeds the max buffer size: a bigger buffer is asked for anyway */
static void test_tensor_larger_than_max_size(void) {
    struct dummy_backend * backend = dummy_backend_init(16, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[2];
    x[0] = make_input_with_size(ctx, 24);
    x[1] = ggml_scale(ctx, x[0], 2.0f);
    assign_names(ctx, "x");

    bool ok;
    ggml_gallocr_t galloc = allocate_graph(graph, x[1], &backend->buffer_type, &ok);
    check_all_allocated(graph);
    check_no_overlap(graph);
    struct run r = single("test_tensor_larger_than_max_size", backend, ctx);
    report(&r, graph, &ok, 1, galloc, NULL);
    finish(&r, galloc);
}

/* more tensors than 16 chunks of max_size hold: the last chunk grows to fit everything */
static void test_not_enough_chunks(void) {
    enum { max_chunks = 16, max_size = 8 };
    struct dummy_backend * backend = dummy_backend_init(max_size, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[max_chunks + 1];
    for (int i = 0; i < max_chunks + 1; ++i) {
        x[i] = make_input_with_size(ctx, max_size);
    }
    struct ggml_tensor * acc = x[0];
    for (int i = 0; i < max_chunks; ++i) {
        acc = ggml_add(ctx, acc, x[i + 1]);
    }
    assign_names(ctx, "x");

    bool ok;
    ggml_gallocr_t galloc = allocate_graph(graph, acc, &backend->buffer_type, &ok);
    check_all_allocated(graph);
    check_no_overlap(graph);
    struct run r = single("test_not_enough_chunks", backend, ctx);
    report(&r, graph, &ok, 1, galloc, NULL);
    finish(&r, galloc);
}

/* the leftover space of a chunk is filled after a large tensor needed a new chunk */
static void test_fill_leftover_space(void) {
    struct dummy_backend * backend = dummy_backend_init(16, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[4];
    x[0] = make_input_with_size(ctx, 8);
    x[1] = ggml_pad(ctx, x[0], 2, 0, 0, 0);
    x[3] = ggml_mean(ctx, x[1]);
    assign_names(ctx, "x");

    run_single("test_fill_leftover_space", backend, ctx, graph, x[3]);
}

/* views need no extra memory */
static void test_view_inplace(void) {
    struct dummy_backend * backend = dummy_backend_init(32, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[6];
    x[0] = make_input_1d(ctx, 4);               /* chunk 0, [0, 16) */
    x[1] = ggml_reshape_2d(ctx, x[0], 2, 2);    /* view of x0 */
    x[2] = ggml_permute(ctx, x[1], 1, 0, 2, 3); /* view of x0 */
    x[3] = ggml_view_1d(ctx, x[2], 2, 4);       /* view of x0 */
    x[4] = make_input_1d(ctx, 2);               /* chunk 0, [16, 24) */
    x[5] = ggml_add(ctx, x[3], x[4]);           /* reuse (inplace add) */
    assign_names(ctx, "x");

    run_single("test_view_inplace", backend, ctx, graph, x[5]);
}

static void test_reuse_and_free(void) {
    struct dummy_backend * backend = dummy_backend_init(40, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[9];
    x[0] = make_input_with_size(ctx, 24);
    x[1] = make_input_with_size(ctx, 8);
    x[2] = make_input_with_size(ctx, 8);
    x[3] = ggml_add(ctx, x[1], x[2]);       /* reuse, free x2 */
    x[4] = ggml_pad(ctx, x[0], 2, 0, 0, 0); /* alloc new buffer, free x0 */
    x[5] = ggml_scale(ctx, x[4], 2.0f);     /* alloc from free block */
    x[6] = ggml_add(ctx, x[4], x[5]);       /* reuse, free x5 */
    x[7] = ggml_view_1d(ctx, x[6], 2, 8);   /* view */
    x[8] = ggml_add(ctx, x[3], x[7]);       /* reuse */
    assign_names(ctx, "x");

    run_single("test_reuse_and_free", backend, ctx, graph, x[8]);
}

static void test_merge_free_block(const char * name, size_t max_buffer_size) {
    struct dummy_backend * backend = dummy_backend_init(max_buffer_size, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[9];
    x[0] = make_input_with_size(ctx, 16);
    x[1] = make_input_with_size(ctx, 16);
    x[2] = make_input_with_size(ctx, 16);
    x[3] = ggml_mean(ctx, x[0]);
    x[4] = ggml_mean(ctx, x[1]);
    x[5] = ggml_pad(ctx, x[2], 2, 0, 0, 0);
    x[6] = ggml_add(ctx, x[3], x[4]);
    x[7] = ggml_pad(ctx, x[6], 5, 0, 0, 0);
    x[8] = ggml_add(ctx, x[5], x[7]);
    assign_names(ctx, "x");

    bool ok;
    ggml_gallocr_t galloc = allocate_graph(graph, x[8], &backend->buffer_type, &ok);
    check_all_allocated(graph);
    check_no_overlap(graph);
    check_max_size(ctx);
    struct run r = single(name, backend, ctx);
    report(&r, graph, &ok, 1, galloc, NULL);
    finish(&r, galloc);
}

/* freed memory is preferred over growing a chunk, even where the chunk's rest would fit better */
static void test_prefer_already_allocated_memory(void) {
    struct dummy_backend * backend = dummy_backend_init(32, /*align*/ 4);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[3];
    x[0] = make_input_with_size(ctx, 24); /* [24b][8b unused] */
    x[1] = ggml_mean(ctx, x[0]);          /* [24b free][4b][4b unused] */
    x[2] = ggml_mean(ctx, x[1]);          /* should be allocated in the 24b block */
    assign_names(ctx, "x");

    bool ok;
    ggml_gallocr_t galloc = allocate_graph(graph, x[2], &backend->buffer_type, &ok);
    check_all_allocated(graph);
    check_no_overlap(graph);
    struct run r = single("test_prefer_already_allocated_memory", backend, ctx);
    report(&r, graph, &ok, 1, galloc, NULL);
    finish(&r, galloc);
}

/* two buffer types, some of the graph's tensors allocated outside the gallocr */
static void test_multiple_buffer_types(void) {
    struct dummy_backend * backend_a = dummy_backend_init(32, 8);
    struct dummy_backend * backend_b = dummy_backend_init(SIZE_MAX, 8);
    struct ggml_cgraph * graph_a, * graph_b, * graph; /* those of ctx_a and ctx_b unused, as in test-alloc.cpp */
    struct ggml_context * ctx_a = make_context(&graph_a);
    struct ggml_context * ctx_b = make_context(&graph_b);
    struct ggml_context * ctx = make_context(&graph);

    struct ggml_tensor * a[2];
    a[0] = make_input_with_size(ctx_a, 16);
    a[1] = make_input_with_size(ctx_a, 16);
    assign_names(ctx_a, "a");

    struct ggml_tensor * b[2];
    b[0] = make_input_with_size(ctx_b, 24);
    b[1] = make_input_with_size(ctx_b, 4);
    assign_names(ctx_b, "b");

    struct ggml_tensor * x[9];
    x[0] = make_input_with_size(ctx, 16);
    x[1] = ggml_mul(ctx, x[0], a[0]);
    x[2] = ggml_pad(ctx, x[1], 2, 0, 0, 0);
    x[3] = ggml_mul(ctx, x[2], b[0]);
    x[4] = ggml_mean(ctx, x[3]);
    x[5] = ggml_add(ctx, x[4], b[1]);
    x[6] = ggml_pad(ctx, x[5], 3, 0, 0, 0);
    x[7] = ggml_add(ctx, x[6], a[1]);
    x[8] = ggml_scale(ctx, x[7], 2.0f);
    assign_names(ctx, "x");

    ggml_backend_buffer_t buf_a = ggml_backend_alloc_ctx_tensors_from_buft(ctx_a, &backend_a->buffer_type);
    ggml_backend_buffer_t buf_b = ggml_backend_alloc_ctx_tensors_from_buft(ctx_b, &backend_b->buffer_type);
    backend_a->n_external = backend_a->n_buffers;
    backend_b->n_external = backend_b->n_buffers;
    ggml_backend_buffer_type_t bufts[2] = { &backend_a->buffer_type, &backend_b->buffer_type };

    /* buffer types assigned by hand, without the scheduler */
    ggml_set_output(x[8]);
    ggml_build_forward_expand(graph, x[8]);

    GGML_ASSERT(graph->n_leafs == 5);
    int leaf_buffer_ids[5];
    leaf_buffer_ids[get_leaf_id(graph, "a0")] = 0;
    leaf_buffer_ids[get_leaf_id(graph, "a1")] = 0;
    leaf_buffer_ids[get_leaf_id(graph, "b0")] = 1;
    leaf_buffer_ids[get_leaf_id(graph, "b1")] = 1;
    leaf_buffer_ids[get_leaf_id(graph, "x0")] = 0;

    GGML_ASSERT(graph->n_nodes == 8);
    int node_buffer_ids[8];
    node_buffer_ids[get_node_id(graph, "x1")] = 0;
    node_buffer_ids[get_node_id(graph, "x2")] = 0;
    node_buffer_ids[get_node_id(graph, "x3")] = 1;
    node_buffer_ids[get_node_id(graph, "x4")] = 1;
    node_buffer_ids[get_node_id(graph, "x5")] = 1;
    node_buffer_ids[get_node_id(graph, "x6")] = 1;
    node_buffer_ids[get_node_id(graph, "x7")] = 0;
    node_buffer_ids[get_node_id(graph, "x8")] = 0;

    ggml_gallocr_t galloc = ggml_gallocr_new_n(bufts, 2);
    bool results[2];
    results[0] = ggml_gallocr_reserve_n(galloc, graph, node_buffer_ids, leaf_buffer_ids);
    results[1] = ggml_gallocr_alloc_graph(galloc, graph);

    check_all_allocated(graph);
    check_no_overlap(graph);
    check_max_size(ctx);
    struct run r = { .name = "test_multiple_buffer_types", .dummies = { backend_a, backend_b }, .n_dummies = 2, .bufts = { bufts[0], bufts[1] },
                     .n_bufts = 2, .ctxs = { ctx, ctx_a, ctx_b }, .n_ctxs = 3 };
    report(&r, graph, results, 2, galloc, NULL);
    ggml_gallocr_free(galloc);
    ggml_backend_buffer_free(buf_b);
    ggml_backend_buffer_free(buf_a);
    finish(&r, NULL);
}

static void test_buffer_size_zero(void) {
    struct dummy_backend * backend_a = dummy_backend_init(SIZE_MAX, 8);
    struct dummy_backend * backend_b = dummy_backend_init(SIZE_MAX, 8);
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[2];
    x[0] = make_input_with_size(ctx, 16);
    x[1] = ggml_scale(ctx, x[0], 2.0f);
    assign_names(ctx, "x"); /* not in test-alloc.cpp: names for the report, which ggml-alloc never reads */

    ggml_set_output(x[1]);
    ggml_build_forward_expand(graph, x[1]);

    int leaf_buffer_ids[1] = { 0 };
    int node_buffer_ids[1] = { 0 };

    ggml_backend_buffer_type_t bufts[2] = { &backend_a->buffer_type, &backend_b->buffer_type };
    ggml_gallocr_t galloc = ggml_gallocr_new_n(bufts, 2);
    bool results[2];
    results[0] = ggml_gallocr_reserve_n(galloc, graph, node_buffer_ids, leaf_buffer_ids);
    results[1] = ggml_gallocr_alloc_graph(galloc, graph);

    check_all_allocated(graph);
    struct run r = { .name = "test_buffer_size_zero", .dummies = { backend_a, backend_b }, .n_dummies = 2, .bufts = { bufts[0], bufts[1] },
                     .n_bufts = 2, .ctxs = { ctx }, .n_ctxs = 1 };
    report(&r, graph, results, 2, galloc, NULL);
    finish(&r, galloc);
}

/* a gallocr reused for another graph of the same total size, one of whose chunks is larger */
static void test_reallocation(void) {
    struct dummy_backend * backend = dummy_backend_init(32, /*align*/ 4);
    ggml_gallocr_t galloc;
    struct run r = single("test_reallocation", backend, NULL);
    {
        struct ggml_cgraph * graph;
        struct ggml_context * ctx = make_context(&graph);
        struct ggml_tensor * x[4];
        x[0] = make_input_with_size(ctx, 24);
        x[1] = make_input_with_size(ctx, 16);
        x[2] = ggml_view_1d(ctx, x[0], 4, 0);
        x[3] = ggml_add(ctx, x[2], x[1]);
        assign_names(ctx, "x");

        bool ok;
        galloc = allocate_graph(graph, x[3], &backend->buffer_type, &ok);
        check_all_allocated(graph);
        r.ctxs[0] = ctx;
        report(&r, graph, &ok, 1, galloc, NULL);
        ggml_free(ctx);
    }
    {
        struct ggml_cgraph * graph;
        struct ggml_context * ctx = make_context(&graph);
        struct ggml_tensor * x[3];
        x[0] = make_input_with_size(ctx, 20);
        x[1] = make_input_with_size(ctx, 20);
        x[2] = ggml_add(ctx, x[0], x[1]);
        assign_names(ctx, "x");
        ggml_set_output(x[2]);
        ggml_build_forward_expand(graph, x[2]);

        bool ok = ggml_gallocr_alloc_graph(galloc, graph);
        check_all_allocated(graph);
        r.ctxs[0] = ctx;
        report(&r, graph, &ok, 1, galloc, NULL);
    }
    finish(&r, galloc);
}

static void test_backend_graph_optimize(ggml_backend_t backend, struct ggml_cgraph * graph, struct ggml_backend_graph_optimize_params * params) {
    (void) backend;
    GGML_ASSERT(graph->n_nodes == 3);
    params->add_alloc_dep(params->user_data, graph->nodes[0], graph->nodes[2]);
}

/* graph_reuses_allocation: the scheduler allocates x2 in place of x1 unless the backend's
 * graph_optimize keeps x1 alive until x3 */
static void graph_reuses_allocation(const char * name, bool add_alloc_dep) {
    struct ggml_cgraph * graph;
    struct ggml_context * ctx = make_context(&graph);
    struct ggml_tensor * x[4];
    x[0] = make_input_with_size(ctx, 16);
    x[1] = ggml_scale(ctx, x[0], 2.0f);
    x[2] = ggml_scale(ctx, x[1], 2.0f);
    x[3] = ggml_scale(ctx, x[2], 2.0f);
    assign_names(ctx, "x"); /* not in test-alloc.cpp: names for the report, which the scheduler never reads */

    ggml_set_output(x[3]);
    ggml_build_forward_expand(graph, x[3]);

    struct dummy_backend * backend = dummy_backend_init(SIZE_MAX, 8);
    if (add_alloc_dep) {
        backend->backend.iface.graph_optimize = test_backend_graph_optimize;
    }
    ggml_backend_t backend_ptr = &backend->backend;
    ggml_backend_buffer_type_t buft = &backend->buffer_type;
    ggml_backend_sched_t sched = ggml_backend_sched_new(&backend_ptr, &buft, 1, 8, false, true);
    bool ok = ggml_backend_sched_alloc_graph(sched, graph);

    struct run r = single(name, backend, ctx);
    report(&r, graph, &ok, 1, NULL, sched);
    ggml_backend_sched_free(sched);
    finish(&r, NULL);
}

int main(int argc, char ** argv) {
    const char * only = argc > 1 ? argv[1] : NULL; /* a case's name: run it alone */
#define RUN(name, call) if (!only || strcmp(only, name) == 0) { call; }
    RUN("test_max_size_too_many_tensors", test_max_size_too_many_tensors());
    RUN("test_max_size_tensor_too_large", test_max_size_tensor_too_large());
    RUN("test_tensor_larger_than_max_size", test_tensor_larger_than_max_size());
    RUN("test_not_enough_chunks", test_not_enough_chunks());
    RUN("test_fill_leftover_space", test_fill_leftover_space());
    RUN("test_view_inplace", test_view_inplace());
    RUN("test_reuse_and_free", test_reuse_and_free());
    RUN("test_merge_free_block(32)", test_merge_free_block("test_merge_free_block(32)", 32));
    RUN("test_merge_free_block(SIZE_MAX)", test_merge_free_block("test_merge_free_block(SIZE_MAX)", SIZE_MAX));
    RUN("test_prefer_already_allocated_memory", test_prefer_already_allocated_memory());
    RUN("test_multiple_buffer_types", test_multiple_buffer_types());
    RUN("test_buffer_size_zero", test_buffer_size_zero());
    RUN("test_reallocation", test_reallocation());
    RUN("graph_reuses_allocation(false)", graph_reuses_allocation("graph_reuses_allocation(false)", false));
    RUN("graph_reuses_allocation(true)", graph_reuses_allocation("graph_reuses_allocation(true)", true));
#undef RUN
    return 0;
}

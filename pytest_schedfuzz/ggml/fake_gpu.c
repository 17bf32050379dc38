/* schedfuzz's GPU-like device: a real ggml backend (device, buffer types, events) that computes
 * on host memory by handing each graph to a CPU backend, but shows the scheduler what a GPU does:
 *
 *   - its own buffer type, which no other backend supports (or, "shared", the CPU's buffer type,
 *     as accelerator devices such as BLAS use it);
 *   - offload_op for ops whose batch (ne[1], or as ggml-cuda and ggml-vulkan measure it: see
 *     op_batch_size) reaches a threshold, as GPU backends do;
 *   - a configurable supports_op (the ops it refuses, by ggml_op_name);
 *   - a maximum buffer size (the allocator splits its buffers into chunks; a larger request fails,
 *     as a device allocation would) and an alignment;
 *   - optionally a host (pinned) buffer type for the CPU's side of the copies;
 *   - optionally graph_optimize, which reorders each split it computes (a stable sort by depth,
 *     see fake_gpu_graph_optimize), as GPU backends reorder for concurrency;
 *   - optionally (0.25.3) fusions in graph_optimize, whose inputs it asks the scheduler to keep
 *     alive until the fused node (add_alloc_dep: dependency nodes in the scheduler's graph copy),
 *     as Metal, Vulkan and CUDA do; see fake_gpu_fuse;
 *   - peer copies between two such devices (cpy_tensor_async, as ggml-cuda's);
 *   - events always; optionally asynchronous execution: compute and async copies run in order on
 *     a thread of the device's own, each after a delay, so missing synchronisation changes results;
 *   - a memory size: it reports its free memory (what it has not allocated of it) and refuses an
 *     allocation beyond it, as a device out of memory does;
 *   - for llama.cpp, a backend registry of its own (schedfuzz_fake_gpu_register): llama.cpp makes
 *     the device's backends itself (init_backend), each computing through a CPU backend it owns,
 *     at submission (see dev_init_backend);
 *   - for tests only, a planted fault: one op's results come back wrong, off by one, NaN or +Inf
 *     (corrupt_op).
 *
 * Built against the ggml under test (its public headers and src/ggml-backend-impl.h, ggml-impl.h),
 * by pytest_schedfuzz.ggml.build.build_fake_gpu. The interface structs are the same in ggml 0.15.3 and
 * 0.25.3 except graph_optimize, which gained a parameter: SCHEDFUZZ_OPTIMIZE_PARAMS selects it. */
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"
#include "ggml-impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fake_gpu_config {
    int64_t offload_min_batch;   /* <= 0: no offload_op */
    size_t  max_size;            /* 0: no limit */
    size_t  alignment;
    int     host_buffer;         /* a host buffer type beside the device's own */
    int     shared_buft;         /* use the CPU buffer type (an accelerator) instead of an own one */
    int     graph_optimize;
    int     async;
    int     delay_us;            /* before each asynchronous task */
    char    unsupported[512];    /* op names refused by supports_op, comma separated */
    size_t  memory;              /* 0: 16 GiB */
    char    corrupt_op[32];      /* a planted fault: "OP" adds 1 to the first element of each result of op OP;
                                    "OP=nan" or "OP=inf" writes a NaN or +Inf there instead */
    int     fuse;                /* graph_optimize fuses (fake_gpu_fuse), where ggml passes add_alloc_dep */
    int     cuda_batch;          /* offload_op measures an op's batch as ggml-cuda does (op_batch_size), not by ne[1] */
};

/* ------------------------------------------------------------------ asynchronous queue */

enum task_kind { TASK_COMPUTE, TASK_MEMCPY, TASK_RECORD, TASK_WAIT };

/* records are numbered: a wait is for the records made before it, not for later ones */
struct fake_gpu_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded; /* record calls so far */
    uint64_t done;     /* the highest record the device has reached */
};

struct task {
    enum task_kind kind;
    struct ggml_cgraph graph;  /* by value: the scheduler may pass a graph on its stack */
    void * dst;
    const void * src;
    size_t size;
    struct fake_gpu_event * event;
    uint64_t seq;              /* the record this task makes, or waits for */
};

struct fake_gpu {
    struct fake_gpu_config cfg;
    char name[32];
    char host_name[40];
    ggml_backend_t cpu;
    int owns_cpu;              /* a backend llama.cpp made (init_backend): its CPU backend is its own */
    ggml_backend_dev_t cpu_dev; /* a registered device: where its backends get their CPU backend */
    size_t allocated;          /* bytes of the device's own buffer type in use */
    size_t limit;              /* what it may allocate in all (its memory, or what set_free left) */
    struct ggml_backend_reg reg;
    struct ggml_backend_buffer_type buft;
    struct ggml_backend_buffer_type host_buft;
    struct ggml_backend_device device;
    /* the queue */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct task * tasks;
    int n_tasks, cap_tasks, head, busy, stop;
    enum ggml_status status; /* the first failed compute, reported at synchronize */
    int dep_nodes;           /* the scheduler's dependency nodes for the fusions since the last take */
};

static void event_signal(struct fake_gpu_event * ev, uint64_t seq) {
    pthread_mutex_lock(&ev->mu);
    ev->done = seq > ev->done ? seq : ev->done;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

static void event_block(struct fake_gpu_event * ev, uint64_t seq) {
    pthread_mutex_lock(&ev->mu);
    while (ev->done < seq) {
        pthread_cond_wait(&ev->cv, &ev->mu);
    }
    pthread_mutex_unlock(&ev->mu);
}

static uint64_t event_last(struct fake_gpu_event * ev, int next) {
    pthread_mutex_lock(&ev->mu);
    uint64_t seq = next ? ++ev->recorded : ev->recorded;
    pthread_mutex_unlock(&ev->mu);
    return seq;
}

static void corrupt(struct fake_gpu * gpu, struct ggml_cgraph * graph) {
    char op[32];
    strncpy(op, gpu->cfg.corrupt_op, sizeof(op) - 1);
    op[sizeof(op) - 1] = '\0';
    char * value = strchr(op, '=');
    if (value != NULL) {
        *value++ = '\0';
    }
    for (int i = 0; i < graph->n_nodes; i++) {
        struct ggml_tensor * t = graph->nodes[i];
        if (t->type == GGML_TYPE_F32 && t->data != NULL && strcmp(ggml_op_name(t->op), op) == 0) {
            float * first = (float *) t->data;
            if (value == NULL) {
                *first += 1.0f;
            } else if (strcmp(value, "nan") == 0) {
                *first = __builtin_nanf("");
            } else {
                *first = __builtin_inff();
            }
        }
    }
}

static void run_task(struct fake_gpu * gpu, struct task * t) {
    switch (t->kind) {
        case TASK_COMPUTE: {
            enum ggml_status st = ggml_backend_graph_compute(gpu->cpu, &t->graph);
            if (st != GGML_STATUS_SUCCESS && gpu->status == GGML_STATUS_SUCCESS) {
                gpu->status = st;
            }
            if (gpu->cfg.corrupt_op[0]) {
                corrupt(gpu, &t->graph);
            }
            break;
        }
        case TASK_MEMCPY: memcpy(t->dst, t->src, t->size); break;
        case TASK_RECORD: event_signal(t->event, t->seq); break;
        case TASK_WAIT:   event_block(t->event, t->seq); break;
    }
}

static void * queue_main(void * arg) {
    struct fake_gpu * gpu = arg;
    pthread_mutex_lock(&gpu->mu);
    for (;;) {
        while (gpu->head == gpu->n_tasks && !gpu->stop) {
            pthread_cond_wait(&gpu->cv, &gpu->mu);
        }
        if (gpu->head == gpu->n_tasks) {
            break;
        }
        struct task t = gpu->tasks[gpu->head++];
        gpu->busy = 1;
        pthread_mutex_unlock(&gpu->mu);
        if (gpu->cfg.delay_us > 0 && t.kind != TASK_RECORD) {
            usleep(gpu->cfg.delay_us);
        }
        run_task(gpu, &t);
        pthread_mutex_lock(&gpu->mu);
        gpu->busy = 0;
        if (gpu->head == gpu->n_tasks) {
            gpu->head = gpu->n_tasks = 0;
        }
        pthread_cond_broadcast(&gpu->cv);
    }
    pthread_mutex_unlock(&gpu->mu);
    return NULL;
}

/* run now (synchronous device) or queue behind the device's earlier work */
static void submit(struct fake_gpu * gpu, struct task t) {
    if (!gpu->cfg.async) {
        run_task(gpu, &t);
        return;
    }
    pthread_mutex_lock(&gpu->mu);
    if (gpu->n_tasks == gpu->cap_tasks) {
        gpu->cap_tasks = gpu->cap_tasks ? 2 * gpu->cap_tasks : 64;
        gpu->tasks = realloc(gpu->tasks, gpu->cap_tasks * sizeof(struct task));
        GGML_ASSERT(gpu->tasks != NULL);
    }
    gpu->tasks[gpu->n_tasks++] = t;
    pthread_cond_broadcast(&gpu->cv);
    pthread_mutex_unlock(&gpu->mu);
}

static void drain(struct fake_gpu * gpu) {
    if (!gpu->cfg.async) {
        return;
    }
    pthread_mutex_lock(&gpu->mu);
    while (gpu->head != gpu->n_tasks || gpu->busy) {
        pthread_cond_wait(&gpu->cv, &gpu->mu);
    }
    pthread_mutex_unlock(&gpu->mu);
}

/* ------------------------------------------------------------------ buffers */

static void buffer_free(ggml_backend_buffer_t buffer) {
    struct fake_gpu * gpu = buffer->buft->context;
    if (buffer->buft == &gpu->buft) {
        gpu->allocated -= buffer->size;
    }
    free(buffer->context);
}

static void * buffer_get_base(ggml_backend_buffer_t buffer) {
    return buffer->context;
}

static void buffer_memset_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, uint8_t value, size_t offset, size_t size) {
    memset((char *) tensor->data + offset, value, size);
    GGML_UNUSED(buffer);
}

static void buffer_set_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    memcpy((char *) tensor->data + offset, data, size);
    GGML_UNUSED(buffer);
}

static void buffer_get_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    memcpy(data, (const char *) tensor->data + offset, size);
    GGML_UNUSED(buffer);
}

static bool buffer_cpy_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor * src, struct ggml_tensor * dst) {
    /* from host memory or from a buffer of the same device, as a GPU copies */
    if (ggml_backend_buffer_is_host(src->buffer) || src->buffer->buft == buffer->buft) {
        memcpy(dst->data, src->data, ggml_nbytes(src));
        return true;
    }
    return false;
}

static void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    memset(buffer->context, value, buffer->size);
}

static const struct ggml_backend_buffer_i fake_buffer_i = {
    .free_buffer   = buffer_free,
    .get_base      = buffer_get_base,
    .init_tensor   = NULL,
    .memset_tensor = buffer_memset_tensor,
    .set_tensor    = buffer_set_tensor,
    .get_tensor    = buffer_get_tensor,
    .cpy_tensor    = buffer_cpy_tensor,
    .clear         = buffer_clear,
    .reset         = NULL,
};

static const char * buft_get_name(ggml_backend_buffer_type_t buft) {
    struct fake_gpu * gpu = buft->context;
    return buft == &gpu->host_buft ? gpu->host_name : gpu->name;
}

static ggml_backend_buffer_t buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    struct fake_gpu * gpu = buft->context;
    if (buft == &gpu->buft && gpu->cfg.max_size && size > gpu->cfg.max_size) {
        /* as a device refuses an allocation over its limit */
        GGML_LOG_ERROR("%s: %zu bytes requested, over the maximum buffer size %zu\n", gpu->name, size, gpu->cfg.max_size);
        return NULL;
    }
    if (buft == &gpu->buft && gpu->allocated + size > gpu->limit) {
        GGML_LOG_ERROR("%s: out of memory: %zu bytes requested, %zu of %zu free\n", gpu->name, size, gpu->limit - gpu->allocated, gpu->limit);
        return NULL;
    }
    size_t align = gpu->cfg.alignment < 64 ? 64 : gpu->cfg.alignment;
    void * data = aligned_alloc(align, ((size ? size : 1) + align - 1) / align * align);
    if (data == NULL) {
        return NULL;
    }
    if (buft == &gpu->buft) {
        gpu->allocated += size;
    }
    return ggml_backend_buffer_init(buft, fake_buffer_i, data, size);
}

static size_t buft_get_alignment(ggml_backend_buffer_type_t buft) {
    struct fake_gpu * gpu = buft->context;
    return gpu->cfg.alignment;
}

static size_t buft_get_max_size(ggml_backend_buffer_type_t buft) {
    struct fake_gpu * gpu = buft->context;
    return buft == &gpu->buft && gpu->cfg.max_size ? gpu->cfg.max_size : SIZE_MAX;
}

static bool buft_is_host(ggml_backend_buffer_type_t buft) {
    struct fake_gpu * gpu = buft->context;
    return buft == &gpu->host_buft;
}

static const struct ggml_backend_buffer_type_i fake_buft_i = {
    .get_name       = buft_get_name,
    .alloc_buffer   = buft_alloc_buffer,
    .get_alignment  = buft_get_alignment,
    .get_max_size   = buft_get_max_size,
    .get_alloc_size = NULL,
    .is_host        = buft_is_host,
};

/* ------------------------------------------------------------------ backend */

static struct fake_gpu * gpu_of(ggml_backend_t backend) {
    return backend->context;
}

static const char * backend_get_name(ggml_backend_t backend) {
    return gpu_of(backend)->name;
}

static void backend_free(ggml_backend_t backend) {
    struct fake_gpu * gpu = gpu_of(backend);
    if (gpu->cfg.async) {
        drain(gpu);
        pthread_mutex_lock(&gpu->mu);
        gpu->stop = 1;
        pthread_cond_broadcast(&gpu->cv);
        pthread_mutex_unlock(&gpu->mu);
        pthread_join(gpu->thread, NULL);
    }
    free(gpu->tasks);
    if (gpu->owns_cpu) {
        ggml_backend_free(gpu->cpu);
    }
    free(gpu);
    free(backend);
}

static void backend_set_tensor_async(ggml_backend_t backend, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    submit(gpu_of(backend), (struct task) { .kind = TASK_MEMCPY, .dst = (char *) tensor->data + offset, .src = data, .size = size });
}

static void backend_get_tensor_async(ggml_backend_t backend, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    submit(gpu_of(backend), (struct task) { .kind = TASK_MEMCPY, .dst = data, .src = (const char *) tensor->data + offset, .size = size });
}

static void backend_synchronize(ggml_backend_t backend) {
    drain(gpu_of(backend));
}

static enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph) {
    struct fake_gpu * gpu = gpu_of(backend);
    if (gpu->status != GGML_STATUS_SUCCESS) {
        enum ggml_status st = gpu->status;
        gpu->status = GGML_STATUS_SUCCESS;
        return st;
    }
    submit(gpu, (struct task) { .kind = TASK_COMPUTE, .graph = *cgraph });
    return GGML_STATUS_SUCCESS;
}

/* a peer copy, as ggml-cuda's cpy_tensor_async: only between two GPU-like devices' own buffers
 * (else false, and the scheduler copies synchronously); queued on the destination once the
 * source has done what it was given (ggml-cuda records an event on the source's stream and
 * makes the destination's wait for it) */
static bool backend_cpy_tensor_async(ggml_backend_t backend_src, ggml_backend_t backend_dst, const struct ggml_tensor * src, struct ggml_tensor * dst) {
    if (backend_src->iface.graph_compute != backend_graph_compute || backend_dst->iface.graph_compute != backend_graph_compute) {
        return false;
    }
    struct fake_gpu * from = gpu_of(backend_src);
    struct fake_gpu * to = gpu_of(backend_dst);
    struct ggml_tensor * src_base = src->view_src ? src->view_src : (struct ggml_tensor *) src;
    struct ggml_tensor * dst_base = dst->view_src ? dst->view_src : dst;
    if (src_base->buffer == NULL || dst_base->buffer == NULL || src_base->buffer->buft != &from->buft || dst_base->buffer->buft != &to->buft) {
        return false;
    }
    drain(from);
    submit(to, (struct task) { .kind = TASK_MEMCPY, .dst = dst->data, .src = src->data, .size = ggml_nbytes(src) });
    return true;
}

static void backend_event_record(ggml_backend_t backend, ggml_backend_event_t event) {
    struct fake_gpu_event * ev = event->context;
    submit(gpu_of(backend), (struct task) { .kind = TASK_RECORD, .event = ev, .seq = event_last(ev, 1) });
}

static void backend_event_wait(ggml_backend_t backend, ggml_backend_event_t event) {
    struct fake_gpu_event * ev = event->context;
    submit(gpu_of(backend), (struct task) { .kind = TASK_WAIT, .event = ev, .seq = event_last(ev, 0) });
}

static bool same_storage(const struct ggml_tensor * a, const struct ggml_tensor * b) {
    const struct ggml_tensor * ra = a->view_src ? a->view_src : a;
    const struct ggml_tensor * rb = b->view_src ? b->view_src : b;
    return ra == rb;
}

/* Does node j (earlier) have to stay before node i? When i reads j, or both touch one storage
 * (a write through a view, as set_rows into a cache, has no edge to the cache's readers). */
static bool depends(const struct ggml_tensor * i, const struct ggml_tensor * j) {
    if (same_storage(i, j)) {
        return true;
    }
    for (int s = 0; s < GGML_MAX_SRC; s++) {
        if (i->src[s] != NULL && (i->src[s] == j || same_storage(i->src[s], j))) {
            return true;
        }
    }
    return false;
}

/* A stable sort of the split's nodes by depth (0 for a node that depends on no earlier node of
 * the split, else one more than the deepest it depends on): independent nodes move together, as a
 * GPU backend groups them for concurrent execution. Mirrored by reference.backends.optimize_order. */
static void fake_gpu_reorder(struct ggml_cgraph * cgraph) {
    int n = cgraph->n_nodes;
    if (n < 2) {
        return;
    }
    int * depth = calloc(n, sizeof(int));
    struct ggml_tensor ** sorted = malloc(n * sizeof(struct ggml_tensor *));
    GGML_ASSERT(depth != NULL && sorted != NULL);
    int max_depth = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++) {
            if (depth[j] + 1 > depth[i] && depends(cgraph->nodes[i], cgraph->nodes[j])) {
                depth[i] = depth[j] + 1;
            }
        }
        max_depth = depth[i] > max_depth ? depth[i] : max_depth;
    }
    int k = 0;
    for (int d = 0; d <= max_depth; d++) {
        for (int i = 0; i < n; i++) {
            if (depth[i] == d) {
                sorted[k++] = cgraph->nodes[i];
            }
        }
    }
    memcpy(cgraph->nodes, sorted, n * sizeof(struct ggml_tensor *));
    free(sorted);
    free(depth);
}

#ifdef SCHEDFUZZ_OPTIMIZE_PARAMS
/* Fusions as Metal's and Vulkan's graph_optimize find them, for a pattern of two: a node the next
 * node reads is fused with it, and the pair's external inputs (every src of the two but the first
 * node) are kept alive until the second (add_alloc_dep), which the fused kernel reads them for;
 * the next pair starts after it. Returns the dependency nodes the scheduler makes of them (one
 * per GGML_MAX_SRC tensors kept until a node). Mirrored by reference.backends.fusion_deps. */
static int fake_gpu_fuse(struct ggml_cgraph * cgraph, struct ggml_backend_graph_optimize_params * params) {
    int n_dep_nodes = 0;
    for (int i = 0; i + 1 < cgraph->n_nodes; i++) {
        struct ggml_tensor * pair[2] = { cgraph->nodes[i], cgraph->nodes[i + 1] };
        int reads = 0;
        for (int s = 0; s < GGML_MAX_SRC; s++) {
            reads |= pair[1]->src[s] == pair[0];
        }
        if (!reads) {
            continue;
        }
        struct ggml_tensor * seen[2 * GGML_MAX_SRC + 2];
        int n_seen = 0, n_kept = 0;
        for (int j = 0; j < 2; j++) {
            for (int s = 0; s < GGML_MAX_SRC; s++) {
                struct ggml_tensor * src = pair[j]->src[s];
                int known = src == NULL;
                for (int k = 0; k < n_seen && !known; k++) {
                    known = seen[k] == src;
                }
                if (!known) {
                    seen[n_seen++] = src;
                    params->add_alloc_dep(params->user_data, src, pair[1]);
                    n_kept++;
                }
            }
            seen[n_seen++] = pair[j];
        }
        n_dep_nodes += (n_kept + GGML_MAX_SRC - 1) / GGML_MAX_SRC;
        i++;
    }
    return n_dep_nodes;
}

static void backend_graph_optimize(ggml_backend_t backend, struct ggml_cgraph * cgraph, struct ggml_backend_graph_optimize_params * params) {
#else
static void backend_graph_optimize(ggml_backend_t backend, struct ggml_cgraph * cgraph) {
#endif
    struct fake_gpu * gpu = gpu_of(backend);
    if (gpu->cfg.graph_optimize) {
        fake_gpu_reorder(cgraph);
    }
#ifdef SCHEDFUZZ_OPTIMIZE_PARAMS
    if (gpu->cfg.fuse && params != NULL && params->add_alloc_dep != NULL) {
        gpu->dep_nodes += fake_gpu_fuse(cgraph, params);
    }
#endif
}

static const struct ggml_backend_i fake_backend_i = {
    .get_name           = backend_get_name,
    .free               = backend_free,
    .set_tensor_async   = backend_set_tensor_async,
    .get_tensor_async   = backend_get_tensor_async,
    .cpy_tensor_async   = backend_cpy_tensor_async,
    .synchronize        = backend_synchronize,
    .graph_plan_create  = NULL,
    .graph_plan_free    = NULL,
    .graph_plan_update  = NULL,
    .graph_plan_compute = NULL,
    .graph_compute      = backend_graph_compute,
    .event_record       = backend_event_record,
    .event_wait         = backend_event_wait,
    .graph_optimize     = backend_graph_optimize,
};

/* ------------------------------------------------------------------ device */

static struct fake_gpu * gpu_of_dev(ggml_backend_dev_t dev) {
    return dev->context;
}

static const char * dev_get_name(ggml_backend_dev_t dev) {
    return gpu_of_dev(dev)->name;
}

static const char * dev_get_description(ggml_backend_dev_t dev) {
    GGML_UNUSED(dev);
    return "schedfuzz GPU-like device (computes on the CPU)";
}

static void dev_get_memory(ggml_backend_dev_t dev, size_t * free_mem, size_t * total) {
    struct fake_gpu * gpu = gpu_of_dev(dev);
    *free_mem = gpu->limit > gpu->allocated ? gpu->limit - gpu->allocated : 0;
    *total = gpu->cfg.memory;
}

static enum ggml_backend_dev_type dev_get_type(ggml_backend_dev_t dev) {
    return gpu_of_dev(dev)->cfg.shared_buft ? GGML_BACKEND_DEVICE_TYPE_ACCEL : GGML_BACKEND_DEVICE_TYPE_GPU;
}

static void dev_get_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props * props) {
    memset(props, 0, sizeof(*props));
    props->name = dev_get_name(dev);
    props->description = dev_get_description(dev);
    props->type = dev_get_type(dev);
    dev_get_memory(dev, &props->memory_free, &props->memory_total);
    props->caps.async = gpu_of_dev(dev)->cfg.async;
    props->caps.events = true;
}

static ggml_backend_buffer_type_t dev_get_buffer_type(ggml_backend_dev_t dev) {
    struct fake_gpu * gpu = gpu_of_dev(dev);
    return gpu->cfg.shared_buft ? ggml_backend_cpu_buffer_type() : &gpu->buft;
}

static ggml_backend_buffer_type_t dev_get_host_buffer_type(ggml_backend_dev_t dev) {
    struct fake_gpu * gpu = gpu_of_dev(dev);
    return gpu->cfg.host_buffer ? &gpu->host_buft : NULL;
}

static bool dev_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    const char * name = ggml_op_name(op->op);
    const char * list = gpu_of_dev(dev)->cfg.unsupported;
    size_t len = strlen(name);
    for (const char * p = list; *p; ) {
        const char * end = strchr(p, ',');
        size_t n = end ? (size_t) (end - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0) {
            return false;
        }
        p += n + (end ? 1 : 0);
    }
    return true;
}

static bool dev_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    struct fake_gpu * gpu = gpu_of_dev(dev);
    return gpu->cfg.shared_buft ? ggml_backend_buft_is_host(buft) : buft == &gpu->buft;
}

/* ggml-cuda's get_op_batch_size (ggml-vulkan's ggml_vk_get_op_batch_size is the same): a routed
 * expert matmul and a rope count tokens in ne[2], GET_ROWS is never offloaded, others by rows */
static int64_t op_batch_size(const struct ggml_tensor * op) {
    switch (op->op) {
        case GGML_OP_GET_ROWS:
            return 0;
        case GGML_OP_MUL_MAT:
            return op->ne[1];
        case GGML_OP_MUL_MAT_ID:
        case GGML_OP_ROPE:
        case GGML_OP_ROPE_BACK:
            return op->ne[2];
        default:
            return ggml_nrows(op);
    }
}

static bool dev_offload_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    struct fake_gpu * gpu = gpu_of_dev(dev);
    int64_t batch = gpu->cfg.cuda_batch ? op_batch_size(op) : op->ne[1];
    return gpu->cfg.offload_min_batch > 0 && batch >= gpu->cfg.offload_min_batch;
}

static ggml_backend_event_t dev_event_new(ggml_backend_dev_t dev) {
    struct fake_gpu_event * ev = calloc(1, sizeof(*ev));
    struct ggml_backend_event * event = calloc(1, sizeof(*event));
    GGML_ASSERT(ev != NULL && event != NULL);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    event->device = dev;
    event->context = ev;
    return event;
}

static void dev_event_free(ggml_backend_dev_t dev, ggml_backend_event_t event) {
    GGML_UNUSED(dev);
    struct fake_gpu_event * ev = event->context;
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
    free(event);
}

static void dev_event_synchronize(ggml_backend_dev_t dev, ggml_backend_event_t event) {
    GGML_UNUSED(dev);
    struct fake_gpu_event * ev = event->context;
    event_block(ev, event_last(ev, 0));
}

static ggml_backend_t dev_init_backend(ggml_backend_dev_t dev, const char * params);

static const struct ggml_backend_device_i fake_device_i = {
    .get_name             = dev_get_name,
    .get_description      = dev_get_description,
    .get_memory           = dev_get_memory,
    .get_type             = dev_get_type,
    .get_props            = dev_get_props,
    .init_backend         = dev_init_backend,
    .get_buffer_type      = dev_get_buffer_type,
    .get_host_buffer_type = dev_get_host_buffer_type,
    .buffer_from_host_ptr = NULL,
    .supports_op          = dev_supports_op,
    .supports_buft        = dev_supports_buft,
    .offload_op           = dev_offload_op,
    .event_new            = dev_event_new,
    .event_free           = dev_event_free,
    .event_synchronize    = dev_event_synchronize,
};

static ggml_guid_t fake_gpu_guid(void) {
    static ggml_guid guid = { 0x73, 0x63, 0x68, 0x65, 0x64, 0x66, 0x75, 0x7a, 0x7a, 0x2d, 0x67, 0x70, 0x75, 0x00, 0x00, 0x01 };
    return &guid;
}

/* ------------------------------------------------------------------ entry points */

/* The size of struct fake_gpu_config, so that the caller can check its own layout. */
/* The dependency nodes the scheduler made for this device's fusions since the last call. */
int schedfuzz_fake_gpu_take_dep_nodes(ggml_backend_t backend) {
    struct fake_gpu * gpu = gpu_of(backend);
    int n = gpu->dep_nodes;
    gpu->dep_nodes = 0;
    return n;
}

size_t schedfuzz_fake_gpu_config_size(void) {
    return sizeof(struct fake_gpu_config);
}

/* A new device and its backend, named ``name``, computing through ``cpu`` (which it does not
 * own). The caller frees it with ggml_backend_free. */
static struct fake_gpu * new_gpu(const char * name, const struct fake_gpu_config * cfg) {
    struct fake_gpu * gpu = calloc(1, sizeof(*gpu));
    if (gpu == NULL || cfg->alignment == 0 || (cfg->alignment & (cfg->alignment - 1)) != 0) {
        free(gpu);
        return NULL;
    }
    gpu->cfg = *cfg;
    gpu->cfg.unsupported[sizeof(gpu->cfg.unsupported) - 1] = '\0';
    gpu->cfg.corrupt_op[sizeof(gpu->cfg.corrupt_op) - 1] = '\0';
    if (gpu->cfg.memory == 0) {
        gpu->cfg.memory = (size_t) 1 << 34;
    }
    gpu->limit = gpu->cfg.memory;
    snprintf(gpu->name, sizeof(gpu->name), "%s", name);
    snprintf(gpu->host_name, sizeof(gpu->host_name), "%s_Host", name);
    gpu->status = GGML_STATUS_SUCCESS;
    gpu->device = (struct ggml_backend_device) { .iface = fake_device_i, .reg = NULL, .context = gpu };
    gpu->buft = (struct ggml_backend_buffer_type) { .iface = fake_buft_i, .device = &gpu->device, .context = gpu };
    gpu->host_buft = (struct ggml_backend_buffer_type) { .iface = fake_buft_i, .device = &gpu->device, .context = gpu };
    return gpu;
}

/* A backend of ``dev`` computing through ``cpu``; ``gpu`` holds its queue (and, for a device the
 * graph engine makes, the device itself). */
static ggml_backend_t new_backend(struct fake_gpu * gpu, ggml_backend_dev_t dev, ggml_backend_t cpu) {
    ggml_backend_t backend = calloc(1, sizeof(*backend));
    if (backend == NULL) {
        return NULL;
    }
    gpu->cpu = cpu;
    *backend = (struct ggml_backend) { .guid = fake_gpu_guid(), .iface = fake_backend_i, .device = dev, .context = gpu };
    if (gpu->cfg.async) {
        pthread_mutex_init(&gpu->mu, NULL);
        pthread_cond_init(&gpu->cv, NULL);
        if (pthread_create(&gpu->thread, NULL, queue_main, gpu) != 0) {
            free(backend);
            return NULL;
        }
    }
    return backend;
}

/* A new device and its backend, named ``name``, computing through ``cpu`` (which it does not
 * own). The caller frees it with ggml_backend_free. */
ggml_backend_t schedfuzz_fake_gpu_init(const char * name, ggml_backend_t cpu, const struct fake_gpu_config * cfg) {
    struct fake_gpu * gpu = new_gpu(name, cfg);
    ggml_backend_t backend = gpu ? new_backend(gpu, &gpu->device, cpu) : NULL;
    if (backend == NULL) {
        free(gpu);
    }
    return backend;
}

/* ------------------------------------------------------------------ a registry, for llama.cpp */

static const char * reg_get_name(ggml_backend_reg_t reg) {
    GGML_UNUSED(reg);
    return "SchedfuzzGPU";
}

static size_t reg_get_device_count(ggml_backend_reg_t reg) {
    GGML_UNUSED(reg);
    return 1;
}

static ggml_backend_dev_t reg_get_device(ggml_backend_reg_t reg, size_t index) {
    GGML_ASSERT(index == 0);
    return &((struct fake_gpu *) reg->context)->device;
}

/* llama.cpp sets each backend's threads through its registry: the device's own CPU backend then
 * computes with the context's threads, as the CPU backend beside it does (the same kernels with the
 * same work split, so the same results to the bit). */
static void fake_set_n_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_t cpu = gpu_of(backend)->cpu;
    ggml_backend_reg_t cpu_reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(cpu));
    ggml_backend_set_n_threads_t fn = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(cpu_reg, "ggml_backend_set_n_threads");
    if (fn != NULL) {
        fn(cpu, n_threads);
    }
}

static void * reg_get_proc_address(ggml_backend_reg_t reg, const char * name) {
    GGML_UNUSED(reg);
    if (strcmp(name, "ggml_backend_set_n_threads") == 0) {
        return (void *) fake_set_n_threads;
    }
    return NULL;  /* no split buffer type (split mode row places whole tensors), no extra buffer types */
}

static const struct ggml_backend_reg_i fake_reg_i = {
    .get_name         = reg_get_name,
    .get_device_count = reg_get_device_count,
    .get_device       = reg_get_device,
    .get_proc_address = reg_get_proc_address,
};

/* What llama.cpp calls for each context on the device: a backend with a queue and a CPU backend
 * (from ``cpu_dev``) of its own, that allocates from the device's buffer types. */
static ggml_backend_t dev_init_backend(ggml_backend_dev_t dev, const char * params) {
    GGML_UNUSED(params);
    struct fake_gpu * owner = gpu_of_dev(dev);
    if (owner->cpu_dev == NULL) {
        return NULL;  /* a device of the graph engine's: it made its only backend itself */
    }
    struct fake_gpu * gpu = new_gpu(owner->name, &owner->cfg);
    if (gpu) {
        /* llama.cpp builds each ubatch's graph in memory it reuses while the previous one may
         * still run, as a GPU backend allows: it consumes a graph when it is submitted. So these
         * backends compute at submission, in order; the device still reports asynchronous
         * compute (llama.cpp pipelines only then). */
        gpu->cfg.async = 0;
        gpu->cfg.delay_us = 0;
    }
    ggml_backend_t cpu = ggml_backend_dev_init(owner->cpu_dev, NULL);
    ggml_backend_t backend = gpu && cpu ? new_backend(gpu, dev, cpu) : NULL;
    if (backend == NULL) {
        if (cpu) {
            ggml_backend_free(cpu);
        }
        free(gpu);
        return NULL;
    }
    gpu->owns_cpu = 1;
    return backend;
}

/* A device named ``name`` in a backend registry of its own, for the caller to hand to
 * ggml_backend_register; its backends compute through backends of ``cpu_dev``. It lives as long
 * as the process (ggml's registry keeps it). */
ggml_backend_reg_t schedfuzz_fake_gpu_register(const char * name, ggml_backend_dev_t cpu_dev, const struct fake_gpu_config * cfg) {
    struct fake_gpu * gpu = new_gpu(name, cfg);
    if (gpu == NULL) {
        return NULL;
    }
    gpu->cpu_dev = cpu_dev;
    gpu->reg = (struct ggml_backend_reg) { .api_version = GGML_BACKEND_API_VERSION, .iface = fake_reg_i, .context = gpu };
    gpu->device.reg = &gpu->reg;
    return &gpu->reg;
}

/* Let the device allocate ``bytes`` more than it holds now (its free memory, as llama.cpp sees it:
 * a GPU whose memory the weights and other programs mostly fill); SIZE_MAX: all of its memory. */
void schedfuzz_fake_gpu_set_free(ggml_backend_dev_t dev, size_t bytes) {
    struct fake_gpu * gpu = gpu_of_dev(dev);
    gpu->limit = bytes == SIZE_MAX || bytes > gpu->cfg.memory - gpu->allocated ? gpu->cfg.memory : gpu->allocated + bytes;
}

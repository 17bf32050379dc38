/* The graph worker's observation of ggml, in C (``ggml.bindings.Ggml``'s log and snapshot).
 *
 * 1. ggml's log, gathered: ``schedfuzz_log`` is the ``ggml_log_callback``. Each call's text is
 *    appended to one buffer and ended by SEP, so that the parser (``schedlog.SchedLog``) still
 *    sees every GGML_LOG_DEBUG fragment (a split header is one fragment per input) without a
 *    Python callback per fragment: print_assignments logs several per node. Of its node lines
 *    ("node #  i (OP): ..." and one fragment per source), only the first after each split header
 *    is kept: the parser reads where a split starts from it and nothing from the others, which
 *    were nine in ten of the fragments and most of the parser's time.
 * 2. The backend of every node and leaf: read with ggml_backend_sched_get_tensor_backend when
 *    the first "## SPLIT #0:" header starts a line, i.e. inside ggml_backend_sched_split_graph,
 *    once every node has its backend and before ggml_backend_sched_reserve resets the hash table.
 * 3. The names of a graph's nodes and leafs, as ggml holds them (``schedfuzz_names``): through
 *    ctypes, a string read per tensor cost a third of a millisecond per fresh scenario.
 *
 * No ggml header is needed: the one ggml function called is handed in as a pointer, and the
 * log level of errors as a number (both by the worker, from the library it loaded).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEP '\x1e'

typedef void *(*get_tensor_backend_t)(void *sched, void *tensor);

static get_tensor_backend_t get_tensor_backend;
static int error_level = -1;

static char *text;
static size_t len, cap;
static int failed; /* an allocation failed: the parser is told, never a silent loss */
static int line_start = 1; /* the last fragment ended a line */
static int node_lines = 1; /* node lines since the last split header */
static int dropping; /* the line being logged is a node line after a split's first */

static void *sched;
static void **tensors, **backends;
static int n_tensors, n_backends;
static int *out;
static int armed, taken;

void schedfuzz_observe_init(void *get_backend_fn, int error_level_value) {
    get_tensor_backend = (get_tensor_backend_t)get_backend_fn;
    error_level = error_level_value;
}

static void append(const char *s, size_t n) {
    if (len + n + 1 > cap) {
        size_t want = cap ? cap : 1 << 16;
        while (len + n + 1 > want) want *= 2;
        char *grown = realloc(text, want);
        if (!grown) {
            failed = 1;
            return;
        }
        text = grown;
        cap = want;
    }
    memcpy(text + len, s, n);
    len += n;
}

/* each tensor's backend index (-1: none; UNKNOWN: a backend not among those given, which the
 * harness reports as its own error): what the scheduler's hash table holds now */
#define UNKNOWN (-2)
void schedfuzz_observe_snapshot(void) {
    for (int i = 0; i < n_tensors; i++) {
        void *b = get_tensor_backend(sched, tensors[i]);
        out[i] = b ? UNKNOWN : -1;
        for (int k = 0; k < n_backends; k++) {
            if (backends[k] == b) {
                out[i] = k;
                break;
            }
        }
    }
    taken = 1;
}

/* one line of a fragment, or its start or end (``n`` bytes, a newline last if it ends a line) */
static void take_line(const char *s, size_t n) {
    if (line_start) {
        if (armed && !taken && strncmp(s, "## SPLIT #0:", 12) == 0) schedfuzz_observe_snapshot();
        if (strncmp(s, "## SPLIT #", 10) == 0) node_lines = 0;
        else if (strncmp(s, "node #", 6) == 0) dropping = node_lines++ > 0;
    }
    if (!dropping) append(s, n);
    line_start = s[n - 1] == '\n';
    if (line_start) dropping = 0;
}

void schedfuzz_log(int level, const char *s, void *user_data) {
    (void)user_data;
    if (!s) return;
    size_t n = strlen(s);
    if (level == error_level) {
        /* ggml's errors also go to stderr: a crash's report then carries them */
        ssize_t w = write(2, s, n);
        (void)w;
    }
    size_t before = len;
    /* a line at a time: the header is logged as "\n## SPLIT #0: ...", after the newline that ends the line before */
    while (n) {
        const char *nl = memchr(s, '\n', n);
        size_t k = nl ? (size_t)(nl - s) + 1 : n;
        take_line(s, k);
        s += k;
        n -= k;
    }
    if (len > before) append((const char[]){SEP}, 1);
}

/* take the snapshot at the next split printout, into out[0 .. n) */
void schedfuzz_observe_arm(void *sched_, void **tensors_, int n_tensors_, void **backends_, int n_backends_, int *out_) {
    sched = sched_;
    tensors = tensors_;
    n_tensors = n_tensors_;
    backends = backends_;
    n_backends = n_backends_;
    out = out_;
    armed = 1;
    taken = 0;
}

/* whether the snapshot was taken since arming; disarms */
int schedfuzz_observe_disarm(void) {
    armed = 0;
    return taken;
}

/* the log gathered since the last call (``*n`` bytes, not NUL-terminated), freed by the
 * next call; ``*lost`` is set when some of it could not be kept */
const char *schedfuzz_log_take(size_t *n, int *lost) {
    static char *given;
    free(given);
    given = NULL;
    *n = len;
    *lost = failed;
    failed = 0;
    if (!text) return "";
    given = text;
    text = NULL;
    len = cap = 0;
    return given;
}

/* the names of the ``n`` tensors at ``tensors`` (``name_offset``: where ``ggml_tensor`` keeps its
 * NUL-ended name, of ``name_size`` bytes), one after the other, each ended by a NUL, into ``out``
 * (``n * name_size`` bytes at most); the bytes written */
size_t schedfuzz_names(void *const *tensors, int n, size_t name_offset, size_t name_size, char *out) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const char *name = (const char *)tensors[i] + name_offset;
        size_t k = strnlen(name, name_size - 1);
        memcpy(out + at, name, k);
        at += k;
        out[at++] = '\0';
    }
    return at;
}

// One ggml RPC server serving the CPU device: `schedfuzz-rpc-server HOST:PORT [THREADS]`, started
// by `rpc.RpcServers` (and, as `repro-rpc-server`, by an exported reproducer: `cases/export.py`).
// What ggml's own `rpc-server` example does, without its options: it calls
// ggml_backend_rpc_start_server(HOST:PORT, NULL, THREADS, 1, &cpu_device), which blocks, serving
// one client connection at a time.
//
// A program, not a Python process: a crash's confirmation wants fresh servers, and a Python one
// spent about 80 ms importing ggml-python before it listened. It is linked against the ggml it
// serves (built per library folder: `build.build_rpc_server`) and includes no ggml header: the
// two functions it calls have had these signatures in every ggml with `ggml_backend_dev_by_type`
// (ggml-python's bindings, which the workers use, assume the same).
//
// Built by the harness (SCHEDFUZZ_TEST_HOOKS, linked -rdynamic), it has a test-only hook:
// SCHEDFUZZ_RPC_CRASH_AT_COMPUTE=N makes it log each graph it computes ("schedfuzz-rpc-server:
// graph compute K") and raise SIGSEGV on the N-th (N = 0: log only). The executable's own
// ggml_backend_graph_compute and ggml_backend_graph_compute_async interpose libggml-base's (the
// RPC server calls the one, b11739's the other, and the one calls the other: counted once).
// Without the variable they only pass the graph on. An exported reproducer builds without them.
//
// It also says which command a server refused: ggml's server reads each command's byte, runs it,
// and where the command fails it returns and closes the client's connection, often without a word
// (the client aborts: "Remote RPC server crashed or returned malformed response"). The executable's
// recv and close interpose libc's for libggml-rpc: a one-byte recv is a command's byte; a client
// socket closed by the server that had not read the client's end of file (recv returning 0) was
// closed after its last command: "schedfuzz-rpc-server: closed the connection after command N"
// (rpc.RpcServers.refusals names N from the build's own enum rpc_cmd).
#ifdef SCHEDFUZZ_TEST_HOOKS
#include <dlfcn.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#endif
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

typedef void * ggml_backend_dev_t;
enum { GGML_BACKEND_DEVICE_TYPE_CPU = 0 };  // the first of enum ggml_backend_dev_type

ggml_backend_dev_t ggml_backend_dev_by_type(int type);
void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir, size_t n_threads, size_t n_devices,
                                   ggml_backend_dev_t * devices);

#ifdef SCHEDFUZZ_TEST_HOOKS
typedef int (*compute_fn)(void * backend, void * cgraph);  // enum ggml_status f(ggml_backend_t, struct ggml_cgraph *)

static long crash_at = -1;  // SCHEDFUZZ_RPC_CRASH_AT_COMPUTE, -1 when unset
static long n_computes = 0;
static __thread int inside = 0;  // within a wrapper: the library's own nested call is not another graph

static int counted(int which, void * backend, void * cgraph) {
    static const char * const names[2] = {"ggml_backend_graph_compute", "ggml_backend_graph_compute_async"};
    static compute_fn real[2];
    if (real[which] == NULL) {
        real[which] = (compute_fn) dlsym(RTLD_NEXT, names[which]);
    }
    if (crash_at >= 0 && !inside) {
        n_computes++;
        fprintf(stderr, "schedfuzz-rpc-server: graph compute %ld\n", n_computes);
        if (n_computes == crash_at) {
            raise(SIGSEGV);
        }
    }
    inside++;
    int status = real[which](backend, cgraph);
    inside--;
    return status;
}

int ggml_backend_graph_compute(void * backend, void * cgraph) {
    return counted(0, backend, cgraph);
}

int ggml_backend_graph_compute_async(void * backend, void * cgraph) {
    return counted(1, backend, cgraph);
}

enum { MAX_FDS = 1024 };
static int last_cmd[MAX_FDS];  // per client socket: 1 + the last command byte read, 0 none; -1 its client closed

ssize_t recv(int fd, void * buf, size_t len, int flags) {
    static ssize_t (*real)(int, void *, size_t, int);
    if (real == NULL) {
        real = (ssize_t (*)(int, void *, size_t, int)) dlsym(RTLD_NEXT, "recv");
    }
    ssize_t n = real(fd, buf, len, flags);
    if (fd >= 0 && fd < MAX_FDS) {
        if (n <= 0) {
            last_cmd[fd] = -1;  // the client closed (or reset) its end: whatever follows is not a refusal
        } else if (len == 1 && last_cmd[fd] >= 0) {
            last_cmd[fd] = 1 + *(uint8_t *) buf;
        }
    }
    return n;
}

int close(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int)) dlsym(RTLD_NEXT, "close");
    }
    if (fd >= 0 && fd < MAX_FDS) {
        if (last_cmd[fd] > 0) {
            fprintf(stderr, "schedfuzz-rpc-server: closed the connection after command %d\n", last_cmd[fd] - 1);
        }
        last_cmd[fd] = 0;
    }
    return real(fd);
}
#endif

int main(int argc, char ** argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s HOST:PORT [THREADS]\n", argv[0]);
        return 2;
    }
    // die with the process that started it (process/children.py: die_with_parent): the harness passes its pid, so
    // that a parent already gone is seen too
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    const char * parent = getenv("SCHEDFUZZ_PARENT_PID");
    if (parent != NULL && getppid() != (pid_t) atol(parent)) {
        return 1;
    }
#ifdef SCHEDFUZZ_TEST_HOOKS
    const char * crash = getenv("SCHEDFUZZ_RPC_CRASH_AT_COMPUTE");
    crash_at = crash != NULL ? atol(crash) : -1;
#endif
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == NULL) {
        fprintf(stderr, "ggml has no CPU device\n");
        return 2;
    }
    ggml_backend_rpc_start_server(argv[1], NULL, argc == 3 ? (size_t) atol(argv[2]) : 1, 1, &cpu);
    fprintf(stderr, "ggml_backend_rpc_start_server(%s) returned: see the messages above\n", argv[1]);
    return 2;
}

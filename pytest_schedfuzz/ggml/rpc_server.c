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
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == NULL) {
        fprintf(stderr, "ggml has no CPU device\n");
        return 2;
    }
    ggml_backend_rpc_start_server(argv[1], NULL, argc == 3 ? (size_t) atol(argv[2]) : 1, 1, &cpu);
    fprintf(stderr, "ggml_backend_rpc_start_server(%s) returned: see the messages above\n", argv[1]);
    return 2;
}

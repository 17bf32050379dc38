/* The C stack of a crash: preloaded (LD_PRELOAD) into every engine worker (ggml and llama.cpp).
 *
 * A SIGSEGV, SIGBUS, SIGFPE or SIGILL carries no assert text, so every such crash would look
 * alike. On one of them this prints, to stderr, one line per frame of the C stack:
 *
 *     schedfuzz-frame <object path> <offset in it, hex>
 *
 * between "schedfuzz-crash <signal>" and "schedfuzz-crash-end", then dies of the same signal.
 * The parent turns offsets into function names with addr2line (``crash.c_stack``), so static
 * functions of a Debug build are named too, and signs the crash by its top ggml/llama frames.
 * dladdr and backtrace are not async-signal-safe in general; in a dying process that is the
 * accepted trade (glibc's own backtrace_symbols_fd makes the same one). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void put(const char * s) {
    ssize_t n = write(2, s, strlen(s));
    (void) n;
}

/* the instruction that faulted (NULL where this architecture's context is not read) */
static void * faulting_pc(void * context) {
    ucontext_t * uc = (ucontext_t *) context;
#if defined(__x86_64__)
    return (void *) uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (void *) uc->uc_mcontext.pc;
#else
    (void) uc;
    return NULL;
#endif
}

static void on_fatal(int sig, siginfo_t * si, void * context) {
    (void) si;
    void * frames[64];
    int n = backtrace(frames, 64);
    void * pc = faulting_pc(context);
    char line[4200];
    snprintf(line, sizeof(line), "\nschedfuzz-crash %d\n", sig);
    put(line);
    for (int i = 0; i < n; i++) {
        Dl_info info;
        if (dladdr(frames[i], &info) && info.dli_fname != NULL) {
            /* a return address points after the call: step back into it. Not the faulting
             * instruction itself: in an optimized build it can be a function's first byte,
             * and one byte back is the function before it */
            int back = i > 0 && frames[i] != pc;
            unsigned long off = (unsigned long) ((char *) frames[i] - (char *) info.dli_fbase) - back;
            snprintf(line, sizeof(line), "schedfuzz-frame %s %lx\n", info.dli_fname, off);
            put(line);
        }
    }
    put("schedfuzz-crash-end\n");
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    static char stack[1 << 16];
    stack_t ss = { .ss_sp = stack, .ss_size = sizeof(stack), .ss_flags = 0 };
    sigaltstack(&ss, NULL); /* a stack overflow must still be reported */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_ONSTACK | SA_RESETHAND | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL };
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        sigaction(sigs[i], &sa, NULL);
    }
}

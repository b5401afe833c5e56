/* trace_replay.c — a CUDA program that replays a recorded workload: for each launch of a
 * timeline file, spin for the host time the workload spent before the launch, then launch
 * one "replay" kernel of the recorded device duration (the fake driver runs it for that
 * long), and synchronize at the end of each pass. With STREAMS > 1 the launches go
 * round-robin into that many streams (as a training step's side streams would take some of
 * its work). Prints one line: "replay rc=N launches=L passes=P wall_ns=W" with W the time of
 * the timed passes.
 * Usage: trace-replay TIMELINE PASSES [WARMUP_PASSES [STREAMS]]; TIMELINE is "gap_ns dur_ns"
 * per line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_abi.h"

#define MAX_STREAMS 8

CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream stream, void **params, void **extra);

typedef struct step {
    uint64_t gap_ns, dur_ns;
} step;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void spin_ns(uint64_t ns) {
    uint64_t until = now_ns() + ns;
    while (now_ns() < until) {
    }
}

static step *load(const char *path, size_t *n) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return NULL;
    size_t cap = 1024;
    step *steps = malloc(cap * sizeof *steps);
    unsigned long long gap, dur;
    *n = 0;
    while (steps != NULL && fscanf(f, "%llu %llu", &gap, &dur) == 2) {
        if (*n == cap) {
            step *more = realloc(steps, (cap *= 2) * sizeof *steps);
            if (more == NULL) free(steps);
            steps = more;
            if (steps == NULL) break;
        }
        steps[(*n)++] = (step){gap, dur};
    }
    fclose(f);
    return steps;
}

static CUresult pass(const step *steps, size_t n, CUfunction f, const CUstream *streams,
                     long count) {
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        spin_ns(steps[i].gap_ns);
        uint64_t dur = steps[i].dur_ns;
        void *params[] = {&dur};
        rc = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, streams[i % (size_t)count], params, NULL);
    }
    for (long i = 0; i < count && rc == CUDA_SUCCESS; i++) rc = cuStreamSynchronize(streams[i]);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: trace-replay TIMELINE PASSES [WARMUP_PASSES]\n");
        return 2;
    }
    size_t n = 0;
    step *steps = load(argv[1], &n);
    if (steps == NULL || n == 0) {
        fprintf(stderr, "trace-replay: cannot read a timeline from %s\n", argv[1]);
        free(steps);
        return 2;
    }
    long passes = atol(argv[2]), warmup = argc > 3 ? atol(argv[3]) : 1;
    long count = argc > 4 ? atol(argv[4]) : 1;
    if (count < 1 || count > MAX_STREAMS) {
        fprintf(stderr, "trace-replay: STREAMS is 1 to %d, not %s\n", MAX_STREAMS, argv[4]);
        free(steps);
        return 2;
    }
    CUcontext ctx = NULL;
    CUmodule module = NULL;
    CUfunction f = NULL;
    CUstream streams[MAX_STREAMS] = {NULL};
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS) rc = cuModuleLoadData(&module, "replay image");
    if (rc == CUDA_SUCCESS) rc = cuModuleGetFunction(&f, module, "replay");
    for (long i = 0; i < count && rc == CUDA_SUCCESS; i++) rc = cuStreamCreate(&streams[i], 0);
    for (long i = 0; i < warmup && rc == CUDA_SUCCESS; i++) rc = pass(steps, n, f, streams, count);
    uint64_t t0 = now_ns();
    for (long i = 0; i < passes && rc == CUDA_SUCCESS; i++) rc = pass(steps, n, f, streams, count);
    uint64_t wall = now_ns() - t0;
    printf("replay rc=%d launches=%zu passes=%ld wall_ns=%llu\n", rc, n, passes,
           (unsigned long long)wall);
    free(steps);
    return rc == CUDA_SUCCESS ? 0 : 1;
}

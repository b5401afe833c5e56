/* probe.c — the commands of the probe (see probe.h). Times are CLOCK_MONOTONIC ns, the
 * clock of the driver's events, so tests can order what several processes saw. */
#include "probe.h"
#include "gpu_uuid.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ALLOCS 256
#define MAX_EXTRA 24 /* streams beside the probe's own (spread, second) */

typedef struct allocation {
    char kind[32];
    CUdeviceptr ptr;
    CUmemGenericAllocationHandle handle;
    CUarray array;
    int live;
} allocation;

typedef struct probe {
    const probe_driver *d;
    CUcontext ctx;
    CUstream stream;
    CUstream extra[MAX_EXTRA]; /* made on first use; extra[i] is stream number i + 1 */
    int n_extra;
    CUmodule module;
    CUgraphExec graph;
    allocation allocs[MAX_ALLOCS];
    int n_allocs;
} probe;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void host_fn(void *arg) { (void)arg; }

/* init [DEV]: the driver, device DEV's primary context (0 unless given), a module, a stream and
 * an empty executable graph. */
static void cmd_init(probe *p, int dev) {
    const probe_driver *d = p->d;
    uint64_t t0 = now_ns();
    CUresult rc = d->cuInit(0);
    uint64_t t1 = now_ns();
    CUcontext ctx = NULL;
    CUgraph graph = NULL;
    if (rc == CUDA_SUCCESS) rc = d->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS) rc = d->cuCtxSetCurrent(ctx);
    p->ctx = ctx;
    if (rc == CUDA_SUCCESS) rc = d->cuModuleLoadData(&p->module, "fake image");
    if (rc == CUDA_SUCCESS) rc = d->cuStreamCreate(&p->stream, 0);
    if (rc == CUDA_SUCCESS) rc = d->cuGraphCreate(&graph, 0);
    if (rc == CUDA_SUCCESS) rc = d->cuGraphInstantiateWithFlags(&p->graph, graph, 0);
    printf("init rc=%d style=%s init_ns=%llu\n", rc, d->style, (unsigned long long)(t1 - t0));
}

static CUresult alloc_kind(probe *p, allocation *a, const char *kind, size_t bytes) {
    const probe_driver *d = p->d;
    snprintf(a->kind, sizeof a->kind, "%s", kind);
    size_t pitch = 0;
    if (strcmp(kind, "plain") == 0) return d->cuMemAlloc_v2(&a->ptr, bytes);
    if (strcmp(kind, "pitch") == 0) return d->cuMemAllocPitch_v2(&a->ptr, &pitch, bytes, 1, 4);
    if (strcmp(kind, "managed") == 0) return d->cuMemAllocManaged(&a->ptr, bytes, 1);
    if (strcmp(kind, "async") == 0) return d->cuMemAllocAsync(&a->ptr, bytes, p->stream);
    if (strcmp(kind, "pool") == 0) {
        CUmemoryPool pool = NULL;
        CUresult rc = d->cuDeviceGetDefaultMemPool(&pool, 0);
        return rc != CUDA_SUCCESS ? rc : d->cuMemAllocFromPoolAsync(&a->ptr, bytes, pool, p->stream);
    }
    if (strcmp(kind, "vmm") == 0) return d->cuMemCreate(&a->handle, bytes, NULL, 0);
    if (strcmp(kind, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR desc = {bytes / 4, 1, CU_AD_FORMAT_FLOAT, 1};
        return d->cuArrayCreate_v2(&a->array, &desc);
    }
    if (strcmp(kind, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {bytes / 4, 1, 1, CU_AD_FORMAT_FLOAT, 1, 0};
        return d->cuArray3DCreate_v2(&a->array, &desc);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static void cmd_alloc(probe *p, const char *kind, size_t bytes) {
    if (p->n_allocs == MAX_ALLOCS) {
        printf("alloc rc=%d\n", CUDA_ERROR_INVALID_VALUE);
        return;
    }
    allocation *a = &p->allocs[p->n_allocs];
    memset(a, 0, sizeof *a);
    CUresult rc = alloc_kind(p, a, kind, bytes);
    a->live = rc == CUDA_SUCCESS;
    printf("alloc rc=%d id=%d\n", rc, a->live ? p->n_allocs++ : -1);
}

static CUresult free_kind(probe *p, const allocation *a) {
    const probe_driver *d = p->d;
    if (strcmp(a->kind, "vmm") == 0) return d->cuMemRelease(a->handle);
    if (strncmp(a->kind, "array", 5) == 0) return d->cuArrayDestroy(a->array);
    if (strcmp(a->kind, "async") == 0 || strcmp(a->kind, "pool") == 0)
        return d->cuMemFreeAsync(a->ptr, p->stream);
    return d->cuMemFree_v2(a->ptr);
}

static void cmd_free(probe *p, int id) {
    if (id < 0 || id >= p->n_allocs || !p->allocs[id].live) {
        printf("free rc=%d\n", CUDA_ERROR_INVALID_VALUE);
        return;
    }
    allocation *a = &p->allocs[id];
    CUresult rc = free_kind(p, a);
    a->live = rc != CUDA_SUCCESS;
    printf("free rc=%d\n", rc);
}

/* `allocbench COUNT KIND`: COUNT allocations of 1 MiB of KIND, each freed at once (a tenth
 * more first, unmeasured); the mean time of one allocation and its free. */
static void cmd_allocbench(probe *p, unsigned long count, const char *kind) {
    allocation a = {0};
    CUresult rc = CUDA_SUCCESS;
    uint64_t t0 = 0;
    for (unsigned long i = 0; i < count + count / 10 && rc == CUDA_SUCCESS; i++) {
        if (i == count / 10) t0 = now_ns();
        rc = alloc_kind(p, &a, kind, 1u << 20);
        if (rc == CUDA_SUCCESS) rc = free_kind(p, &a);
    }
    uint64_t t1 = now_ns();
    printf("allocbench rc=%d kind=%s pairs=%lu ns_per_pair=%.2f\n", rc, kind, count,
           count ? (double)(t1 - t0) / (double)count : 0.0);
}

/* device DEV: device DEV's primary context made current, with a new stream of its own as the
 * probe's stream (the module and graph stay). */
static void cmd_device(probe *p, int dev) {
    CUcontext ctx = NULL;
    CUresult rc = p->d->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS) rc = p->d->cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS) rc = p->d->cuStreamCreate(&p->stream, 0);
    if (rc == CUDA_SUCCESS) p->ctx = ctx;
    printf("device rc=%d dev=%d\n", rc, dev);
}

/* meminfo [DEV]: cuMemGetInfo (the current context's device) and cuDeviceTotalMem of DEV. */
static void cmd_meminfo(probe *p, int dev) {
    size_t free_b = 0, total = 0, dev_total = 0;
    CUresult rc = p->d->cuMemGetInfo_v2(&free_b, &total);
    CUresult rc2 = p->d->cuDeviceTotalMem_v2(&dev_total, dev);
    printf("meminfo rc=%d free=%zu total=%zu device_rc=%d device_total=%zu\n", rc, free_b, total,
           rc2, dev_total);
}

/* cards: the devices the driver enumerates (cuInit, then each ordinal's UUID, in order) and
 * the CUDA_VISIBLE_DEVICES the process has by then ("-" when unset). */
static void cmd_cards(probe *p) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    int count = 0;
    CUresult rc = p->d->cuInit(0);
    if (rc == CUDA_SUCCESS) rc = p->d->cuDeviceGetCount(&count);
    printf("cards rc=%d count=%d visible=%s uuids=", rc, rc == CUDA_SUCCESS ? count : 0,
           visible == NULL ? "-" : *visible == '\0' ? "(empty)" : visible);
    for (int dev = 0; rc == CUDA_SUCCESS && dev < count; dev++) {
        CUuuid uuid;
        char text[QSC_UUID_TEXT_LEN] = "unreadable";
        if (p->d->cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS) qsc_uuid_format(uuid.bytes, text);
        printf("%s%s", dev ? "," : "", text);
    }
    printf("\n");
}

/* nvml [DEV]: NVML's memory information of device DEV (0 unless given). */
static void cmd_nvml(probe *p, unsigned dev) {
    const probe_driver *d = p->d;
    nvmlDevice_t handle = NULL;
    nvmlMemory_t m1 = {0};
    nvmlMemory_v2_t m2 = {.version = (unsigned)sizeof(nvmlMemory_v2_t) | (2u << 24)};
    nvmlReturn_t rc = d->nvmlInit_v2();
    if (rc == NVML_SUCCESS) rc = d->nvmlDeviceGetHandleByIndex_v2(dev, &handle);
    if (rc == NVML_SUCCESS) rc = d->nvmlDeviceGetMemoryInfo(handle, &m1);
    if (rc == NVML_SUCCESS) rc = d->nvmlDeviceGetMemoryInfo_v2(handle, &m2);
    printf("nvml rc=%d total=%llu used=%llu free=%llu v2_total=%llu v2_used=%llu v2_free=%llu\n",
           rc, m1.total, m1.used, m1.free, m2.total, m2.used, m2.free);
}

/* Stream number `i`: 0 the probe's own, then extra ones, made on first use (NULL past
 * MAX_EXTRA or when the driver refuses). */
static CUstream stream_n(probe *p, unsigned long i) {
    if (i == 0) return p->stream;
    if (i > MAX_EXTRA) return NULL;
    while (p->n_extra < (int)i)
        if (p->d->cuStreamCreate(&p->extra[p->n_extra++], 0) != CUDA_SUCCESS) return NULL;
    return p->extra[i - 1];
}

static CUresult launch_one(probe *p, const char *kind, CUfunction f) {
    const probe_driver *d = p->d;
    if (strcmp(kind, "second") == 0) /* a second created stream */
        return d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream_n(p, 1), NULL, NULL);
    if (strcmp(kind, "kernel") == 0)
        return d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, p->stream, NULL, NULL);
    if (strcmp(kind, "coop") == 0)
        return d->cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, p->stream, NULL);
    if (strcmp(kind, "ex") == 0) {
        CUlaunchConfig config = {1, 1, 1, 1, 1, 1, 0, p->stream, NULL, 0};
        return d->cuLaunchKernelEx(&config, f, NULL, NULL);
    }
    if (strcmp(kind, "graph") == 0) return d->cuGraphLaunch(p->graph, p->stream);
    if (strcmp(kind, "host") == 0) return d->cuLaunchHostFunc(p->stream, host_fn, NULL);
    if (strcmp(kind, "default") == 0) /* the default stream, not the probe's own */
        return d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (strcmp(kind, "legacy") == 0) /* the same stream by its other name */
        return d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_LEGACY, NULL, NULL);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUfunction kernel_of_name(probe *p, const char *name) {
    CUfunction f = NULL;
    return p->d->cuModuleGetFunction(&f, p->module, name) == CUDA_SUCCESS ? f : NULL;
}

static CUfunction kernel_of(probe *p, unsigned long us) {
    char name[64];
    snprintf(name, sizeof name, "sleep_us_%lu", us);
    return kernel_of_name(p, name);
}

static void cmd_launch(probe *p, const char *kind, unsigned long us, unsigned long count) {
    CUfunction f = kernel_of(p, us);
    CUresult rc = CUDA_SUCCESS;
    uint64_t first = now_ns();
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++) rc = launch_one(p, kind, f);
    printf("launch rc=%d start=%llu t=%llu\n", rc, (unsigned long long)first,
           (unsigned long long)now_ns());
}

/* `count` kernels of `us` µs, round-robin over `streams` streams (the probe's own first). */
static void cmd_spread(probe *p, unsigned long us, unsigned long count, unsigned long streams) {
    const probe_driver *d = p->d;
    CUfunction f = kernel_of(p, us);
    CUresult rc = streams == 0 || streams > MAX_EXTRA + 1 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    uint64_t first = now_ns();
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        CUstream stream = stream_n(p, i % streams);
        rc = stream == NULL ? CUDA_ERROR_INVALID_HANDLE
                            : d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
    }
    printf("spread rc=%d start=%llu t=%llu\n", rc, (unsigned long long)first,
           (unsigned long long)now_ns());
}

/* `count` kernels of `us` µs, alternating between stream numbers `a` and `b` (as stream_n
 * numbers them). */
static void cmd_alternate(probe *p, const char *line) {
    unsigned long us = 0, count = 0, a = 0, b = 0;
    CUresult rc = sscanf(line, "%*s %lu %lu %lu %lu", &us, &count, &a, &b) == 4
                      ? CUDA_SUCCESS
                      : CUDA_ERROR_INVALID_VALUE;
    CUfunction f = kernel_of(p, us);
    uint64_t first = now_ns();
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        CUstream stream = stream_n(p, i % 2 ? b : a);
        rc = stream == NULL ? CUDA_ERROR_INVALID_HANDLE
                            : p->d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
    }
    printf("alternate rc=%d start=%llu t=%llu\n", rc, (unsigned long long)first,
           (unsigned long long)now_ns());
}

/* `cycles` rounds of `na` kernels of `us_a` µs into the probe's stream, then `nb` of `us_b`
 * µs into a second stream: a process whose streams run kernels of very different lengths. */
static void cmd_phases(probe *p, const char *line) {
    unsigned long us_a = 0, na = 0, us_b = 0, nb = 0, cycles = 0;
    CUresult rc = sscanf(line, "%*s %lu %lu %lu %lu %lu", &us_a, &na, &us_b, &nb, &cycles) == 5
                      ? CUDA_SUCCESS
                      : CUDA_ERROR_INVALID_VALUE;
    CUfunction fa = kernel_of(p, us_a), fb = kernel_of(p, us_b);
    uint64_t first = now_ns();
    for (unsigned long c = 0; c < cycles && rc == CUDA_SUCCESS; c++) {
        for (unsigned long i = 0; i < na && rc == CUDA_SUCCESS; i++)
            rc = launch_one(p, "kernel", fa);
        for (unsigned long i = 0; i < nb && rc == CUDA_SUCCESS; i++)
            rc = launch_one(p, "second", fb);
    }
    printf("phases rc=%d start=%llu t=%llu\n", rc, (unsigned long long)first,
           (unsigned long long)now_ns());
}

/* Wait for the probe's stream and every extra one. */
static void cmd_sync(probe *p) {
    CUresult rc = p->d->cuStreamSynchronize(p->stream);
    for (int i = 0; i < p->n_extra && rc == CUDA_SUCCESS; i++)
        rc = p->d->cuStreamSynchronize(p->extra[i]);
    printf("sync rc=%d t=%llu\n", rc, (unsigned long long)now_ns());
}

static void cmd_bench(probe *p, unsigned long count) {
    CUfunction f = kernel_of(p, 0);
    CUresult rc = CUDA_SUCCESS;
    for (unsigned long i = 0; i < count / 10 && rc == CUDA_SUCCESS; i++)
        rc = launch_one(p, "kernel", f);
    uint64_t t0 = now_ns();
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++) rc = launch_one(p, "kernel", f);
    uint64_t t1 = now_ns();
    printf("bench rc=%d launches=%lu ns_per_launch=%.2f\n", rc, count,
           count ? (double)(t1 - t0) / (double)count : 0.0);
}

typedef struct spinner {
    probe *p;
    CUfunction f;
    char kind[32]; /* what launch_one launches: "kernel" (the probe's stream), "default", ... */
    pthread_mutex_t lock;
    pthread_cond_t started;
    CUresult first; /* the first launch's result, once it returned */
    int launched;
} spinner;

/* Launch into the probe's stream until the process ends, whatever the launches return. */
static void *spin_main(void *arg) {
    spinner *sp = arg;
    sp->p->d->cuCtxSetCurrent(sp->p->ctx);
    CUresult first = launch_one(sp->p, sp->kind, sp->f);
    pthread_mutex_lock(&sp->lock);
    sp->first = first;
    sp->launched = 1;
    pthread_cond_signal(&sp->started);
    pthread_mutex_unlock(&sp->lock);
    for (;;) launch_one(sp->p, sp->kind, sp->f);
    return NULL;
}

/* A thread that keeps launching `us` µs kernels of `kind` (as `launch` names them; "kernel" if
 * none), answered once its first launch returned: the process exits while it launches. */
static void cmd_spin(probe *p, unsigned long us, const char *kind) {
    static spinner sp = {.lock = PTHREAD_MUTEX_INITIALIZER, .started = PTHREAD_COND_INITIALIZER};
    sp.p = p;
    snprintf(sp.kind, sizeof sp.kind, "%s", *kind ? kind : "kernel");
    sp.f = kernel_of(p, us);
    pthread_t thread;
    int rc = pthread_create(&thread, NULL, spin_main, &sp);
    if (rc == 0) {
        pthread_detach(thread);
        pthread_mutex_lock(&sp.lock);
        while (!sp.launched) pthread_cond_wait(&sp.started, &sp.lock);
        rc = sp.first;
        pthread_mutex_unlock(&sp.lock);
    }
    printf("spin rc=%d\n", rc);
}

static void *hold_main(void *arg) {
    probe *p = arg;
    p->d->cuCtxSetCurrent(p->ctx);
    launch_one(p, "kernel", kernel_of_name(p, "hold_launch"));
    return NULL;
}

/* A thread whose launch the (fake) driver holds for good: answered once it is held, so the
 * process then exits while another thread is inside a launch. */
static void cmd_hold(probe *p) {
    typedef void (*wait_held_fn)(int);
    wait_held_fn wait_held = (wait_held_fn)dlsym(RTLD_DEFAULT, "qshare_fake_wait_held");
    pthread_t thread;
    int rc = wait_held == NULL ? -1 : pthread_create(&thread, NULL, hold_main, p);
    if (rc == 0) {
        pthread_detach(thread);
        wait_held(1);
    }
    printf("hold rc=%d\n", rc);
}

/* A count the fake driver keeps, by its hook's name (-1 against a driver without it). */
static long fake_count(const char *hook) {
    typedef unsigned long (*count_fn)(void);
    count_fn count = (count_fn)dlsym(RTLD_DEFAULT, hook);
    return count == NULL ? -1L : (long)count();
}

/* The most kernel time the fake driver had queued at once since the last `queued`. */
static void cmd_queued(void) {
    printf("queued max_ns=%ld\n", fake_count("qshare_fake_queued_max_take"));
}

/* How many events the fake driver has recorded. */
static void cmd_records(void) { printf("records n=%ld\n", fake_count("qshare_fake_event_records")); }

/* How many times this thread (the one that ran the launches) asked the fake driver whether a
 * stream is capturing. */
static void cmd_captures(void) {
    printf("captures n=%ld\n", fake_count("qshare_fake_capture_queries"));
}

/* A driver entry point outside the probe's table, found as a program's dlsym would. */
static void *entry(const char *name) { return dlsym(RTLD_DEFAULT, name); }

/* How many events exist in the fake driver, and how many were ever created. */
static void cmd_captured(void) {
    printf("captured n=%ld\n", fake_count("qshare_fake_captured_records"));
}

static void cmd_events(void) {
    printf("events n=%ld created=%ld\n", fake_count("qshare_fake_live_events"),
           fake_count("qshare_fake_events_created"));
}

/* A second context of the program's own: made current, `count` kernels of `us` µs launched
 * into a stream of it and waited for, then the context destroyed and the probe's made current
 * again. */
static void cmd_ctx2(probe *p, unsigned long us, unsigned long count) {
    typedef CUresult (*create_fn)(CUcontext *, unsigned int, CUdevice);
    typedef CUresult (*destroy_fn)(CUcontext);
    create_fn create = (create_fn)entry("cuCtxCreate_v2");
    destroy_fn destroy = (destroy_fn)entry("cuCtxDestroy_v2");
    const probe_driver *d = p->d;
    CUcontext ctx = NULL;
    CUstream stream = NULL;
    CUfunction f = kernel_of(p, us);
    CUresult rc = create == NULL || destroy == NULL ? CUDA_ERROR_NOT_FOUND : create(&ctx, 0, 0);
    if (rc == CUDA_SUCCESS) rc = d->cuStreamCreate(&stream, 0);
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++)
        rc = d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
    if (rc == CUDA_SUCCESS) rc = d->cuStreamSynchronize(stream);
    if (rc == CUDA_SUCCESS) rc = destroy(ctx);
    if (rc == CUDA_SUCCESS) rc = d->cuCtxSetCurrent(p->ctx);
    printf("ctx2 rc=%d\n", rc);
}

typedef struct racer {
    probe *p;
    CUfunction f;
    unsigned long count;
    CUresult rc;
} racer;

static void *race_main(void *arg) {
    racer *r = arg;
    r->rc = r->p->d->cuCtxSetCurrent(r->p->ctx);
    for (unsigned long i = 0; i < r->count && r->rc == CUDA_SUCCESS; i++)
        r->rc = launch_one(r->p, "kernel", r->f);
    return NULL;
}

/* A second context of the program's own gets `count` kernels of `us` µs queued into a stream
 * of it; then a thread launches as many into the probe's stream while this one destroys the
 * second context. Answers the most kernel time the device had queued at once (the fake's
 * count), and the first failure. */
/* A second context of the program's own, made current, and a stream of it. */
static CUresult second_context(probe *p, CUcontext *ctx, CUstream *stream) {
    typedef CUresult (*create_fn)(CUcontext *, unsigned int, CUdevice);
    create_fn create = (create_fn)entry("cuCtxCreate_v2");
    CUresult rc = create == NULL ? CUDA_ERROR_NOT_FOUND : create(ctx, 0, 0);
    return rc == CUDA_SUCCESS ? p->d->cuStreamCreate(stream, 0) : rc;
}

static void cmd_ctxrace(probe *p, unsigned long us, unsigned long count) {
    typedef CUresult (*destroy_fn)(CUcontext);
    destroy_fn destroy = (destroy_fn)entry("cuCtxDestroy_v2");
    racer r = {p, kernel_of(p, us), count, CUDA_SUCCESS};
    CUcontext ctx = NULL;
    CUstream stream = NULL;
    CUresult rc = destroy == NULL ? CUDA_ERROR_NOT_FOUND : second_context(p, &ctx, &stream);
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++)
        rc = p->d->cuLaunchKernel(r.f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
    pthread_t thread;
    int started = rc == CUDA_SUCCESS && pthread_create(&thread, NULL, race_main, &r) == 0;
    if (rc == CUDA_SUCCESS) rc = started ? destroy(ctx) : CUDA_ERROR_OUT_OF_MEMORY;
    if (started) pthread_join(thread, NULL);
    if (rc == CUDA_SUCCESS) rc = r.rc;
    if (rc == CUDA_SUCCESS) rc = p->d->cuCtxSetCurrent(p->ctx);
    if (rc == CUDA_SUCCESS) rc = p->d->cuStreamSynchronize(p->stream);
    printf("ctxrace rc=%d queued_max_ns=%ld\n", rc, fake_count("qshare_fake_queued_max_ns"));
}

/* `count` kernels of `us` µs launched into a stream of a second context while the probe's
 * context is current, then waited for (the second context is left alive). Answers how many
 * event records the fake refused for naming a stream of another context than the event's. */
static void cmd_otherctx(probe *p, unsigned long us, unsigned long count) {
    CUfunction f = kernel_of(p, us);
    CUcontext ctx = NULL;
    CUstream stream = NULL;
    CUresult rc = second_context(p, &ctx, &stream);
    if (rc == CUDA_SUCCESS) rc = p->d->cuCtxSetCurrent(p->ctx);
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++)
        rc = p->d->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
    if (rc == CUDA_SUCCESS) rc = p->d->cuStreamSynchronize(stream);
    printf("otherctx rc=%d cross=%ld\n", rc, fake_count("qshare_fake_cross_context_records"));
}

/* cuCtxDestroy of NULL, a context the driver refuses to name: nothing is destroyed. */
static void cmd_destroy_null_ctx(void) {
    typedef CUresult (*destroy_fn)(CUcontext);
    destroy_fn destroy = (destroy_fn)entry("cuCtxDestroy_v2");
    printf("destroynull rc=%d\n", destroy == NULL ? CUDA_ERROR_NOT_FOUND : destroy(NULL));
}

typedef struct one_launch {
    probe *p;
    const char *kind;
    CUfunction f;
    CUresult rc;
} one_launch;

static void *launch_once_main(void *arg) {
    one_launch *l = arg;
    l->rc = l->p->d->cuCtxSetCurrent(l->p->ctx);
    if (l->rc == CUDA_SUCCESS) l->rc = launch_one(l->p, l->kind, l->f);
    return NULL;
}

/* `count` threads, one after another, each making one launch of `kind` and exiting (a pool
 * that replaces its threads): the first failure, if any. */
static void cmd_threads(probe *p, unsigned long count, const char *kind) {
    one_launch l = {p, kind, kernel_of(p, 0), CUDA_SUCCESS};
    CUresult rc = CUDA_SUCCESS;
    for (unsigned long i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, launch_once_main, &l) != 0) break;
        pthread_join(thread, NULL);
        rc = l.rc;
    }
    printf("threads rc=%d\n", rc);
}

/* `asyncpair BYTES`: two threads, each on a stream of its own, allocate BYTES stream-ordered
 * from the current pool at the same time; both answers. `allocpair BYTES`: the same with
 * cuMemAlloc. */
typedef struct async_one {
    probe *p;
    CUstream stream; /* NULL: cuMemAlloc */
    size_t bytes;
    CUdeviceptr ptr;
    CUresult rc;
} async_one;

static void *async_one_main(void *arg) {
    async_one *a = arg;
    a->rc = a->p->d->cuCtxSetCurrent(a->p->ctx);
    if (a->rc == CUDA_SUCCESS)
        a->rc = a->stream != NULL ? a->p->d->cuMemAllocAsync(&a->ptr, a->bytes, a->stream)
                                  : a->p->d->cuMemAlloc_v2(&a->ptr, a->bytes);
    return NULL;
}

static void cmd_pair(probe *p, size_t bytes, int async) {
    async_one one[2] = {{p, NULL, bytes, 0, CUDA_ERROR_INVALID_VALUE},
                        {p, NULL, bytes, 0, CUDA_ERROR_INVALID_VALUE}};
    pthread_t threads[2];
    int started[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        if (!async || p->d->cuStreamCreate(&one[i].stream, 0) == CUDA_SUCCESS)
            started[i] = pthread_create(&threads[i], NULL, async_one_main, &one[i]) == 0;
    for (int i = 0; i < 2; i++)
        if (started[i]) pthread_join(threads[i], NULL);
    printf("%s rc=%d rc2=%d\n", async ? "asyncpair" : "allocpair", one[0].rc, one[1].rc);
}

/* `freerace ID BYTES`: another thread frees allocation ID while this one, 50 ms later,
 * allocates BYTES stream-ordered, or with cuMemCreate when ID is a VMM handle (the fake driver,
 * with its free delayed, gives it the freed address or handle); the free's answer and the
 * allocation's, with its id. */
typedef struct freeing {
    probe *p;
    allocation *a;
    CUresult rc;
} freeing;

static void *free_main(void *arg) {
    freeing *f = arg;
    f->rc = f->p->d->cuCtxSetCurrent(f->p->ctx);
    if (f->rc == CUDA_SUCCESS) f->rc = free_kind(f->p, f->a);
    return NULL;
}

static void cmd_freerace(probe *p, int id, size_t bytes) {
    if (id < 0 || id >= p->n_allocs || !p->allocs[id].live || p->n_allocs == MAX_ALLOCS) {
        printf("freerace rc=%d\n", CUDA_ERROR_INVALID_VALUE);
        return;
    }
    freeing f = {p, &p->allocs[id], CUDA_ERROR_INVALID_VALUE};
    pthread_t thread;
    if (pthread_create(&thread, NULL, free_main, &f) != 0) return;
    struct timespec later = {0, 50 * 1000000L};
    nanosleep(&later, NULL);
    allocation *a = &p->allocs[p->n_allocs];
    memset(a, 0, sizeof *a);
    CUresult rc = alloc_kind(p, a, strcmp(f.a->kind, "vmm") == 0 ? "vmm" : "async", bytes);
    pthread_join(thread, NULL);
    p->allocs[id].live = f.rc != CUDA_SUCCESS;
    a->live = rc == CUDA_SUCCESS;
    printf("freerace rc=%d rc2=%d id=%d\n", f.rc, rc, a->live ? p->n_allocs++ : -1);
}

/* How many kernels the fake driver's device has run to their end. */
static void cmd_kernels(void) { printf("kernels n=%ld\n", fake_count("qshare_fake_kernels_done")); }


/* cuMemHostGetDevicePointer of memory that was never registered: the driver refuses it and
 * must leave the caller's pointer as it was (kept=1). */
static void cmd_hostptr(void) {
    typedef CUresult (*map_fn)(CUdeviceptr *, void *, unsigned int);
    map_fn map = (map_fn)entry("cuMemHostGetDevicePointer_v2");
    static int unregistered;
    const CUdeviceptr sentinel = 0x5e47u;
    CUdeviceptr dptr = sentinel;
    CUresult rc = map == NULL ? CUDA_ERROR_NOT_FOUND : map(&dptr, &unregistered, 0);
    printf("hostptr rc=%d kept=%d\n", rc, dptr == sentinel);
}

/* A graph capture in the mode the program's threads use by default (global), into a stream
 * of its own (or with `probe`, the probe's stream): `capture begin` starts it, `capture end`
 * ends it and answers the driver's verdict (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED when a call
 * elsewhere broke it). */
static void cmd_capture(probe *p, const char *what, const char *which) {
    typedef CUresult (*begin_fn)(CUstream, int);
    typedef CUresult (*end_fn)(CUstream, CUgraph *);
    static CUstream captured;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (strcmp(what, "begin") == 0) {
        begin_fn begin = (begin_fn)entry("cuStreamBeginCapture_v2");
        if (strcmp(which, "probe") == 0) captured = p->stream;
        rc = captured == NULL ? p->d->cuStreamCreate(&captured, 0) : CUDA_SUCCESS;
        if (rc == CUDA_SUCCESS) rc = begin == NULL ? CUDA_ERROR_NOT_FOUND : begin(captured, 0);
    } else if (strcmp(what, "end") == 0) {
        end_fn end = (end_fn)entry("cuStreamEndCapture");
        CUgraph graph = NULL;
        rc = end == NULL ? CUDA_ERROR_NOT_FOUND : end(captured, &graph);
    }
    printf("capture rc=%d\n", rc);
}

static void cmd_sleep(unsigned long ms) {
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    nanosleep(&ts, NULL);
    printf("sleep rc=0\n");
}

/* A child forked after attach that exits normally (running the interposer's exit path). */
static void cmd_fork(void) {
    pid_t child = fork();
    if (child == 0) exit(0);
    int status = -1;
    if (child > 0) waitpid(child, &status, 0);
    printf("fork rc=%d status=%d\n", child > 0 ? 0 : -1, status);
}

/* The program resets the primary context (as cudaDeviceReset does: every stream and event of
 * it dies), or with `release` releases its reference to it (the last one: that destroys it
 * too), retains it again and makes anew what `init` made. */
static void cmd_reset(probe *p, const char *how) {
    typedef CUresult (*reset_fn)(CUdevice);
    const probe_driver *d = p->d;
    reset_fn reset = (reset_fn)entry(strcmp(how, "release") == 0 ? "cuDevicePrimaryCtxRelease_v2"
                                                                  : "cuDevicePrimaryCtxReset_v2");
    CUgraph graph = NULL;
    CUresult rc = reset == NULL ? CUDA_ERROR_NOT_FOUND : reset(0);
    p->n_extra = 0; /* they died with the context: made anew on next use */
    if (rc == CUDA_SUCCESS) rc = d->cuDevicePrimaryCtxRetain(&p->ctx, 0);
    if (rc == CUDA_SUCCESS) rc = d->cuCtxSetCurrent(p->ctx);
    if (rc == CUDA_SUCCESS) rc = d->cuModuleLoadData(&p->module, "fake image");
    if (rc == CUDA_SUCCESS) rc = d->cuStreamCreate(&p->stream, 0);
    if (rc == CUDA_SUCCESS) rc = d->cuGraphCreate(&graph, 0);
    if (rc == CUDA_SUCCESS) rc = d->cuGraphInstantiateWithFlags(&p->graph, graph, 0);
    printf("reset rc=%d\n", rc);
}

/* The program destroys the probe's stream (its queued work still runs), and uses a new one
 * from now on; with `extra`, it destroys the extra streams instead (made anew on next use). */
static void cmd_destroy_stream(probe *p, const char *which) {
    typedef CUresult (*destroy_fn)(CUstream);
    destroy_fn destroy = (destroy_fn)entry("cuStreamDestroy_v2");
    CUresult rc = destroy == NULL ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
    if (strcmp(which, "legacy") == 0) { /* the driver refuses: a default stream */
        printf("destroystream rc=%d\n", rc == CUDA_SUCCESS ? destroy(CU_STREAM_LEGACY) : rc);
        return;
    }
    if (strcmp(which, "extra") == 0) {
        for (int i = 0; i < p->n_extra && rc == CUDA_SUCCESS; i++) rc = destroy(p->extra[i]);
        p->n_extra = 0;
    } else {
        if (rc == CUDA_SUCCESS) rc = destroy(p->stream);
        if (rc == CUDA_SUCCESS) rc = p->d->cuStreamCreate(&p->stream, 0);
    }
    printf("destroystream rc=%d\n", rc);
}

/* How many calls the fake driver was given a handle of a destroyed context or stream. */
static void cmd_deadhandles(void) {
    printf("deadhandles n=%ld\n", fake_count("qshare_fake_dead_handle_uses"));
}

/* A child forked now (the parent's launches still in flight) makes one launch of a `us` µs
 * kernel into the probe's stream, says what it returned and exits; a child still inside
 * the launch after 3 s is killed and reported hung. */
static void cmd_forklaunch(probe *p, unsigned long us) {
    CUfunction f = kernel_of(p, us);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        alarm(3);
        printf("forkchild rc=%d\n", launch_one(p, "kernel", f));
        fflush(stdout);
        exit(0);
    }
    int status = 0;
    if (child > 0) waitpid(child, &status, 0);
    int hung = child > 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
    printf("forklaunch rc=%d hung=%d\n", child > 0 ? 0 : -1, hung);
}

/* ---- graphs holding memory: `graph alloc BYTES HOW` (HOW: an instantiation entry point,
 * `child`, `empty` (an empty node beside), or `keep`: the graph does not free its
 * allocation), `graph capture BYTES [keep]`,
 * `graph launch`, `graph destroy` (the newest executable graph), `graph destroyfirst` (the oldest),
 * `graph free` (cuMemFree of the last graph allocation),
 * `graph trim`; `devused` says the fake device's memory in use ---- */
#define MAX_GRAPH_EXECS 16
static CUgraphExec graph_execs[MAX_GRAPH_EXECS];
static int n_graph_execs;
static CUdeviceptr graph_ptr; /* the last graph allocation made */

typedef CUresult (*inst_flags_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*inst_log_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
typedef CUresult (*inst_params_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

/* cuGraphInstantiate as a CUDA 12 runtime finds it: through cuGetProcAddress. */
static CUresult instantiate_by_proc(CUgraphExec *exec, CUgraph graph) {
    get_proc_fn get_proc = (get_proc_fn)entry("cuGetProcAddress_v2");
    void *fn = NULL;
    CUresult rc = get_proc == NULL ? CUDA_ERROR_NOT_FOUND
                                   : get_proc("cuGraphInstantiate", &fn, 12080, 0, NULL);
    if (rc == CUDA_SUCCESS && fn == NULL) rc = CUDA_ERROR_NOT_FOUND;
    return rc != CUDA_SUCCESS ? rc : ((inst_flags_fn)fn)(exec, graph, 0);
}

/* Instantiate `graph` through the entry point `how` names. */
static CUresult instantiate_as(probe *p, CUgraphExec *exec, CUgraph graph, const char *how) {
    if (strcmp(how, "v1") == 0 || strcmp(how, "v2") == 0) {
        inst_log_fn fn = (inst_log_fn)entry(how[1] == '1' ? "cuGraphInstantiate"
                                                         : "cuGraphInstantiate_v2");
        char log[64];
        return fn == NULL ? CUDA_ERROR_NOT_FOUND : fn(exec, graph, NULL, log, sizeof log);
    }
    if (strncmp(how, "params", 6) == 0) {
        inst_params_fn fn = (inst_params_fn)entry(how[6] == '\0' ? "cuGraphInstantiateWithParams"
                                                               : "cuGraphInstantiateWithParams_ptsz");
        CUDA_GRAPH_INSTANTIATE_PARAMS params = {0};
        return fn == NULL ? CUDA_ERROR_NOT_FOUND : fn(exec, graph, &params);
    }
    if (strcmp(how, "proc") == 0) return instantiate_by_proc(exec, graph);
    return p->d->cuGraphInstantiateWithFlags(exec, graph, 0);
}

/* A graph with one allocation node of `bytes` and, unless `keep`, its free node; with `child`,
 * inside a child graph; with `empty`, an empty node beside. */
static CUresult graph_with_alloc(probe *p, CUgraph *graph, size_t bytes, int child, int keep,
                                 int empty) {
    typedef CUresult (*add_alloc_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                     CUDA_MEM_ALLOC_NODE_PARAMS *);
    typedef CUresult (*add_free_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                    CUdeviceptr);
    typedef CUresult (*add_child_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
    typedef CUresult (*add_empty_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t);
    add_alloc_fn add_alloc = (add_alloc_fn)entry("cuGraphAddMemAllocNode");
    add_free_fn add_free = (add_free_fn)entry("cuGraphAddMemFreeNode");
    add_child_fn add_child = (add_child_fn)entry("cuGraphAddChildGraphNode");
    add_empty_fn add_empty = (add_empty_fn)entry("cuGraphAddEmptyNode");
    CUgraph inner = NULL;
    CUgraphNode node = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS params = {.bytesize = bytes};
    if (add_alloc == NULL || add_free == NULL || add_child == NULL || add_empty == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = p->d->cuGraphCreate(&inner, 0);
    if (rc == CUDA_SUCCESS) rc = add_alloc(&node, inner, NULL, 0, &params);
    graph_ptr = params.dptr;
    if (rc == CUDA_SUCCESS && !keep) rc = add_free(NULL, inner, &node, 1, params.dptr);
    if (rc == CUDA_SUCCESS && empty) rc = add_empty(NULL, inner, NULL, 0);
    if (rc != CUDA_SUCCESS || !child) {
        *graph = inner;
        return rc;
    }
    rc = p->d->cuGraphCreate(graph, 0);
    return rc != CUDA_SUCCESS ? rc : add_child(&node, *graph, NULL, 0, inner);
}

/* A graph captured from a stream: an asynchronous allocation of `bytes` and, unless `keep`, its
 * free. */
static CUresult graph_captured(probe *p, CUgraph *graph, size_t bytes, int keep) {
    typedef CUresult (*begin_fn)(CUstream, int);
    typedef CUresult (*end_fn)(CUstream, CUgraph *);
    begin_fn begin = (begin_fn)entry("cuStreamBeginCapture_v2");
    end_fn end = (end_fn)entry("cuStreamEndCapture");
    CUstream stream = NULL;
    CUdeviceptr ptr = 0;
    if (begin == NULL || end == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = p->d->cuStreamCreate(&stream, 0);
    if (rc == CUDA_SUCCESS) rc = begin(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
    if (rc == CUDA_SUCCESS) rc = p->d->cuMemAllocAsync(&ptr, bytes, stream);
    graph_ptr = ptr;
    if (rc == CUDA_SUCCESS && !keep) rc = p->d->cuMemFreeAsync(ptr, stream);
    CUresult ended = stream != NULL ? end(stream, graph) : CUDA_ERROR_INVALID_HANDLE;
    return rc != CUDA_SUCCESS ? rc : ended;
}

static CUresult graph_make(probe *p, const char *what, size_t bytes, const char *how) {
    typedef CUresult (*destroy_fn)(CUgraph);
    destroy_fn destroy = (destroy_fn)entry("cuGraphDestroy");
    CUgraph graph = NULL;
    if (n_graph_execs == MAX_GRAPH_EXECS || destroy == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = strcmp(what, "capture") == 0
                      ? graph_captured(p, &graph, bytes, strcmp(how, "keep") == 0)
                      : graph_with_alloc(p, &graph, bytes, strcmp(how, "child") == 0,
                                         strcmp(how, "keep") == 0, strcmp(how, "empty") == 0);
    CUgraphExec exec = NULL;
    if (rc == CUDA_SUCCESS) rc = instantiate_as(p, &exec, graph, how);
    if (rc == CUDA_SUCCESS) graph_execs[n_graph_execs++] = exec;
    if (graph != NULL) destroy(graph);
    return rc;
}

static CUresult graph_use(probe *p, const char *what) {
    typedef CUresult (*exec_fn)(CUgraphExec);
    typedef CUresult (*trim_fn)(CUdevice);
    if (strcmp(what, "trim") == 0) {
        trim_fn trim = (trim_fn)entry("cuDeviceGraphMemTrim");
        return trim == NULL ? CUDA_ERROR_NOT_FOUND : trim(0);
    }
    if (strcmp(what, "free") == 0) return p->d->cuMemFree_v2(graph_ptr);
    if (n_graph_execs == 0) return CUDA_ERROR_INVALID_VALUE;
    CUgraphExec exec = graph_execs[n_graph_execs - 1];
    if (strcmp(what, "launch") == 0) {
        CUresult rc = p->d->cuGraphLaunch(exec, p->stream);
        return rc != CUDA_SUCCESS ? rc : p->d->cuStreamSynchronize(p->stream);
    }
    exec_fn destroy = (exec_fn)entry("cuGraphExecDestroy");
    if (destroy == NULL) return CUDA_ERROR_NOT_FOUND;
    if (strcmp(what, "destroyfirst") == 0) { /* the oldest executable graph, not the newest */
        exec = graph_execs[0];
        memmove(graph_execs, graph_execs + 1, (size_t)(n_graph_execs - 1) * sizeof exec);
    } else if (strcmp(what, "destroy") != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    n_graph_execs--;
    return destroy(exec);
}

typedef struct destroying {
    CUgraphExec exec;
    CUresult rc;
} destroying;

static void *destroy_main(void *arg) {
    typedef CUresult (*exec_fn)(CUgraphExec);
    destroying *d = arg;
    exec_fn destroy = (exec_fn)entry("cuGraphExecDestroy");
    d->rc = destroy == NULL ? CUDA_ERROR_NOT_FOUND : destroy(d->exec);
    return NULL;
}

/* `graph racedestroy BYTES`: another thread destroys the newest executable graph while this
 * one, 50 ms later, instantiates a graph allocating BYTES (the fake driver, with its destroy
 * delayed, hands the instantiation the destroyed graph's handle). */
static CUresult graph_race_destroy(probe *p, size_t bytes) {
    if (n_graph_execs == 0) return CUDA_ERROR_INVALID_VALUE;
    destroying d = {graph_execs[--n_graph_execs], CUDA_ERROR_INVALID_VALUE};
    pthread_t thread;
    if (pthread_create(&thread, NULL, destroy_main, &d) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct timespec later = {0, 50 * 1000000L};
    nanosleep(&later, NULL);
    CUresult rc = p->d->cuCtxSetCurrent(p->ctx);
    if (rc == CUDA_SUCCESS) rc = graph_make(p, "alloc", bytes, "flags");
    pthread_join(thread, NULL);
    return rc != CUDA_SUCCESS ? rc : d.rc;
}

static void cmd_graph(probe *p, const char *line) {
    char what[32] = "", how[32] = "flags";
    unsigned long bytes = 0;
    sscanf(line, "%*s %31s %lu %31s", what, &bytes, how);
    CUresult rc = strcmp(what, "alloc") == 0 || strcmp(what, "capture") == 0
                      ? graph_make(p, what, (size_t)bytes, how)
                  : strcmp(what, "racedestroy") == 0 ? graph_race_destroy(p, (size_t)bytes)
                                                     : graph_use(p, what);
    printf("graph rc=%d\n", rc);
}

static void cmd_devused(void) { printf("devused bytes=%ld\n", fake_count("qshare_fake_device_used")); }

/* The device's default memory pool: `pool threshold BYTES` sets its release threshold,
 * `pool trim BYTES` trims it to that. */
static void cmd_pool(probe *p, const char *what, unsigned long long bytes) {
    typedef CUresult (*set_fn)(CUmemoryPool, int, void *);
    typedef CUresult (*trim_fn)(CUmemoryPool, size_t);
    set_fn set = (set_fn)entry("cuMemPoolSetAttribute");
    trim_fn trim = (trim_fn)entry("cuMemPoolTrimTo");
    CUmemoryPool pool = NULL;
    cuuint64_t value = bytes;
    CUresult rc = set == NULL || trim == NULL ? CUDA_ERROR_NOT_FOUND
                                              : p->d->cuDeviceGetDefaultMemPool(&pool, 0);
    if (rc == CUDA_SUCCESS && strcmp(what, "threshold") == 0)
        rc = set(pool, 4 /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */, &value);
    else if (rc == CUDA_SUCCESS && strcmp(what, "trim") == 0) rc = trim(pool, (size_t)bytes);
    else if (rc == CUDA_SUCCESS) rc = CUDA_ERROR_INVALID_VALUE;
    printf("pool rc=%d\n", rc);
}

static void run(probe *p, char *line) {
    char cmd[32] = "", arg1[32] = "";
    unsigned long n1 = 0, n2 = 0;
    int fields = sscanf(line, "%31s %31s %lu %lu", cmd, arg1, &n1, &n2);
    if (fields <= 0) return;
    char word3[32] = ""; /* spin US [KIND], capture begin [probe] */
    sscanf(line, "%*s %*s %31s", word3);
    if (strcmp(cmd, "init") == 0) cmd_init(p, atoi(arg1));
    else if (strcmp(cmd, "device") == 0) cmd_device(p, atoi(arg1));
    else if (strcmp(cmd, "alloc") == 0) cmd_alloc(p, arg1, (size_t)n1);
    else if (strcmp(cmd, "free") == 0) cmd_free(p, atoi(arg1));
    else if (strcmp(cmd, "meminfo") == 0) cmd_meminfo(p, atoi(arg1));
    else if (strcmp(cmd, "nvml") == 0) cmd_nvml(p, (unsigned)atoi(arg1));
    else if (strcmp(cmd, "cards") == 0) cmd_cards(p);
    else if (strcmp(cmd, "launch") == 0) cmd_launch(p, arg1, n1, n2 ? n2 : 1);
    else if (strcmp(cmd, "sync") == 0) cmd_sync(p);
    else if (strcmp(cmd, "spread") == 0) cmd_spread(p, strtoul(arg1, NULL, 10), n1, n2);
    else if (strcmp(cmd, "alternate") == 0) cmd_alternate(p, line);
    else if (strcmp(cmd, "phases") == 0) cmd_phases(p, line);
    else if (strcmp(cmd, "queued") == 0) cmd_queued();
    else if (strcmp(cmd, "now") == 0) printf("now t=%llu\n", (unsigned long long)now_ns());
    else if (strcmp(cmd, "bench") == 0) cmd_bench(p, strtoul(arg1, NULL, 10));
    else if (strcmp(cmd, "allocbench") == 0) cmd_allocbench(p, strtoul(arg1, NULL, 10), word3);
    else if (strcmp(cmd, "spin") == 0) cmd_spin(p, strtoul(arg1, NULL, 10), word3);
    else if (strcmp(cmd, "fork") == 0) cmd_fork();
    else if (strcmp(cmd, "reset") == 0) cmd_reset(p, arg1);
    else if (strcmp(cmd, "deadhandles") == 0) cmd_deadhandles();
    else if (strcmp(cmd, "destroystream") == 0) cmd_destroy_stream(p, arg1);
    else if (strcmp(cmd, "forklaunch") == 0) cmd_forklaunch(p, strtoul(arg1, NULL, 10));
    else if (strcmp(cmd, "hold") == 0) cmd_hold(p);
    else if (strcmp(cmd, "records") == 0) cmd_records();
    else if (strcmp(cmd, "kernels") == 0) cmd_kernels();
    else if (strcmp(cmd, "captures") == 0) cmd_captures();
    else if (strcmp(cmd, "hostptr") == 0) cmd_hostptr();
    else if (strcmp(cmd, "events") == 0) cmd_events();
    else if (strcmp(cmd, "captured") == 0) cmd_captured();
    else if (strcmp(cmd, "destroynull") == 0) cmd_destroy_null_ctx();
    else if (strcmp(cmd, "ctx2") == 0) cmd_ctx2(p, strtoul(arg1, NULL, 10), n1);
    else if (strcmp(cmd, "ctxrace") == 0) cmd_ctxrace(p, strtoul(arg1, NULL, 10), n1);
    else if (strcmp(cmd, "otherctx") == 0) cmd_otherctx(p, strtoul(arg1, NULL, 10), n1);
    else if (strcmp(cmd, "threads") == 0) cmd_threads(p, strtoul(arg1, NULL, 10), word3);
    else if (strcmp(cmd, "capture") == 0) cmd_capture(p, arg1, word3);
    else if (strcmp(cmd, "sleep") == 0) cmd_sleep(strtoul(arg1, NULL, 10));
    else if (strcmp(cmd, "graph") == 0) cmd_graph(p, line);
    else if (strcmp(cmd, "devused") == 0) cmd_devused();
    else if (strcmp(cmd, "freerace") == 0) cmd_freerace(p, atoi(arg1), (size_t)n1);
    else if (strcmp(cmd, "asyncpair") == 0) cmd_pair(p, strtoull(arg1, NULL, 10), 1);
    else if (strcmp(cmd, "allocpair") == 0) cmd_pair(p, strtoull(arg1, NULL, 10), 0);
    else if (strcmp(cmd, "pool") == 0) cmd_pool(p, arg1, strtoull(word3, NULL, 10));
    else printf("%s rc=-1 error=unknown-command\n", cmd);
    fflush(stdout);
}

int probe_main(const probe_driver *d, int argc, char **argv, int first) {
    static probe p;
    static probe_driver table; /* outlives main: a spinning thread still launches at exit */
    table = *d;
    p.d = &table;
    if (first < argc) {
        for (int i = first; i < argc; i++) run(&p, argv[i]);
        return 0;
    }
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (strncmp(line, "quit", 4) == 0) break;
        run(&p, line);
    }
    return 0;
}

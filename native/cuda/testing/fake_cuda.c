/* fake_cuda.c — TEST DOUBLE of libcuda.so.1 for CI machines without a GPU. Not a real
 * driver: the devices of fake_cuda_config.h (one unless configured), of which
 * CUDA_VISIBLE_DEVICES picks and orders the ones enumerated as on the real driver (NVML, the
 * real one's and the fake's, lists them all), each with its primary context, and streams that
 * execute their
 * work asynchronously and in order on a device thread each, a kernel taking the time its
 * name gives ("sleep_us_250" runs 250 µs; "replay" runs the nanoseconds its first
 * parameter points to, a uint64_t, so a trace's kernels can be replayed; "hold_launch" is
 * never submitted: its launch call blocks for good; any other name runs 0 ns). Each stream keeps a device clock: a kernel starts when the one before it
 * ends or when it was submitted, whichever is later, so the device thread's own wake-up
 * delays move when completions are seen, never when work runs, as on a real card. Work
 * submitted to an idle stream that takes no time completes inline, so launch overhead
 * can be measured.
 * All default streams (NULL, legacy, per-thread) are one stream. A created stream can be
 * captured into a graph (its work then does not run), and the driver's rules for calls made
 * during a capture hold: a wait on an event or a stream that a capture forbids the calling
 * thread (its mode, cuThreadExchangeStreamCaptureMode) fails and invalidates it. Device memory is
 * address space only: allocations are counted against the current device's total, never
 * backed (the devices share one count of memory in use, and one default memory pool); as on the real driver, a memory pool keeps what is freed into it until a
 * synchronization or a trim, and graph memory is taken at a graph's first launch into a graph
 * memory pool kept until cuDeviceGraphMemTrim (qshare_fake_device_used says what the card
 * holds). The interposer under test runs against this exactly as against libcuda.
 * Linked with -Bsymbolic: like the real driver, its calls to itself stay inside it. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"
#include "fake_cuda_config.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- time ---- */
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until_ns(uint64_t deadline) {
    struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* ---- objects ---- */
struct CUctx_st {
    int device;
    _Atomic uint64_t generation; /* moves when the context is destroyed (see dead_handle) */
};
struct CUmod_st {
    int unused;
};
struct CUfunc_st {
    uint64_t duration_ns;
    int replay; /* duration from the launch's first parameter */
    int hold;   /* "hold_launch": the launch call never returns */
};
/* The node types the driver answers cuGraphNodeGetType with (CUgraphNodeType), written out
 * here rather than taken from the interposer's header, so that a wrong value there shows. */
enum { NODE_GRAPH = 4, NODE_EMPTY = 5, NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11 };
struct CUgraphNode_st {
    int type;         /* NODE_*: an allocation, a free, a child graph, an empty node, or 0 */
    uint64_t bytes;   /* an allocation's size */
    CUgraph child;    /* a child graph node's graph (owned by the node) */
    CUdeviceptr dptr; /* an allocation's address */
    int freed;        /* an allocation the graph frees itself */
    struct CUgraphNode_st *next;
};
/* An allocation a launched graph made and did not free: it lives on (its exec's destroy
 * included) until cuMemFree or cuMemFreeAsync. */
typedef struct graph_alloc {
    CUdeviceptr dptr;
    uint64_t bytes;
    struct CUgraphExec_st *exec; /* NULL once its exec was destroyed */
    struct graph_alloc *next;
} graph_alloc;
struct CUgraph_st {
    CUgraphNode nodes; /* newest first */
    size_t count;
};
struct CUgraphExec_st {
    uint64_t duration_ns;
    uint64_t graph_bytes; /* its allocation nodes' sizes, children's included */
    int backed;           /* launched (or uploaded): graph_bytes are physically held */
    size_t n_kept;        /* its allocations the graph does not free */
    CUdeviceptr kept_dptr[8];
    uint64_t kept_bytes[8];
};
struct CUarray_st {
    uint64_t bytes;
};
/* A memory pool keeps the memory freed into it (`reserved` beyond `in_use`, counted as the
 * device's) until a synchronization finds it holding more than its release threshold, or until
 * cuMemPoolTrimTo, as the real driver's pools do. Under pool_lock. */
struct CUmemPoolHandle_st {
    uint64_t reserved, in_use, threshold;
};

enum { EV_NEVER = 0, EV_PENDING = 1, EV_DONE = 2 };
struct CUevent_st {
    CUcontext ctx;       /* the context current when it was made */
    uint64_t generation; /* that context's when created (see dead_handle) */
    _Atomic int state;
    int timed; /* created without CU_EVENT_DISABLE_TIMING */
    uint64_t time_ns;
};

enum op_kind { OP_KERNEL, OP_EVENT, OP_HOST, OP_WAIT };
typedef struct op {
    enum op_kind kind;
    uint64_t duration_ns;
    uint64_t submit_ns;
    CUevent event;
    CUhostFn fn;
    void *data;
    const _Atomic uint32_t *word; /* OP_WAIT: runs once *word == value */
    uint32_t value;
    struct op *next;
} op;

struct CUstream_st {
    CUcontext ctx;       /* a created stream's context */
    uint64_t generation; /* that context's when created; 0 for the default stream */
    pthread_mutex_t lock;
    pthread_cond_t work;
    op *first, *last;
    _Atomic uint64_t pending; /* submitted, not yet done */
    int stop;
    uint64_t clock_ns; /* device clock: when the last work run on this stream ended */
    int blocking;        /* created without CU_STREAM_NON_BLOCKING: the legacy stream waits for it */
    _Atomic int capture; /* CU_STREAM_CAPTURE_STATUS_*: work submitted meanwhile is captured */
    int capture_mode;    /* as begun (CUstreamCaptureMode); with `capturer`, under streams_lock */
    pthread_t capturer;
    CUgraph captured;    /* the graph being captured (its allocation nodes) */
    pthread_t worker;
    struct CUstream_st *next_stream;
};

/* Device i's primary context; device 0's is the default one. */
static struct CUctx_st primaries[FAKE_MAX_GPUS] = {
    {0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}};
#define the_context (primaries[0])
static _Thread_local CUcontext current_context;
static _Atomic int initialized;

/* Destroying a context (cuCtxDestroy, cuDevicePrimaryCtxReset) destroys every stream and
 * event made in it, and only those: their handles are dead, and a call given one is refused as
 * an invalid handle (a real driver may do worse) and counted. The context's handle stays the
 * same, as the primary context's does on a real driver. */
static _Atomic unsigned long dead_handle_uses;

static int dead_handle(CUcontext ctx, uint64_t generation) {
    if (generation == 0 || generation == atomic_load(&ctx->generation)) return 0;
    atomic_fetch_add(&dead_handle_uses, 1);
    return 1;
}

/* The context new streams and events belong to: the current one, else the primary. */
static CUcontext owning_context(void);

/* Test hook: how many calls were given a handle that a destroyed context took with it. */
EXPORT unsigned long qshare_fake_dead_handle_uses(void) { return atomic_load(&dead_handle_uses); }

/* Completion of any work: waiters on events and streams sleep here. */
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream all_streams;
static CUstream default_stream;

static _Atomic unsigned long kernels_done;

/* Kernel time submitted and not yet run to its end, over every stream, and the most there has
 * been (test hooks: what a process had queued on the card at once). */
static _Atomic uint64_t queued_ns, queued_max_ns;

static void queue_kernel(uint64_t ns) {
    uint64_t now = atomic_fetch_add(&queued_ns, ns) + ns;
    uint64_t max = atomic_load(&queued_max_ns);
    while (now > max && !atomic_compare_exchange_weak(&queued_max_ns, &max, now)) {
    }
}

/* Test hook: the most kernel time (ns) that was queued on the device at once. */
EXPORT unsigned long qshare_fake_queued_max_ns(void) {
    return (unsigned long)atomic_load(&queued_max_ns);
}

/* Test hook: the most kernel time queued at once since the last call (or the start); what is
 * queued now starts the next count. */
EXPORT unsigned long qshare_fake_queued_max_take(void) {
    uint64_t max = atomic_exchange(&queued_max_ns, atomic_load(&queued_ns));
    return (unsigned long)max;
}

/* A stream memory wait: the device polls the word, as a real card's front end does, every
 * WAIT_POLL_NS. The stream reached it at its clock (run_op set it); only a wait that found
 * the word otherwise moves the clock, to when it saw the value (a device thread that woke
 * late to an open word delays nothing, as with kernels). */
#define WAIT_POLL_NS 5000ull
static void wait_value(CUstream st, const op *o) {
    if (atomic_load(o->word) == o->value) return;
    while (atomic_load(o->word) != o->value) sleep_until_ns(now_ns() + WAIT_POLL_NS);
    uint64_t seen = now_ns();
    if (seen > st->clock_ns) st->clock_ns = seen;
}

static void complete_event(CUevent ev, uint64_t at_ns) {
    if (ev->timed) ev->time_ns = at_ns;
    atomic_store(&ev->state, EV_DONE);
}

/* Run `o` on the device clock of `st`: it starts when the stream's previous work ended
 * or when it was submitted, whichever is later; the thread then waits until it ends. */
static void run_op(CUstream st, op *o) {
    uint64_t start = o->submit_ns > st->clock_ns ? o->submit_ns : st->clock_ns;
    st->clock_ns = start + (o->kind == OP_KERNEL ? o->duration_ns : 0);
    switch (o->kind) {
    case OP_KERNEL:
        if (o->duration_ns && st->clock_ns > now_ns()) sleep_until_ns(st->clock_ns);
        atomic_fetch_add(&kernels_done, 1);
        atomic_fetch_sub(&queued_ns, o->duration_ns);
        break;
    case OP_WAIT: wait_value(st, o); break;
    case OP_EVENT: complete_event(o->event, st->clock_ns); break;
    case OP_HOST: o->fn(o->data); break;
    }
}

static void *worker_main(void *arg) {
    CUstream st = arg;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* kernels of a few µs want µs accuracy */
    for (;;) {
        pthread_mutex_lock(&st->lock);
        while (st->first == NULL && !st->stop) pthread_cond_wait(&st->work, &st->lock);
        op *o = st->first;
        if (o == NULL) {
            pthread_mutex_unlock(&st->lock);
            return NULL;
        }
        st->first = o->next;
        if (st->first == NULL) st->last = NULL;
        pthread_mutex_unlock(&st->lock);
        run_op(st, o);
        /* Waiters wait for an event or an empty stream: wake them only for those. */
        int wake = o->kind == OP_EVENT;
        free(o);
        if (atomic_fetch_sub(&st->pending, 1) != 1 && !wake) continue;
        pthread_mutex_lock(&done_lock);
        pthread_cond_broadcast(&done_cond);
        pthread_mutex_unlock(&done_lock);
    }
}

static CUstream new_stream(void) {
    CUstream st = calloc(1, sizeof *st);
    if (st == NULL) return NULL;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->work, NULL);
    if (pthread_create(&st->worker, NULL, worker_main, st) != 0) {
        free(st);
        return NULL;
    }
    pthread_mutex_lock(&streams_lock);
    st->next_stream = all_streams;
    all_streams = st;
    pthread_mutex_unlock(&streams_lock);
    return st;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static void make_default_stream(void) { default_stream = new_stream(); }

/* One of the default streams (NULL, legacy, per-thread): one shared stream here. */
static int is_default(CUstream stream) {
    return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

static CUstream resolve(CUstream st) {
    if (is_default(st)) {
        pthread_once(&default_once, make_default_stream);
        return default_stream;
    }
    return st;
}

static int legacy_use_forbidden(CUstream stream);
static void pools_synchronized(void);
EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
EXPORT CUresult cuGraphDestroy(CUgraph graph);
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                       size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params);
static _Atomic unsigned long captured_records;

/* Test hook: how many event records went into a graph being captured (the probe records no
 * events of its own: these are the interposer's). */
EXPORT unsigned long qshare_fake_captured_records(void) { return atomic_load(&captured_records); }

static CUresult submit(CUstream stream, op o) {
    if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    CUstream st = resolve(stream);
    if (st == NULL || dead_handle(st->ctx, st->generation)) return CUDA_ERROR_INVALID_HANDLE;
    if (legacy_use_forbidden(stream)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (atomic_load(&st->capture) != CU_STREAM_CAPTURE_STATUS_NONE) {
        if (o.kind == OP_EVENT) atomic_fetch_add(&captured_records, 1);
        return CUDA_SUCCESS; /* into the graph being captured: it does not run now */
    }
    int instant = (o.kind != OP_KERNEL || o.duration_ns == 0) && o.kind != OP_WAIT;
    o.submit_ns = now_ns();
    if (o.kind == OP_KERNEL) queue_kernel(o.duration_ns);
    if (instant && atomic_load(&st->pending) == 0) {
        run_op(st, &o); /* the device thread is parked: nothing else moves the clock */
        return CUDA_SUCCESS;
    }
    op *copy = malloc(sizeof *copy);
    if (copy == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *copy = o;
    copy->next = NULL;
    atomic_fetch_add(&st->pending, 1);
    pthread_mutex_lock(&st->lock);
    if (st->last != NULL) st->last->next = copy;
    else st->first = copy;
    st->last = copy;
    pthread_cond_signal(&st->work);
    pthread_mutex_unlock(&st->lock);
    return CUDA_SUCCESS;
}

/* ---- graph capture: the driver's documented rules for potentially unsafe calls ---- */
static _Thread_local int thread_capture_mode; /* cuThreadExchangeStreamCaptureMode: GLOBAL */
static _Atomic int captures_under_way;

/* Whether a capture forbids this thread a potentially unsafe call (a wait on an event or a
 * stream): its own capture unless begun relaxed, or another thread's begun in global mode
 * while this thread's mode is global; relaxed threads are never forbidden. The captures that
 * forbid the call are invalidated, and the call fails. */
static int capture_forbids_call(void) {
    if (atomic_load(&captures_under_way) == 0 ||
        thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return 0;
    int forbidden = 0;
    pthread_mutex_lock(&streams_lock);
    for (CUstream st = all_streams; st != NULL; st = st->next_stream) {
        if (atomic_load(&st->capture) == CU_STREAM_CAPTURE_STATUS_NONE) continue;
        int forbids = pthread_equal(st->capturer, pthread_self())
                          ? st->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED
                          : st->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (!forbids) continue;
        atomic_store(&st->capture, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        forbidden = 1;
    }
    pthread_mutex_unlock(&streams_lock);
    return forbidden;
}

/* The legacy stream (NULL in the legacy entry points, or CU_STREAM_LEGACY) synchronizes with
 * every blocking stream, so while one of them is captured, using it is invalid: the captures
 * it would join are invalidated, and the use fails. */
static int blocking_captures(int invalidate) {
    if (atomic_load(&captures_under_way) == 0) return 0;
    int found = 0;
    pthread_mutex_lock(&streams_lock);
    for (CUstream st = all_streams; st != NULL; st = st->next_stream) {
        if (!st->blocking || atomic_load(&st->capture) == CU_STREAM_CAPTURE_STATUS_NONE) continue;
        if (invalidate) atomic_store(&st->capture, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        found = 1;
    }
    pthread_mutex_unlock(&streams_lock);
    return found;
}

static int legacy_use_forbidden(CUstream stream) {
    return (stream == NULL || stream == CU_STREAM_LEGACY) && blocking_captures(1);
}

static void wait_stream(CUstream st) {
    pthread_mutex_lock(&done_lock);
    while (atomic_load(&st->pending) != 0) pthread_cond_wait(&done_cond, &done_lock);
    pthread_mutex_unlock(&done_lock);
}

/* ---- initialization, devices, contexts ---- */
/* CUDA_VISIBLE_DEVICES, read as the real driver reads it, once, before the first device is
 * known: a comma-separated list of simulated devices by index or by full UUID, the devices
 * visible in its order (ordinal k is the k-th named), up to the first entry naming no device
 * or one named already; unset, every device in index order. (The real driver also takes a
 * UUID's unique prefix and MIG-... names; this double does not.) */
static pthread_once_t visible_once = PTHREAD_ONCE_INIT;
static int visible[FAKE_MAX_GPUS]; /* ordinal -> simulated device */
static int visible_n;

/* The simulated device an entry of CUDA_VISIBLE_DEVICES names, or -1. */
static int named_device(const char *entry) {
    char *end = NULL;
    long index = strtol(entry, &end, 10);
    if (end != entry && *end == '\0')
        return index >= 0 && index < fake_gpu_count() ? (int)index : -1;
    for (int dev = 0; dev < fake_gpu_count(); dev++) {
        char text[QSC_UUID_TEXT_LEN];
        fake_gpu_uuid_of(dev, text);
        if (strcmp(entry, text) == 0) return dev;
    }
    return -1;
}

static int already_visible(int dev) {
    for (int k = 0; k < visible_n; k++)
        if (visible[k] == dev) return 1;
    return 0;
}

static void read_visible(void) {
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    if (list == NULL) {
        for (visible_n = 0; visible_n < fake_gpu_count(); visible_n++)
            visible[visible_n] = visible_n;
        return;
    }
    char copy[1024], *save = NULL;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *e = strtok_r(copy, ",", &save); e != NULL && visible_n < FAKE_MAX_GPUS;
         e = strtok_r(NULL, ",", &save)) {
        int dev = named_device(e);
        if (dev < 0 || already_visible(dev)) break;
        visible[visible_n++] = dev;
    }
}

static int visible_count(void) {
    pthread_once(&visible_once, read_visible);
    return visible_n;
}

/* 1 when `dev` is a visible device's ordinal. */
static int device_valid(int dev) { return dev >= 0 && dev < visible_count(); }

/* The simulated device of visible ordinal `dev` (a valid one). */
static int simulated(int dev) { return device_valid(dev) ? visible[dev] : dev; }

/* CUDA cannot be used in a child forked after the parent initialized it: the child's calls,
 * cuInit included, are refused as not initialized, as the real driver refuses them. */
static _Atomic int forked_after_init;

static void refuse_in_child(void) {
    if (atomic_exchange(&initialized, 0)) atomic_store(&forked_after_init, 1);
}

__attribute__((constructor)) static void watch_forks(void) {
    pthread_atfork(NULL, NULL, refuse_in_child);
}

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (atomic_load(&forked_after_init)) return CUDA_ERROR_NOT_INITIALIZED;
    if (visible_count() == 0) return CUDA_ERROR_NO_DEVICE; /* as the driver: none visible */
    atomic_store(&initialized, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    *version = 12080;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    *count = visible_count();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device_valid(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "qshare fake GPU (test double)");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    char text[QSC_UUID_TEXT_LEN];
    fake_gpu_uuid_of(simulated(dev), text);
    qsc_uuid_parse(text, uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)fake_gpu_mem_of(simulated(dev));
    return CUDA_SUCCESS;
}

/* The primary context lives while retained: the release of its last reference destroys it
 * (its handle stays the same for the next retain). */
static _Atomic int primary_refs[FAKE_MAX_GPUS];
static void destroy_context(CUcontext ctx);

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_add(&primary_refs[dev], 1);
    *ctx = &primaries[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int refs = atomic_load(&primary_refs[dev]);
    do {
        if (refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    } while (!atomic_compare_exchange_weak(&primary_refs[dev], &refs, refs - 1));
    if (refs == 1) destroy_context(&primaries[dev]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    *active = atomic_load(&primary_refs[dev]) > 0;
    return CUDA_SUCCESS;
}

/* A context of its own (not the primary one), made current. Never freed: a test double's
 * shortcut, so that a destroyed one's handle can still be told dead. */
EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUcontext made = calloc(1, sizeof *made);
    if (made == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    made->device = dev;
    atomic_store(&made->generation, 1);
    *ctx = current_context = made;
    return CUDA_SUCCESS;
}

static CUcontext owning_context(void) {
    return current_context != NULL ? current_context : &the_context;
}

/* Its work is waited for, then its streams and events die with it. */
static void destroy_context(CUcontext ctx) {
    pthread_mutex_lock(&streams_lock);
    CUstream list = all_streams;
    pthread_mutex_unlock(&streams_lock);
    for (CUstream st = list; st != NULL; st = st->next_stream) wait_stream(st);
    atomic_fetch_add(&ctx->generation, 1);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    destroy_context(ctx);
    if (current_context == ctx) current_context = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    destroy_context(&primaries[dev]);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    current_context = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current_context;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev) {
    if (current_context == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = current_context->device;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    if (capture_forbids_call()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&streams_lock);
    CUstream list = all_streams;
    pthread_mutex_unlock(&streams_lock);
    for (CUstream st = list; st != NULL; st = st->next_stream) wait_stream(st);
    pools_synchronized();
    return CUDA_SUCCESS;
}

/* ---- modules and kernels ---- */
EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    (void)image;
    *module = calloc(1, sizeof **module);
    return *module != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuModuleUnload(CUmodule module) {
    free(module);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
    (void)module;
    CUfunction fn = calloc(1, sizeof *fn);
    if (fn == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    if (strncmp(name, "sleep_us_", 9) == 0) fn->duration_ns = strtoull(name + 9, NULL, 10) * 1000u;
    fn->replay = strcmp(name, "replay") == 0;
    fn->hold = strcmp(name, "hold_launch") == 0;
    *f = fn;
    return CUDA_SUCCESS;
}

/* A launch of "hold_launch" blocks its caller for good, as a real launch blocks while the
 * driver's queue is full; qshare_fake_wait_held (not a CUDA entry point) lets a test program
 * wait until `count` calls are held. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cond = PTHREAD_COND_INITIALIZER;
static int held;

static void hold_forever(void) {
    pthread_mutex_lock(&held_lock);
    held++;
    pthread_cond_broadcast(&held_cond);
    for (;;) pthread_cond_wait(&held_cond, &held_lock);
}

EXPORT void qshare_fake_wait_held(int count) {
    pthread_mutex_lock(&held_lock);
    while (held < count) pthread_cond_wait(&held_cond, &held_lock);
    pthread_mutex_unlock(&held_lock);
}

static CUresult launch(CUfunction f, CUstream stream, void **params) {
    if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (f->hold) hold_forever();
    uint64_t duration = f->duration_ns;
    if (f->replay) {
        if (params == NULL || params[0] == NULL) return CUDA_ERROR_INVALID_VALUE;
        memcpy(&duration, params[0], sizeof duration);
    }
    return submit(stream, (op){.kind = OP_KERNEL, .duration_ns = duration});
}

#define KERNEL_ARGS                                                                     \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params
#define UNUSED_KERNEL_ARGS \
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared

EXPORT CUresult cuLaunchKernel(KERNEL_ARGS, void **extra) {
    UNUSED_KERNEL_ARGS, (void)extra;
    return launch(f, stream, params);
}
/* What NULL names in the per-thread-stream (_ptsz) entry points. */
static CUstream per_thread(CUstream stream) { return stream == NULL ? CU_STREAM_PER_THREAD : stream; }

EXPORT CUresult cuLaunchKernel_ptsz(KERNEL_ARGS, void **extra) {
    UNUSED_KERNEL_ARGS, (void)extra;
    return launch(f, per_thread(stream), params);
}
EXPORT CUresult cuLaunchCooperativeKernel(KERNEL_ARGS) {
    UNUSED_KERNEL_ARGS;
    return launch(f, stream, params);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(KERNEL_ARGS) {
    UNUSED_KERNEL_ARGS;
    return launch(f, per_thread(stream), params);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    (void)e;
    return c == NULL ? CUDA_ERROR_INVALID_VALUE : launch(f, c->hStream, p);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    if (c == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUlaunchConfig config = *c;
    config.hStream = per_thread(config.hStream);
    return cuLaunchKernelEx(&config, f, p, e);
}

EXPORT CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *data) {
    if (fn == NULL) return CUDA_ERROR_INVALID_VALUE;
    return submit(stream, (op){.kind = OP_HOST, .fn = fn, .data = data});
}
EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void *data) {
    return cuLaunchHostFunc(per_thread(stream), fn, data);
}

/* ---- streams and events ---- */
EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    *stream = new_stream();
    if (*stream == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    (*stream)->blocking = (flags & CU_STREAM_NON_BLOCKING) == 0;
    (*stream)->ctx = owning_context();
    (*stream)->generation = atomic_load(&(*stream)->ctx->generation);
    return CUDA_SUCCESS;
}

/* As on the real driver, the call returns at once and the stream's queued work still runs;
 * its handle is dead from now on (refused and counted, as a destroyed context's are). The
 * default streams cannot be destroyed. Streams stay allocated (their worker parked) until
 * exit: a test double's shortcut. */
#define STREAM_DESTROYED UINT64_MAX
EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    if (is_default(stream))
        return CUDA_ERROR_INVALID_HANDLE;
    if (dead_handle(stream->ctx, stream->generation)) return CUDA_ERROR_INVALID_HANDLE;
    stream->generation = STREAM_DESTROYED;
    return CUDA_SUCCESS;
}

/* A created stream's own context, whichever is current; a default stream is the current
 * context's (the primary when none is). */
EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx) {
    if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (is_default(stream)) {
        *ctx = owning_context();
        return CUDA_SUCCESS;
    }
    if (dead_handle(stream->ctx, stream->generation)) return CUDA_ERROR_INVALID_HANDLE;
    *ctx = stream->ctx;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCtx_ptsz(CUstream stream, CUcontext *ctx) {
    return cuStreamGetCtx(stream, ctx);
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    CUstream st = resolve(stream);
    if (dead_handle(st->ctx, st->generation)) return CUDA_ERROR_INVALID_HANDLE;
    if (legacy_use_forbidden(stream)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (capture_forbids_call()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_stream(resolve(stream));
    pools_synchronized();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
    return cuStreamSynchronize(per_thread(stream));
}

static _Thread_local unsigned long capture_queries;

/* Test hook: how many times the calling thread asked for the capture state (a program's
 * launching thread: what its launches asked, not what other threads did). */
EXPORT unsigned long qshare_fake_capture_queries(void) { return capture_queries; }

/* QSHARE_FAKE_CAPTURE_QUERY_DELAY_MS: the first answer to a thread in thread-local capture
 * mode (an interposer's completion thread) is held that long after it was read, so that a test
 * can begin a capture between that question and the recording that follows it. */
static void delay_first_completion_query(void) {
    static _Atomic int delayed;
    const char *ms = getenv("QSHARE_FAKE_CAPTURE_QUERY_DELAY_MS");
    if (ms == NULL || thread_capture_mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
        atomic_exchange(&delayed, 1))
        return;
    sleep_until_ns(now_ns() + strtoull(ms, NULL, 10) * 1000000ull);
}

/* Asked of the legacy stream while a blocking stream is captured: the driver's error, which
 * invalidates nothing. */
EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status) {
    capture_queries++;
    CUstream st = resolve(stream);
    if (st == NULL || dead_handle(st->ctx, st->generation)) return CUDA_ERROR_INVALID_HANDLE;
    if ((stream == NULL || stream == CU_STREAM_LEGACY) && blocking_captures(0))
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    *status = atomic_load(&st->capture);
    delay_first_completion_query();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream stream, int *status) {
    return cuStreamIsCapturing(per_thread(stream), status);
}

/* A capture into a created stream (the default streams cannot be captured). */
EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_default(stream))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUgraph graph = NULL;
    if (cuGraphCreate(&graph, 0) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&streams_lock);
    int idle = atomic_load(&stream->capture) == CU_STREAM_CAPTURE_STATUS_NONE;
    if (idle) {
        stream->captured = graph;
        graph = NULL;
        stream->capture_mode = mode;
        stream->capturer = pthread_self();
        atomic_store(&stream->capture, CU_STREAM_CAPTURE_STATUS_ACTIVE);
        atomic_fetch_add(&captures_under_way, 1);
    }
    pthread_mutex_unlock(&streams_lock);
    if (graph != NULL) cuGraphDestroy(graph);
    return idle ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}

/* The captured graph, or CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (no graph) when a forbidden
 * call broke the capture. */
EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    if (graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    *graph = NULL;
    CUstream st = resolve(stream);
    pthread_mutex_lock(&streams_lock);
    int status = atomic_exchange(&st->capture, CU_STREAM_CAPTURE_STATUS_NONE);
    if (status != CU_STREAM_CAPTURE_STATUS_NONE) atomic_fetch_sub(&captures_under_way, 1);
    CUgraph captured = st->captured;
    st->captured = NULL;
    pthread_mutex_unlock(&streams_lock);
    if (status == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
    if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        if (captured != NULL) cuGraphDestroy(captured);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph = captured;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (mode == NULL || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL ||
        *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static _Atomic long live_events;
static _Atomic unsigned long created_events;

/* Test hook: how many events were ever created. */
EXPORT unsigned long qshare_fake_events_created(void) { return atomic_load(&created_events); }

/* Test hook: how many events exist (created and not destroyed), the program's and the
 * interposer's. */
EXPORT unsigned long qshare_fake_live_events(void) {
    return (unsigned long)atomic_load(&live_events);
}

EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags) {
    *event = calloc(1, sizeof **event);
    if (*event == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    (*event)->timed = (flags & CU_EVENT_DISABLE_TIMING) == 0;
    (*event)->ctx = owning_context();
    (*event)->generation = atomic_load(&(*event)->ctx->generation);
    atomic_fetch_add(&live_events, 1);
    atomic_fetch_add(&created_events, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent event) {
    if (event == NULL || dead_handle(event->ctx, event->generation)) return CUDA_ERROR_INVALID_HANDLE;
    atomic_fetch_sub(&live_events, 1);
    free(event);
    return CUDA_SUCCESS;
}

/* ---- page-locked host memory and stream memory operations ---- */
#define REGISTERED_MAX 16
static pthread_mutex_t registered_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t from, to;
} registered[REGISTERED_MAX];

static int registered_slot(uintptr_t address) {
    for (int i = 0; i < REGISTERED_MAX; i++)
        if (registered[i].from <= address && address < registered[i].to) return i;
    return -1;
}

/* QSHARE_FAKE_NO_HOST_REGISTER=1 makes registration fail, as on a system that cannot pin. */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags) {
    (void)flags;
    const char *refuse = getenv("QSHARE_FAKE_NO_HOST_REGISTER");
    if (refuse != NULL && strcmp(refuse, "1") == 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (p == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&registered_lock);
    int free_slot = -1;
    for (int i = 0; i < REGISTERED_MAX && free_slot < 0; i++)
        if (registered[i].to == 0) free_slot = i;
    if (free_slot >= 0) {
        registered[free_slot].from = (uintptr_t)p;
        registered[free_slot].to = (uintptr_t)p + bytes;
    }
    pthread_mutex_unlock(&registered_lock);
    return free_slot >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Registered memory only; its device address is its host address (unified addressing). A
 * refusal leaves *dptr as it was, as the real driver does. */
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags) {
    if (dptr == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&registered_lock);
    int slot = registered_slot((uintptr_t)p);
    pthread_mutex_unlock(&registered_lock);
    if (slot < 0) return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* Only the equality wait, the one the interposer uses; the word must be registered. */
EXPORT CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, uint32_t value,
                                       unsigned int flags) {
    if (flags != CU_STREAM_WAIT_VALUE_EQ) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&registered_lock);
    int slot = registered_slot((uintptr_t)addr);
    pthread_mutex_unlock(&registered_lock);
    if (slot < 0 || addr % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
    const _Atomic uint32_t *word = (const _Atomic uint32_t *)(uintptr_t)addr;
    return submit(stream, (op){.kind = OP_WAIT, .word = word, .value = value});
}

/* Test hook: how many kernels the device has run to their end so far. */
EXPORT unsigned long qshare_fake_kernels_done(void) {
    return atomic_load(&kernels_done);
}

static _Atomic unsigned long event_records;

/* Test hook: how many events were recorded so far (by the program and the interposer). */
EXPORT unsigned long qshare_fake_event_records(void) {
    return atomic_load(&event_records);
}

static _Atomic unsigned long cross_context_records;

/* Test hook: how many event records were refused because the event and the stream belong to
 * different contexts. */
EXPORT unsigned long qshare_fake_cross_context_records(void) {
    return atomic_load(&cross_context_records);
}

/* An event is recorded only into a stream of its own context, as the real driver requires: a
 * created stream's context is its own; the default streams (one shared stream here) are taken
 * as the current context's. */
static int other_context(CUevent event, CUstream stream) {
    if (event->ctx == (is_default(stream) ? owning_context() : stream->ctx)) return 0;
    atomic_fetch_add(&cross_context_records, 1);
    return 1;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
    if (event == NULL || dead_handle(event->ctx, event->generation)) return CUDA_ERROR_INVALID_HANDLE;
    if (other_context(event, stream)) return CUDA_ERROR_INVALID_HANDLE;
    atomic_fetch_add(&event_records, 1);
    atomic_store(&event->state, EV_PENDING);
    CUresult rc = submit(stream, (op){.kind = OP_EVENT, .event = event});
    if (rc != CUDA_SUCCESS) atomic_store(&event->state, EV_NEVER);
    return rc;
}
EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
    return cuEventRecord(event, per_thread(stream));
}

EXPORT CUresult cuEventQuery(CUevent event) {
    if (event == NULL || dead_handle(event->ctx, event->generation)) return CUDA_ERROR_INVALID_HANDLE;
    if (capture_forbids_call()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return atomic_load(&event->state) == EV_PENDING ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent event) {
    if (event == NULL || dead_handle(event->ctx, event->generation)) return CUDA_ERROR_INVALID_HANDLE;
    if (capture_forbids_call()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&done_lock);
    while (atomic_load(&event->state) == EV_PENDING) pthread_cond_wait(&done_cond, &done_lock);
    pthread_mutex_unlock(&done_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (start == NULL || end == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (dead_handle(start->ctx, start->generation) || dead_handle(end->ctx, end->generation))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!start->timed || !end->timed) return CUDA_ERROR_INVALID_HANDLE;
    if (atomic_load(&start->state) != EV_DONE || atomic_load(&end->state) != EV_DONE)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(end->time_ns - start->time_ns) / 1e6);
    return CUDA_SUCCESS;
}

/* ---- memory: address space and a count against the card's total ---- */
static _Atomic uint64_t used_bytes;
static _Atomic uint64_t next_address = 0x100000000ull;
static _Atomic uint64_t next_handle = 1;
static _Atomic CUmemGenericAllocationHandle spare_handle; /* cuMemRelease's, for a reuse */

typedef struct allocation {
    uint64_t key;
    uint64_t bytes;
    CUmemoryPool pool; /* a stream-ordered allocation's pool, else NULL */
    struct allocation *next;
} allocation;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUmemPoolHandle_st the_pool; /* the device's default (and current) pool */
/* With QSHARE_FAKE_ASYNC_OTHER_POOL set, cuMemAllocAsync takes from this pool instead, while
 * cuDeviceGetMemPool still answers the_pool: as for a stream of another device, whose current
 * pool is not the current context's device's. */
static struct CUmemPoolHandle_st other_pool;
static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static allocation *allocations;

static CUresult take(uint64_t bytes) {
    uint64_t total = fake_gpu_mem_of(simulated(owning_context()->device));
    uint64_t used = atomic_load(&used_bytes);
    do {
        if (bytes > total - used) return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!atomic_compare_exchange_weak(&used_bytes, &used, used + bytes));
    return CUDA_SUCCESS;
}

static CUresult remember(uint64_t key, uint64_t bytes, CUmemoryPool pool) {
    allocation *a = malloc(sizeof *a);
    if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *a = (allocation){key, bytes, pool, NULL};
    pthread_mutex_lock(&alloc_lock);
    a->next = allocations;
    allocations = a;
    pthread_mutex_unlock(&alloc_lock);
    return CUDA_SUCCESS;
}

static CUresult forget(uint64_t key) {
    pthread_mutex_lock(&alloc_lock);
    allocation **p = &allocations;
    while (*p != NULL && (*p)->key != key) p = &(*p)->next;
    allocation *a = *p;
    if (a != NULL) *p = a->next;
    pthread_mutex_unlock(&alloc_lock);
    if (a == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (a->pool != NULL) { /* back into its pool, which keeps it */
        pthread_mutex_lock(&pool_lock);
        a->pool->in_use -= a->bytes;
        pthread_mutex_unlock(&pool_lock);
    } else {
        atomic_fetch_sub(&used_bytes, a->bytes);
    }
    free(a);
    return CUDA_SUCCESS;
}

/* The pool gives back to the device what it holds unused beyond `keep`. */
static void pool_release(CUmemoryPool pool, uint64_t keep) {
    pthread_mutex_lock(&pool_lock);
    uint64_t floor = keep > pool->in_use ? keep : pool->in_use;
    if (pool->reserved > floor) {
        atomic_fetch_sub(&used_bytes, pool->reserved - floor);
        pool->reserved = floor;
    }
    pthread_mutex_unlock(&pool_lock);
}

/* At a synchronization: a pool holding more than its release threshold gives back the rest. */
static void pools_synchronized(void) {
    pool_release(&the_pool, the_pool.threshold);
    pool_release(&other_pool, other_pool.threshold);
}

/* From what `pool` holds unused first, then from the device. With QSHARE_FAKE_POOL_NO_REUSE
 * set, never from what it holds: a pool whose kept memory cannot serve the allocation (kept in
 * pieces too small, or for another stream). */
static CUresult pool_take(CUmemoryPool pool, uint64_t bytes) {
    int reuse = getenv("QSHARE_FAKE_POOL_NO_REUSE") == NULL;
    pthread_mutex_lock(&pool_lock);
    uint64_t idle = reuse ? pool->reserved - pool->in_use : 0;
    uint64_t more = bytes > idle ? bytes - idle : 0;
    CUresult rc = take(more);
    if (rc == CUDA_SUCCESS) {
        pool->reserved += more;
        pool->in_use += bytes;
    }
    pthread_mutex_unlock(&pool_lock);
    return rc;
}

static void pool_untake(CUmemoryPool pool, uint64_t bytes) {
    pthread_mutex_lock(&pool_lock);
    pool->in_use -= bytes;
    pthread_mutex_unlock(&pool_lock);
}

/* QSHARE_FAKE_POOL_ALLOC_DELAY_MS: a stream-ordered allocation returns that long after its pool
 * grew for it, so that a test can have two threads' allocations both grow the pool before
 * either is answered. */
static void delay_pool_answer(void) {
    const char *ms = getenv("QSHARE_FAKE_POOL_ALLOC_DELAY_MS");
    if (ms != NULL) sleep_until_ns(now_ns() + strtoull(ms, NULL, 10) * 1000000ull);
}

/* QSHARE_FAKE_FREE_DELAY_MS: a stream-ordered free returns that long after its memory went back
 * to the pool, and the pool's next allocation gets the freed address, as the real pool hands it
 * out again; a test can allocate on another thread in between. */
static _Atomic CUdeviceptr spare_address;

static void delay_free_answer(CUdeviceptr freed) {
    const char *ms = getenv("QSHARE_FAKE_FREE_DELAY_MS");
    if (ms == NULL) return;
    atomic_store(&spare_address, freed);
    sleep_until_ns(now_ns() + strtoull(ms, NULL, 10) * 1000000ull);
}

/* Device memory, or with `pool` a stream-ordered allocation from that pool. */
static CUresult alloc_address(CUdeviceptr *dptr, uint64_t bytes, CUmemoryPool pool) {
    if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    if (dptr == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = pool != NULL ? pool_take(pool, bytes) : take(bytes);
    if (rc != CUDA_SUCCESS) return rc;
    uint64_t span = (bytes + 0xfffffu) & ~0xfffffull;
    CUdeviceptr reused = pool != NULL ? atomic_exchange(&spare_address, 0) : 0;
    *dptr = reused != 0 ? reused : atomic_fetch_add(&next_address, span + 0x100000u);
    rc = remember(*dptr, bytes, pool);
    if (rc != CUDA_SUCCESS && pool != NULL) pool_untake(pool, bytes);
    else if (rc != CUDA_SUCCESS) atomic_fetch_sub(&used_bytes, bytes);
    if (rc == CUDA_SUCCESS && pool != NULL) delay_pool_answer();
    return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    return alloc_address(dptr, bytes, NULL);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int element_size) {
    (void)element_size;
    *pitch = (width + 511u) & ~(size_t)511u;
    return alloc_address(dptr, (uint64_t)*pitch * height, NULL);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    (void)flags;
    return alloc_address(dptr, bytes, NULL);
}

static int free_graph_alloc(CUdeviceptr dptr);

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    return free_graph_alloc(dptr) ? CUDA_SUCCESS : forget(dptr);
}

/* The graph a created stream is being captured into, or NULL. */
static CUgraph capture_graph(CUstream stream) {
    if (is_default(stream) || atomic_load(&stream->capture) != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return NULL;
    return stream->captured;
}

/* From `pool`; into a stream being captured, an allocation node of the graph (memory only when
 * it runs). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
    CUgraph graph = capture_graph(stream);
    if (graph == NULL) return alloc_address(dptr, bytes, pool);
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEM_ALLOC_NODE_PARAMS params = {.bytesize = bytes};
    CUresult rc = cuGraphAddMemAllocNode(NULL, graph, NULL, 0, &params);
    if (rc == CUDA_SUCCESS) *dptr = params.dptr;
    return rc;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    int other = getenv("QSHARE_FAKE_ASYNC_OTHER_POOL") != NULL;
    return alloc_async(dptr, bytes, other ? &other_pool : &the_pool, stream);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    return cuMemAllocAsync(dptr, bytes, stream);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
    return pool == NULL ? CUDA_ERROR_INVALID_VALUE : alloc_async(dptr, bytes, pool, stream);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream) {
    return cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}
static int graph_frees(CUgraph graph, CUdeviceptr dptr);

/* QSHARE_FAKE_FREE_ASYNC_FAILS_FROM=N: the Nth stream-ordered free and every later one is
 * refused (CUDA_ERROR_INVALID_HANDLE, as for a stream destroyed meanwhile); cuMemFree still
 * frees. */
static int free_async_refused(void) {
    static _Atomic unsigned long calls;
    const char *from = getenv("QSHARE_FAKE_FREE_ASYNC_FAILS_FROM");
    unsigned long nth = atomic_fetch_add(&calls, 1) + 1;
    return from != NULL && nth >= strtoul(from, NULL, 10);
}

/* Into a stream being captured: a free node (of the graph's own allocation, which the graph
 * then frees itself; others are not modelled). */
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    if (free_async_refused()) return CUDA_ERROR_INVALID_HANDLE;
    CUgraph graph = capture_graph(stream);
    if (graph != NULL) {
        graph_frees(graph, dptr);
        return CUDA_SUCCESS;
    }
    if (free_graph_alloc(dptr)) return CUDA_SUCCESS;
    CUresult rc = forget(dptr);
    if (rc == CUDA_SUCCESS) delay_free_answer(dptr);
    return rc;
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    return cuMemFreeAsync(dptr, stream);
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    pool_release(pool, keep);
    return CUDA_SUCCESS;
}

enum { ATTR_RELEASE_THRESHOLD = 4, ATTR_RESERVED_MEM_CURRENT = 5, ATTR_USED_MEM_CURRENT = 7 };

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (pool == NULL || value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (attr != ATTR_RELEASE_THRESHOLD) return CUDA_SUCCESS; /* reuse policies: not modelled */
    pthread_mutex_lock(&pool_lock);
    pool->threshold = *(cuuint64_t *)value;
    pthread_mutex_unlock(&pool_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (pool == NULL || value == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_lock);
    uint64_t v = attr == ATTR_RELEASE_THRESHOLD      ? pool->threshold
                 : attr == ATTR_RESERVED_MEM_CURRENT ? pool->reserved
                 : attr == ATTR_USED_MEM_CURRENT     ? pool->in_use
                                                     : UINT64_MAX;
    pthread_mutex_unlock(&pool_lock);
    if (v == UINT64_MAX) return CUDA_ERROR_INVALID_VALUE;
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}

/* Only CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE (17), of a stream-ordered allocation. */
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
    if (data == NULL || attr != 17) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&alloc_lock);
    allocation *a = allocations;
    while (a != NULL && a->key != ptr) a = a->next;
    CUmemoryPool pool = a != NULL ? a->pool : NULL;
    pthread_mutex_unlock(&alloc_lock);
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    *(CUmemoryPool *)data = pool;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *pool = &the_pool;
    return CUDA_SUCCESS;
}

/* The device's current pool (what cuMemAllocAsync takes from): its default one here. */
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    return cuDeviceGetDefaultMemPool(pool, dev);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)prop, (void)flags;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = take(bytes);
    if (rc != CUDA_SUCCESS) return rc;
    CUmemGenericAllocationHandle reused = atomic_exchange(&spare_handle, 0);
    *handle = reused != 0 ? reused : atomic_fetch_add(&next_handle, 1);
    rc = remember(*handle, bytes, NULL);
    if (rc != CUDA_SUCCESS) atomic_fetch_sub(&used_bytes, bytes);
    return rc;
}

/* With QSHARE_FAKE_FREE_DELAY_MS, a release returns that long after the handle was freed, and
 * the next cuMemCreate gets the freed handle (spare_handle), as a driver may hand it out again. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult rc = forget(handle);
    const char *ms = getenv("QSHARE_FAKE_FREE_DELAY_MS");
    if (rc == CUDA_SUCCESS && ms != NULL) {
        atomic_store(&spare_handle, handle);
        sleep_until_ns(now_ns() + strtoull(ms, NULL, 10) * 1000000ull);
    }
    return rc;
}

static CUresult new_array(CUarray *array, uint64_t bytes) {
    CUresult rc = take(bytes);
    if (rc != CUDA_SUCCESS) return rc;
    *array = malloc(sizeof **array);
    if (*array == NULL) {
        atomic_fetch_sub(&used_bytes, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*array)->bytes = bytes;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *d) {
    return new_array(array, (uint64_t)d->Width * (d->Height ? d->Height : 1) * 4u * d->NumChannels);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return new_array(array, (uint64_t)d->Width * (d->Height ? d->Height : 1) *
                                (d->Depth ? d->Depth : 1) * 4u * d->NumChannels);
}

EXPORT CUresult cuArrayDestroy(CUarray array) {
    if (array == NULL) return CUDA_ERROR_INVALID_HANDLE;
    atomic_fetch_sub(&used_bytes, array->bytes);
    free(array);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (current_context == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t total = fake_gpu_mem_of(simulated(current_context->device));
    *free_bytes = (size_t)(total - atomic_load(&used_bytes));
    *total_bytes = (size_t)total;
    return CUDA_SUCCESS;
}

/* ---- graphs: an instantiated graph runs as one kernel of 0 ns ---- */
/* Graph memory, as the real driver keeps it: an allocation node's memory is physically
 * allocated when its executable graph is first launched (or uploaded), from the device's graph
 * memory pool, and stays with the executable graph; destroying it gives the memory back to the
 * pool, which keeps it (counted as the device's) until cuDeviceGraphMemTrim. */
static pthread_mutex_t graph_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t graph_pool_reserved, graph_pool_in_use;

EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    (void)flags;
    *graph = calloc(1, sizeof **graph);
    return *graph != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuGraphDestroy(CUgraph graph) {
    if (graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (CUgraphNode n = graph->nodes, next; n != NULL; n = next) {
        next = n->next;
        if (n->child != NULL) cuGraphDestroy(n->child);
        free(n);
    }
    free(graph);
    return CUDA_SUCCESS;
}

static CUresult add_node(CUgraphNode *out, CUgraph graph, int type, uint64_t bytes, CUgraph child) {
    if (graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUgraphNode n = calloc(1, sizeof *n);
    if (n == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *n = (struct CUgraphNode_st){.type = type, .bytes = bytes, .child = child, .next = graph->nodes};
    graph->nodes = n;
    graph->count++;
    if (out != NULL) *out = n;
    return CUDA_SUCCESS;
}

/* An empty node: it allocates nothing. */
EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                    size_t ndeps) {
    (void)deps, (void)ndeps;
    return add_node(node, graph, NODE_EMPTY, 0, NULL);
}

/* The allocation's address is fixed at the node's creation; no memory is taken yet. */
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                       size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    (void)deps, (void)ndeps;
    if (params == NULL || params->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = add_node(node, graph, NODE_MEM_ALLOC, params->bytesize, NULL);
    uint64_t span = (params->bytesize + 0xfffffu) & ~0xfffffull;
    if (rc == CUDA_SUCCESS) params->dptr = graph->nodes->dptr =
        atomic_fetch_add(&next_address, span + 0x100000u);
    return rc;
}

/* `graph` frees its allocation at `dptr` itself: 0 when it has none there. */
static int graph_frees(CUgraph graph, CUdeviceptr dptr) {
    for (CUgraphNode n = graph->nodes; n != NULL; n = n->next)
        if (n->type == NODE_MEM_ALLOC && n->dptr == dptr && !n->freed)
            return n->freed = 1;
    return 0;
}

/* Only an allocation of the same graph (the real driver also takes others). */
EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                      size_t ndeps, CUdeviceptr dptr) {
    (void)deps, (void)ndeps;
    if (graph == NULL || !graph_frees(graph, dptr)) return CUDA_ERROR_INVALID_VALUE;
    return add_node(node, graph, NODE_MEM_FREE, 0, NULL);
}

/* The child is taken as it is (the real driver clones it); the node owns it from now on. */
EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                         size_t ndeps, CUgraph child) {
    (void)deps, (void)ndeps;
    if (child == NULL) return CUDA_ERROR_INVALID_VALUE;
    return add_node(node, graph, NODE_GRAPH, 0, child);
}

EXPORT CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    if (graph == NULL || count == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (nodes == NULL) {
        *count = graph->count;
        return CUDA_SUCCESS;
    }
    size_t i = 0;
    for (CUgraphNode n = graph->nodes; n != NULL && i < *count; n = n->next) nodes[i++] = n;
    *count = i;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, int *type) {
    if (node == NULL || type == NULL) return CUDA_ERROR_INVALID_VALUE;
    *type = node->type;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    if (node == NULL || p == NULL || node->type != NODE_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->bytesize = (size_t)node->bytes;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph) {
    if (node == NULL || graph == NULL || node->type != NODE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = node->child;
    return CUDA_SUCCESS;
}

static uint64_t graph_alloc_bytes(CUgraph graph) {
    uint64_t sum = 0;
    for (CUgraphNode n = graph != NULL ? graph->nodes : NULL; n != NULL; n = n->next)
        sum += n->type == NODE_GRAPH ? graph_alloc_bytes(n->child) : n->bytes;
    return sum;
}

/* The allocations of `graph` (children included) that it does not free, into `exec`. */
static CUresult keep_unfreed(CUgraphExec exec, CUgraph graph) {
    CUresult rc = CUDA_SUCCESS;
    for (CUgraphNode n = graph->nodes; n != NULL && rc == CUDA_SUCCESS; n = n->next) {
        if (n->type == NODE_GRAPH) rc = keep_unfreed(exec, n->child);
        if (n->type != NODE_MEM_ALLOC || n->freed) continue;
        if (exec->n_kept == sizeof exec->kept_dptr / sizeof exec->kept_dptr[0])
            return CUDA_ERROR_NOT_SUPPORTED;
        exec->kept_dptr[exec->n_kept] = n->dptr;
        exec->kept_bytes[exec->n_kept++] = n->bytes;
    }
    return rc;
}

/* The handle of the executable graph destroyed last, handed out again by the next
 * instantiation, as a driver may reuse a handle (under graph_pool_lock). */
static struct CUgraphExec_st *spare_exec;

static CUgraphExec new_exec(void) {
    pthread_mutex_lock(&graph_pool_lock);
    CUgraphExec exec = spare_exec;
    spare_exec = NULL;
    pthread_mutex_unlock(&graph_pool_lock);
    if (exec == NULL) return calloc(1, sizeof *exec);
    memset(exec, 0, sizeof *exec);
    return exec;
}

static CUresult instantiate(CUgraphExec *exec, CUgraph graph) {
    if (exec == NULL || graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    *exec = new_exec();
    if (*exec == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    (*exec)->graph_bytes = graph_alloc_bytes(graph);
    CUresult rc = keep_unfreed(*exec, graph);
    if (rc != CUDA_SUCCESS) free(*exec);
    return rc;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                            unsigned long long flags) {
    (void)flags;
    return instantiate(exec, graph);
}
/* The CUDA 10 and 11 entry points: an error node and a log buffer. */
EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node,
                                   char *log, size_t log_size) {
    (void)err_node, (void)log, (void)log_size;
    return instantiate(exec, graph);
}
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node,
                                      char *log, size_t log_size) {
    return cuGraphInstantiate(exec, graph, err_node, log, log_size);
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    CUresult rc = instantiate(exec, graph);
    if (params != NULL) params->result_out = rc == CUDA_SUCCESS ? 0 : CUDA_GRAPH_INSTANTIATE_ERROR;
    return rc;
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return cuGraphInstantiateWithParams(exec, graph, params);
}

static graph_alloc *graph_allocs; /* under graph_pool_lock */

/* Under graph_pool_lock: `exec`'s allocations that it does not free now live. */
static void graph_allocs_live(CUgraphExec exec) {
    for (size_t i = 0; i < exec->n_kept; i++) {
        graph_alloc *a = malloc(sizeof *a);
        if (a == NULL) continue; /* a test double's shortcut: it is then freed with its exec */
        *a = (graph_alloc){exec->kept_dptr[i], exec->kept_bytes[i], exec, graph_allocs};
        graph_allocs = a;
    }
}

/* First launch: the graph's allocations are backed, from what the pool holds unused first,
 * then from the device. */
static CUresult back_graph(CUgraphExec exec) {
    pthread_mutex_lock(&graph_pool_lock);
    CUresult rc = CUDA_SUCCESS;
    uint64_t idle = graph_pool_reserved - graph_pool_in_use;
    if (!exec->backed && exec->graph_bytes > idle) rc = take(exec->graph_bytes - idle);
    if (!exec->backed && rc == CUDA_SUCCESS) {
        if (exec->graph_bytes > idle) graph_pool_reserved += exec->graph_bytes - idle;
        graph_pool_in_use += exec->graph_bytes;
        exec->backed = 1;
        graph_allocs_live(exec);
    }
    pthread_mutex_unlock(&graph_pool_lock);
    return rc;
}

/* Its memory goes back to the graph pool, but for its allocations still live. */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
    if (exec == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_pool_lock);
    uint64_t live = 0;
    for (graph_alloc *a = graph_allocs; a != NULL; a = a->next)
        if (a->exec == exec) {
            live += a->bytes;
            a->exec = NULL;
        }
    if (exec->backed) graph_pool_in_use -= exec->graph_bytes - live;
    if (spare_exec == NULL) spare_exec = exec;
    else free(exec);
    pthread_mutex_unlock(&graph_pool_lock);
    /* QSHARE_FAKE_EXEC_DESTROY_DELAY_MS: the destroy returns that long after the handle is free
     * for the next instantiation, so that a test can instantiate in between. */
    const char *ms = getenv("QSHARE_FAKE_EXEC_DESTROY_DELAY_MS");
    if (ms != NULL) sleep_until_ns(now_ns() + strtoull(ms, NULL, 10) * 1000000ull);
    return CUDA_SUCCESS;
}

/* The free of a graph allocation still live (1), or 0 when `dptr` is none. Its memory goes back
 * to the graph pool once its exec is gone (until then the exec holds it). */
static int free_graph_alloc(CUdeviceptr dptr) {
    pthread_mutex_lock(&graph_pool_lock);
    graph_alloc **p = &graph_allocs;
    while (*p != NULL && (*p)->dptr != dptr) p = &(*p)->next;
    graph_alloc *a = *p;
    if (a != NULL) {
        *p = a->next;
        if (a->exec == NULL) graph_pool_in_use -= a->bytes;
    }
    pthread_mutex_unlock(&graph_pool_lock);
    free(a);
    return a != NULL;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    if (exec == NULL) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = back_graph(exec);
    if (rc != CUDA_SUCCESS) return rc;
    return submit(stream, (op){.kind = OP_KERNEL, .duration_ns = exec->duration_ns});
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    return cuGraphLaunch(exec, per_thread(stream));
}
EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream) {
    (void)stream;
    return exec == NULL ? CUDA_ERROR_INVALID_HANDLE : back_graph(exec);
}

/* What the pool holds unused goes back to the device. */
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&graph_pool_lock);
    atomic_fetch_sub(&used_bytes, graph_pool_reserved - graph_pool_in_use);
    graph_pool_reserved = graph_pool_in_use;
    pthread_mutex_unlock(&graph_pool_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value) {
    if (!device_valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_pool_lock);
    uint64_t v = attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT ? graph_pool_reserved
                 : attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT   ? graph_pool_in_use
                                                                : UINT64_MAX;
    pthread_mutex_unlock(&graph_pool_lock);
    if (v == UINT64_MAX) return CUDA_ERROR_INVALID_VALUE;
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}

/* Test hook: the device memory in use, in bytes (allocations and the graph pool's). */
EXPORT unsigned long qshare_fake_device_used(void) { return (unsigned long)atomic_load(&used_bytes); }

EXPORT CUresult cuGetErrorName(CUresult rc, const char **name) {
    *name = rc == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

/* ---- entry points by name, as cuGetProcAddress hands them out ---- */
typedef struct named {
    const char *name;
    void *fn;
} named;

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

#define NAMED(fn) {#fn, (void *)fn}
static const named table[] = {
    NAMED(cuInit), NAMED(cuDriverGetVersion), NAMED(cuDeviceGetCount), NAMED(cuDeviceGet),
    NAMED(cuDeviceGetName), NAMED(cuDeviceGetUuid), NAMED(cuDeviceGetUuid_v2),
    NAMED(cuDeviceTotalMem_v2), NAMED(cuDevicePrimaryCtxRetain),
    NAMED(cuDevicePrimaryCtxRelease_v2), NAMED(cuDevicePrimaryCtxGetState),
    NAMED(cuDevicePrimaryCtxReset),
    NAMED(cuDevicePrimaryCtxReset_v2), NAMED(cuCtxCreate_v2), NAMED(cuCtxDestroy_v2),
    NAMED(cuCtxSetCurrent), NAMED(cuCtxGetCurrent), NAMED(cuCtxGetDevice),
    NAMED(cuCtxSynchronize), NAMED(cuModuleLoadData), NAMED(cuModuleUnload),
    NAMED(cuModuleGetFunction), NAMED(cuLaunchKernel), NAMED(cuLaunchKernel_ptsz),
    NAMED(cuLaunchCooperativeKernel), NAMED(cuLaunchCooperativeKernel_ptsz),
    NAMED(cuLaunchKernelEx), NAMED(cuLaunchKernelEx_ptsz), NAMED(cuLaunchHostFunc),
    NAMED(cuLaunchHostFunc_ptsz), NAMED(cuGraphCreate), NAMED(cuGraphDestroy),
    NAMED(cuGraphInstantiateWithFlags), NAMED(cuGraphInstantiate), NAMED(cuGraphInstantiate_v2),
    NAMED(cuGraphInstantiateWithParams), NAMED(cuGraphInstantiateWithParams_ptsz),
    NAMED(cuGraphAddMemAllocNode), NAMED(cuGraphAddMemFreeNode), NAMED(cuGraphAddChildGraphNode),
    NAMED(cuGraphAddEmptyNode), NAMED(cuGraphGetNodes),
    NAMED(cuGraphNodeGetType), NAMED(cuGraphMemAllocNodeGetParams),
    NAMED(cuGraphChildGraphNodeGetGraph), NAMED(cuGraphUpload), NAMED(cuDeviceGraphMemTrim),
    NAMED(cuDeviceGetGraphMemAttribute), NAMED(cuGraphExecDestroy), NAMED(cuGraphLaunch),
    NAMED(cuGraphLaunch_ptsz), NAMED(cuStreamCreate), NAMED(cuStreamDestroy_v2),
    NAMED(cuStreamSynchronize), NAMED(cuStreamSynchronize_ptsz), NAMED(cuStreamGetCtx),
    NAMED(cuStreamGetCtx_ptsz), NAMED(cuStreamIsCapturing),
    NAMED(cuStreamIsCapturing_ptsz), NAMED(cuStreamBeginCapture_v2), NAMED(cuStreamEndCapture),
    NAMED(cuThreadExchangeStreamCaptureMode), NAMED(cuEventCreate), NAMED(cuEventDestroy_v2),
    NAMED(cuEventRecord), NAMED(cuEventRecord_ptsz), NAMED(cuEventQuery),
    NAMED(cuEventSynchronize), NAMED(cuEventElapsedTime), NAMED(cuMemAlloc_v2),
    NAMED(cuMemAllocPitch_v2), NAMED(cuMemAllocManaged), NAMED(cuMemFree_v2),
    NAMED(cuMemAllocAsync), NAMED(cuMemAllocAsync_ptsz), NAMED(cuMemAllocFromPoolAsync),
    NAMED(cuMemAllocFromPoolAsync_ptsz), NAMED(cuMemFreeAsync), NAMED(cuMemFreeAsync_ptsz),
    NAMED(cuDeviceGetDefaultMemPool), NAMED(cuDeviceGetMemPool), NAMED(cuMemPoolTrimTo), NAMED(cuMemPoolSetAttribute),
    NAMED(cuMemPoolGetAttribute), NAMED(cuPointerGetAttribute), NAMED(cuMemCreate), NAMED(cuMemRelease),
    NAMED(cuArrayCreate_v2), NAMED(cuArray3DCreate_v2), NAMED(cuArrayDestroy),
    NAMED(cuMemGetInfo_v2), NAMED(cuGetErrorName), NAMED(cuGetProcAddress),
    NAMED(cuGetProcAddress_v2),
};

static void *by_name(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, name) == 0) return table[i].fn;
    return NULL;
}

/* The versioned variant a runtime of `version` means by `symbol`. */
static void *lookup(const char *symbol, int version, cuuint64_t flags) {
    char name[128];
    void *fn = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        fn = by_name(name);
    }
    /* CUDA 12 gives cuGraphInstantiate the signature of cuGraphInstantiateWithFlags. */
    if (strcmp(symbol, "cuGraphInstantiate") == 0 && version >= 12000)
        return by_name("cuGraphInstantiateWithFlags");
    int v2_allowed = strcmp(symbol, "cuGetProcAddress") != 0 || version >= 12000;
    if (fn == NULL && v2_allowed) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        fn = by_name(name);
    }
    return fn != NULL ? fn : by_name(symbol);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(symbol, version, flags);
    if (status != NULL)
        *status = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    CUresult rc = cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
    return rc == CUDA_SUCCESS && *pfn == NULL ? CUDA_ERROR_NOT_FOUND : rc;
}

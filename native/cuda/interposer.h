/* interposer.h — internals of libqshare-cuda.so, the LD_PRELOAD interposer that applies
 * the node driver (qshare.h) to unmodified CUDA programs. Only the CUDA/NVML entry
 * points and dlsym are exported; everything declared here is hidden. */
#ifndef QSHARE_INTERPOSER_H
#define QSHARE_INTERPOSER_H

#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_abi.h"
#include "qshare.h"

#define QSC_EXPORT __attribute__((visibility("default")))

/* Every interposed entry point: X(exported name, base name for cuGetProcAddress,
 * library). The wrapper of each is defined in this library under the exported name
 * and calls the real function QSC_REAL(name). */
#define QSC_ENTRIES(X)                                                  \
    X(cuInit, cuInit, CUDA)                                             \
    X(cuGetProcAddress, cuGetProcAddress, CUDA)                         \
    X(cuGetProcAddress_v2, cuGetProcAddress, CUDA)                      \
    X(cuLaunchKernel, cuLaunchKernel, CUDA)                             \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, CUDA)                        \
    X(cuLaunchKernelEx, cuLaunchKernelEx, CUDA)                         \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, CUDA)                    \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, CUDA)       \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, CUDA)  \
    X(cuGraphLaunch, cuGraphLaunch, CUDA)                               \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, CUDA)                          \
    X(cuLaunchHostFunc, cuLaunchHostFunc, CUDA)                         \
    X(cuLaunchHostFunc_ptsz, cuLaunchHostFunc, CUDA)                    \
    X(cuMemAlloc_v2, cuMemAlloc, CUDA)                                  \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, CUDA)                        \
    X(cuMemAllocManaged, cuMemAllocManaged, CUDA)                       \
    X(cuMemFree_v2, cuMemFree, CUDA)                                    \
    X(cuMemAllocAsync, cuMemAllocAsync, CUDA)                           \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, CUDA)                      \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, CUDA)           \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, CUDA)      \
    X(cuMemFreeAsync, cuMemFreeAsync, CUDA)                             \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, CUDA)                        \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, CUDA)                           \
    X(cuMemPoolDestroy, cuMemPoolDestroy, CUDA)                         \
    X(cuMemCreate, cuMemCreate, CUDA)                                   \
    X(cuMemRelease, cuMemRelease, CUDA)                                 \
    X(cuArrayCreate_v2, cuArrayCreate, CUDA)                            \
    X(cuArray3DCreate_v2, cuArray3DCreate, CUDA)                        \
    X(cuArrayDestroy, cuArrayDestroy, CUDA)                             \
    X(cuMemGetInfo_v2, cuMemGetInfo, CUDA)                              \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, CUDA)                      \
    X(cuGraphInstantiate, cuGraphInstantiate, CUDA)                     \
    X(cuGraphInstantiate_v2, cuGraphInstantiate, CUDA)                  \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, CUDA)   \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, CUDA) \
    X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, CUDA) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, CUDA)                     \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, CUDA)                 \
    X(cuCtxDestroy_v2, cuCtxDestroy, CUDA)                              \
    X(cuStreamDestroy_v2, cuStreamDestroy, CUDA)                        \
    X(cuStreamBeginCapture, cuStreamBeginCapture, CUDA)                 \
    X(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, CUDA)            \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, CUDA)              \
    X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, CUDA)         \
    X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, CUDA)   \
    X(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph, CUDA) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, CUDA)           \
    X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, CUDA)        \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, CUDA)       \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, CUDA)    \
    X(nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo, NVML)           \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMemoryInfo_v2, NVML)

/* Driver functions the interposer calls for itself but does not interpose. */
#define QSC_HELPERS(X)                           \
    X(cuCtxGetCurrent, cuCtxGetCurrent, CUDA)    \
    X(cuCtxSetCurrent, cuCtxSetCurrent, CUDA)    \
    X(cuCtxGetDevice, cuCtxGetDevice, CUDA)      \
    X(cuDeviceGetUuid, cuDeviceGetUuid, CUDA)    \
    X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, CUDA) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, CUDA) \
    X(cuEventCreate, cuEventCreate, CUDA)        \
    X(cuEventDestroy_v2, cuEventDestroy, CUDA)   \
    X(cuEventRecord, cuEventRecord, CUDA)        \
    X(cuEventQuery, cuEventQuery, CUDA)          \
    X(cuEventSynchronize, cuEventSynchronize, CUDA) \
    X(cuEventElapsedTime, cuEventElapsedTime, CUDA) \
    X(cuStreamIsCapturing, cuStreamIsCapturing, CUDA) \
    X(cuStreamGetCtx, cuStreamGetCtx, CUDA)      \
    X(cuMemHostRegister_v2, cuMemHostRegister, CUDA) \
    X(cuMemHostGetDevicePointer_v2, cuMemHostGetDevicePointer, CUDA) \
    X(cuStreamWaitValue32_v2, cuStreamWaitValue32, CUDA) \
    X(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode, CUDA) \
    X(cuGraphGetNodes, cuGraphGetNodes, CUDA)    \
    X(cuGraphNodeGetType, cuGraphNodeGetType, CUDA) \
    X(cuGraphMemAllocNodeGetParams, cuGraphMemAllocNodeGetParams, CUDA) \
    X(cuGraphChildGraphNodeGetGraph, cuGraphChildGraphNodeGetGraph, CUDA) \
    X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, CUDA) \
    X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, CUDA) \
    X(cuDeviceGetMemPool, cuDeviceGetMemPool, CUDA) \
    X(cuPointerGetAttribute, cuPointerGetAttribute, CUDA) \
    X(nvmlDeviceGetUUID, nvmlDeviceGetUUID, NVML)

enum qsc_index {
#define QSC_ENUM(name, base, lib) QSC_##name,
    QSC_ENTRIES(QSC_ENUM) QSC_N_WRAPPED,
    QSC_HELPERS_START = QSC_N_WRAPPED - 1,
    QSC_HELPERS(QSC_ENUM) QSC_N_ALL
#undef QSC_ENUM
};

/* ---- the interposed entry points, as the driver and NVML declare them ---- */
CUresult cuInit(unsigned int flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);
#define QSC_LAUNCH_KERNEL_ARGS                                                           \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params
CUresult cuLaunchKernel(QSC_LAUNCH_KERNEL_ARGS, void **extra);
CUresult cuLaunchKernel_ptsz(QSC_LAUNCH_KERNEL_ARGS, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                               void **extra);
CUresult cuLaunchCooperativeKernel(QSC_LAUNCH_KERNEL_ARGS);
CUresult cuLaunchCooperativeKernel_ptsz(QSC_LAUNCH_KERNEL_ARGS);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *user_data);
CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void *user_data);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int element_size);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                      CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc);
CUresult cuArrayDestroy(CUarray array);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log,
                            size_t log_size);
CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node, char *log,
                               size_t log_size);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *params);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuDeviceGraphMemTrim(CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamBeginCapture(CUstream stream);
CUresult cuStreamBeginCapture_ptsz(CUstream stream);
CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const void *dependencies,
                                     const void *edge_data, size_t count,
                                     CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                          const void *dependencies, const void *edge_data,
                                          size_t count, CUstreamCaptureMode mode);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);

/* Signatures of the helpers the interposer calls. */
typedef CUresult (*qsc_ctx_get_current_fn)(CUcontext *ctx);
typedef CUresult (*qsc_ctx_set_current_fn)(CUcontext ctx);
typedef CUresult (*qsc_stream_get_ctx_fn)(CUstream stream, CUcontext *ctx);
typedef CUresult (*qsc_ctx_get_device_fn)(CUdevice *dev);
typedef CUresult (*qsc_device_get_uuid_fn)(CUuuid *uuid, CUdevice dev);
typedef CUresult (*qsc_event_create_fn)(CUevent *event, unsigned int flags);
typedef CUresult (*qsc_event_fn)(CUevent event);
typedef CUresult (*qsc_event_record_fn)(CUevent event, CUstream stream);
typedef CUresult (*qsc_event_elapsed_fn)(float *ms, CUevent start, CUevent end);
typedef CUresult (*qsc_stream_is_capturing_fn)(CUstream stream, int *status);
typedef nvmlReturn_t (*qsc_nvml_get_uuid_fn)(nvmlDevice_t device, char *uuid, unsigned int len);

/* ---- real symbols (real.c) ---- */
/* Real function pointers, resolved once by qsc_resolve(); NULL where the library lacks one. */
extern void *qsc_real_table[QSC_N_ALL];
/* Load libcuda.so.1 and libnvidia-ml.so.1 (if present) and resolve every entry; idempotent. */
void qsc_resolve(void);
#define QSC_REAL(type, name) ((type)qsc_real_table[QSC_##name])

/* ---- the memory limit (memory.c) ---- */
/* Reserve `bytes` against the vGPU's limit (CUDA_ERROR_OUT_OF_MEMORY and an oom event when over
 * it), and give a reservation back. */
CUresult qsc_mem_reserve(uint64_t bytes);
void qsc_mem_release(uint64_t bytes);

/* ---- memory pools' cached memory (pool_mem.c) ---- */
/* Before a stream-ordered allocation of `bytes` from `pool`: how much of it the memory the pool
 * keeps (reserved, freed into it) serves, counted live at once; the rest is to reserve. */
uint64_t qsc_pool_draw(CUmemoryPool pool, uint64_t bytes);
/* The allocation failed, or came from another pool: what was drawn goes back to the pool. */
void qsc_pool_undraw(CUmemoryPool pool, uint64_t drawn);
/* A stream-ordered allocation of `bytes` from `pool`, `drawn` of it from what the pool keeps and
 * the rest reserved: its reservation now goes with the pool, topped up to what the pool holds.
 * CUDA_ERROR_OUT_OF_MEMORY when the pool grew past the limit (the caller frees the allocation);
 * CUDA_ERROR_NOT_FOUND when it cannot be recorded (then it is an ordinary allocation). */
CUresult qsc_pool_allocated(CUmemoryPool pool, uint64_t bytes, uint64_t drawn);
/* An allocation refused after the pool had grown for it: the pool gives back what it holds
 * beyond what is reserved for it (what it can: memory whose free has not run stays). */
void qsc_pool_trim_unreserved(CUmemoryPool pool);
/* An allocation from `pool` that `drawn` of its kept memory and `reserved` more were made for
 * was freed back into it untracked (refused after all): what was drawn is kept again, the
 * reservation stays with the pool as kept memory, and the pool is trimmed as above. */
void qsc_pool_returned(CUmemoryPool pool, uint64_t drawn, uint64_t reserved);
/* Such an allocation is freed: its bytes stay reserved while the pool keeps them. */
void qsc_pool_freed(CUmemoryPool pool, uint64_t bytes);
/* 1 when some pool's reservation covers memory freed into it; qsc_pools_settle gives back what
 * the pools no longer hold. */
int qsc_pools_hold_freed(void);
void qsc_pools_settle(void);

/* ---- graph memory (graph_mem.c) ---- */
/* 1 when graph memory that outlived its executable graph is still reserved; qsc_graphs_settle
 * trims the graph memory pools and gives back what they no longer hold. */
int qsc_graphs_hold_residual(void);
void qsc_graphs_settle(void);

/* ---- the vGPUs the process may be served by (vgpu_set.c) ---- */
#define QSC_MAX_VGPUS 64
typedef struct qsc_vgpu_entry {
    uint32_t id;
    int has_card;        /* named with its card (QSHARE_VGPU_<ID>=<UUID>) */
    char bytes[16];      /* the card's UUID */
    char uuid[41];       /* the same as text (QSC_UUID_TEXT_LEN) */
    char var[64];        /* the variable that named it, for messages */
} qsc_vgpu_entry;
typedef struct qsc_vgpu_set {
    qsc_vgpu_entry entries[QSC_MAX_VGPUS];
    int n;
} qsc_vgpu_set;
/* The set from environment `env`: every QSHARE_VGPU_<ID>=<CARD_UUID>, or when there is none
 * QSHARE_VGPU=ID; of two vGPUs on one card, the lower id (said once). 0 after a message
 * naming the variable at fault (a bad id or UUID, an id named twice, QSHARE_VGPU unset or
 * bad). */
int qsc_vgpu_set_read(char *const *env, qsc_vgpu_set *out);
/* CUDA_VISIBLE_DEVICES from environment `env`'s QSHARE_VISIBLE_<INDEX>=<CARD_UUID> cards,
 * in index order, each once, into `out` (visible.c): how many cards, 0 when none is named, -1
 * after a message naming the variable at fault (or when `len` is too short). */
int qsc_visible_compose(char *const *env, char *out, size_t len);
/* The index of the entry on the card with UUID `bytes`; -1 when none is. */
int qsc_vgpu_set_find(const qsc_vgpu_set *set, const char bytes[16]);
/* "vGPU 1 on GPU-..., vGPU 2 on GPU-..." into `out` (truncated to `len`). */
void qsc_vgpu_set_describe(const qsc_vgpu_set *set, char *out, size_t len);

/* ---- the attached process (session.c) ---- */
typedef struct qsc_session {
    qs_client *client; /* NULL when attaching failed: every interposed call fails */
    int low_priority;
    CUresult failure;  /* what interposed calls return when client is NULL */
    char card_uuid[QS_UUID_MAX];
    int card_uuid_valid; /* card_uuid is an NVIDIA GPU UUID we can match devices by */
    int pid;             /* the process that attached (a fork's copy is not it) */
    int deferred;        /* several vGPUs, none bound yet: the first call that needs one binds */
    int multi;           /* bound out of several: work on another card is refused */
    uint32_t vgpu;       /* the vGPU attached to */
} qsc_session;

/* Attach on first use (thread-safe); never NULL. Its `client` may be tested, never used:
 * calls that use the client go through qsc_enter. With several vGPUs, the session stays
 * `deferred` (client NULL) until a call through qsc_enter binds it. */
const qsc_session *qsc_session_get(void);
/* Every use of the client lies between qsc_enter and qsc_leave, so that the detach at a
 * normal exit waits for it. Once the process has begun to detach, qsc_enter returns the
 * detached session (client NULL, failure CUDA_ERROR_DEINITIALIZED). Never NULL; nests.
 * A deferred session is bound here to the vGPU of the current context's card
 * (qsc_enter_on: of `stream`'s context): client NULL with the failure to return when there
 * is no context (CUDA_ERROR_INVALID_CONTEXT) or its card is in no entry (NOT_PERMITTED). */
const qsc_session *qsc_enter(void);
const qsc_session *qsc_enter_on(CUstream stream);
void qsc_leave(const qsc_session *s);
/* A process bound out of several vGPUs: 1 when `ctx` (NULL: none, left to the driver) is on
 * its card, else 0 after a one-time warning naming both cards. Cached per thread by context
 * and its epoch, so a launch asks the driver nothing once its context was seen. */
int qsc_ctx_on_card(const qsc_session *s, CUcontext ctx);
static inline int qsc_ctx_allowed(const qsc_session *s, CUcontext ctx) {
    return !s->multi || qsc_ctx_on_card(s, ctx);
}
/* Start `main(arg)` on a detached thread; if it cannot start, warn (once) that `what` cannot
 * start and return nonzero. */
int qsc_start_thread(void *(*main)(void *), void *arg, const char *what);
/* ---- destroyed contexts and streams (context.c) ---- */
/* Context `ctx`'s epoch: it moves whenever that context is destroyed (cuCtxDestroy,
 * cuDevicePrimaryCtxReset, the release of the primary context's last reference): events the
 * interposer made in it under an earlier epoch died with it, so they are forgotten (never
 * used or destroyed again) and made anew. Other contexts' epochs stay. */
uint64_t qsc_ctx_epoch(CUcontext ctx);
/* The driver drains a context's work in its destroy: an event found dead (its context's epoch
 * moved) may stand for work still running until that call returns. 1 while a destroy of `ctx`
 * (cuCtxDestroy, cuDevicePrimaryCtxReset; or of a context that could not be named, which
 * moved every epoch) is under way; qsc_ctx_wait_destroys waits (futex) until none is, so that
 * the work is not ended (taken out of the window) before it drained. Other contexts' destroys
 * are not waited for. */
int qsc_ctx_destroying(CUcontext ctx);
void qsc_ctx_wait_destroys(CUcontext ctx);
/* The stream a per-thread-default-stream (_ptsz) entry point means by NULL. */
static inline CUstream qsc_per_thread(CUstream stream) {
    return stream == NULL ? CU_STREAM_PER_THREAD : stream;
}
/* A stream the program created (not a default stream): its handle names one stream of one
 * context, whichever context is current. */
static inline int qsc_stream_created(CUstream stream) {
    return stream != NULL && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD;
}
/* The context `stream` belongs to: a created stream's own (cuStreamGetCtx), else, or when the
 * driver cannot say, `current`. */
CUcontext qsc_stream_context(CUstream stream, CUcontext current);
/* Create an event in context `ctx`, made current around the call when another is (an event is
 * recorded only into a stream of its own context); the thread's current context is restored.
 * When the current context cannot be read or `ctx` cannot be made current (it died), no event
 * is made and that error is returned. */
CUresult qsc_event_create_in(CUcontext ctx, CUevent *ev, unsigned int flags);
/* First call of every thread the interposer starts (it waits on events): another thread's
 * graph capture neither forbids those waits nor is invalidated by them. */
void qsc_thread_ignores_captures(void);
/* Set the calling thread's capture mode (cuThreadExchangeStreamCaptureMode) and return the
 * one it had; with no such driver call, nothing changes and `mode` is returned. */
CUstreamCaptureMode qsc_capture_mode(CUstreamCaptureMode mode);
/* 1 when `text` is a whole number written in digits only (no sign, no space: strtoul would
 * take "-N" modulo 2^64) of at most `max`, stored in *out; else 0. Inline: the unit tests
 * build each file alone. */
static inline int qsc_parse_whole(const char *text, unsigned long max, unsigned long *out) {
    if (text == NULL || !isdigit((unsigned char)*text)) return 0;
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || v > max) return 0;
    *out = v;
    return 1;
}
/* Print a message prefixed by "qshare:" once per distinct `key`. */
void qsc_warn_once(int key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
enum {
    QSC_WARN_ATTACH,
    QSC_WARN_UNWRAPPED,
    QSC_WARN_DRIVER,
    QSC_WARN_RING,
    QSC_WARN_EXIT,
    QSC_WARN_CONFIG,
    QSC_WARN_STREAMS,
    QSC_WARN_UNSERVED,  /* a card in no entry of the set */
    QSC_WARN_OTHER_CARD, /* work on a second card of the set */
    QSC_WARN_VISIBLE,    /* a QSHARE_VISIBLE_<INDEX> that CUDA_VISIBLE_DEVICES cannot take */
    QSC_WARN_SHARED_CARD, /* two vGPUs of the set on one card: the lowest id serves */
    QSC_WARN_COUNT
};
/* Map a failing qs_status to the CUresult returned to the program. */
CUresult qsc_cu_status(int qs_status);
/* Bind a deferred session (see qsc_enter_on); the session now in force, never NULL. */
const qsc_session *qsc_bind(CUstream stream);

/* ---- cards (card.c) ---- */
/* 1 if device `dev` is the vGPU's card (or if devices cannot be told apart). */
int qsc_device_is_card(CUdevice dev);
/* The device of context `ctx` (made current for the question when another is). */
CUresult qsc_ctx_device(CUcontext ctx, CUdevice *dev);
/* The device of `stream`'s context (a created stream's own, else the current one);
 * CUDA_ERROR_INVALID_CONTEXT when there is none. */
CUresult qsc_work_device(CUstream stream, CUdevice *dev);
/* Device `dev`'s UUID into `bytes`; 0 when the driver cannot say. */
int qsc_device_uuid(CUdevice dev, char bytes[16]);

/* ---- units of device work (tracker.c) ---- */
/* Before submitting a unit, within qsc_enter (`s`): apply the gate (low priority may block).
 * CUDA_SUCCESS or the error to return without submitting. `*tracked` says whether unit_end
 * must follow. */
CUresult qsc_unit_begin(const qsc_session *s, CUstream stream, int *tracked);
enum {
    QSC_UNIT_NONE = 0,
    QSC_UNIT_EVENT = 1,
    QSC_UNIT_JOINED = 2,
    QSC_UNIT_OPENING = 3,
    QSC_UNIT_BATCHED = 4,
    QSC_UNIT_KINDS
};
/* 1 if `stream` is being captured into a graph (asks the driver, except for the legacy
 * default stream, which cannot be). */
int qsc_stream_capturing(CUstream stream);
/* For a recording into `stream` that no launch of the recording thread just preceded (the
 * completion threads'): 1 unless the driver says it is not being captured. The legacy stream
 * is asked about too: while a stream it waits for (a blocking one) is being captured, the
 * driver answers with an error, and using the legacy stream would invalidate that capture. */
int qsc_stream_unrecordable(CUstream stream);
/* After submitting, within the same qsc_enter: `submitted` is the driver's result. Tracks
 * completion on `stream`. */
void qsc_unit_end(const qsc_session *s, CUstream stream, CUresult submitted, int tracked);

/* ---- captures the program begins (capture.c) ---- */
/* Around the interposer's question whether a stream may be recorded into and the recording
 * itself: no capture can begin meanwhile (every cuStreamBeginCapture* waits). */
void qsc_record_begin(void);
void qsc_record_end(void);
void qsc_captures_forked(void);

/* ---- high priority's coalesced units (hp_unit.c) ---- */
int qsc_hp_coalescable(CUstream stream);
/* Join the open unit on `stream` (1), to be followed by qsc_hp_joined once submitted. */
int qsc_hp_join(CUstream stream);
void qsc_hp_joined(void);
/* Claim the right to open a unit (1); then qsc_hp_opened after the opening launch. */
int qsc_hp_try_open(void);
int qsc_hp_opened(CUstream stream, CUcontext ctx, CUresult submitted);

/* In a child forked from the process (its only thread): the parent's units, fences and
 * completion threads are not the child's (it can neither see them complete nor end them), so
 * each module starts afresh; the parent's events are forgotten, not destroyed. */
void qsc_units_forked(void);
/* Units not ended (at a normal exit, once no call uses the client: their reaper, if it ends
 * them from then on, runs detached and charges nothing). */
uint64_t qsc_units_unended(void);
void qsc_hp_forked(void);
void qsc_lp_forked(void);
/* The program destroys `stream` (before the driver's call, in qsc_enter `s`): work already
 * submitted is fenced while the stream lives, and nothing is recorded into it afterwards. */
void qsc_hp_stream_destroyed(CUstream stream);
void qsc_lp_stream_destroyed(const qsc_session *s, CUstream stream);

/* ---- low priority's launches tracked by batch (lp_batch.c) ---- */
/* Launches a low-priority process may have between begin and end (all paths together). */
#define QSC_LP_MAX_INFLIGHT (1u << 20)
/* Streams tracked by batch at once; launches into more go one unit each (tracker.c). */
#define LP_STREAMS 16u
/* 1 if launches into `stream` are tracked by batch: every stream the process launches into,
 * while fewer than LP_STREAMS are tracked (the first binds the device gate when asked for). A
 * created stream is tracked in its own context (cuStreamGetCtx, asked once when it is bound),
 * whichever is current (`ctx`); the legacy default stream in `ctx`. The batched calls below
 * then apply to that stream, on this thread. */
int qsc_lp_tracks(const qsc_session *s, CUstream stream, CUcontext ctx);
/* Context `ctx` (NULL: every context) is destroyed: its tracked streams die with it. */
void qsc_lp_context_dies(CUcontext ctx);
/* The window, over both paths: 1 when the batched launches in flight (summed over the
 * process's streams) and `units` per-launch units (tracker.c) are estimated under `window_ns`.
 * Else 0: after waiting for the next batch to complete while batched launches are in flight,
 * at once when none are (the caller then waits for a unit). */
int qsc_lp_wait_window(uint64_t window_ns, uint64_t units);
/* Before a batched launch: when nothing is in flight, mark where its batch starts. */
void qsc_lp_opening(const qsc_session *s);
/* After a batched launch into `stream` was submitted: count it (may close a batch). */
void qsc_lp_counted(CUstream stream, uint64_t window_ns);
/* The window in force (device ns), as of the last batch completed. */
uint64_t qsc_lp_window(const qsc_session *s);
/* The device ns per launch as last measured (0 before any), and the window last read. */
uint64_t qsc_lp_estimate_ns(void);
uint64_t qsc_lp_window_now(void);
/* At a normal exit, once no call uses the client (every completion thread that ends launches
 * from then on runs detached and charges nothing): the device ns of the batched launches whose
 * end no completion thread accounted (still queued, or completed and not yet seen), at their
 * stream's estimate (the process's until the stream has one; 0 before any was measured). */
uint64_t qsc_lp_unended_ns(void);

/* ---- low priority's device gate (lp_device_gate.c) ---- */
/* At the first batched launch (its context current): with QSHARE_LP_DEVICE_GATE=1, register
 * the card's gate word with the GPU. 1 when the device gate is on. */
int qsc_dgate_bind(const qsc_session *s);
int qsc_dgate_on(void);
/* After batched launch number `n` into `stream` (counted per stream): once its launches since
 * its last wait (`*since`, that stream's launch count then) are estimated at a slice of device
 * time, enqueue the next wait on the gate word into it. */
void qsc_dgate_after(CUstream stream, _Atomic uint64_t *since, uint64_t n, uint64_t est_ns);

/* ---- statistics for diagnosis (stats.c): on only with QSHARE_STATS_FILE ---- */
extern _Atomic int qsc_stats_on;
/* Read QSHARE_STATS_FILE (at attach); a path that cannot be written is warned about. */
void qsc_stats_init(void);
enum {
    QSC_STAT_FAILED,
    QSC_STAT_LP_FENCE_LAUNCH,
    QSC_STAT_LP_FENCE_TAIL,
    QSC_STAT_LP_FENCE_MARKER,
    QSC_STAT_LP_BATCH_DONE,
    QSC_STAT_LP_WINDOW_WAITS,
    QSC_STAT_LP_WINDOW_WAIT_NS,
    QSC_STAT_HP_FENCES,
    QSC_STAT_LP_GATE_WAITS,
    QSC_STAT_COUNT
};
/* Add `n` to a counter (nothing while statistics are off). */
void qsc_stats_count(int counter, uint64_t n);
/* One launch: its path (QSC_UNIT_*), its result, and where its time went. */
void qsc_stats_launch(int tracked, CUresult rc, uint64_t own_ns, uint64_t driver_ns);

/* A launch's timestamps: entry, just before and just after the driver's call (0: none). */
typedef struct qsc_clock {
    uint64_t entered, before_driver, after_driver;
} qsc_clock;

static inline int qsc_stats_enabled(void) {
    return atomic_load_explicit(&qsc_stats_on, memory_order_relaxed);
}

static inline uint64_t qsc_stamp(void) { return qsc_stats_enabled() ? qs_now_ns() : 0; }

static inline void qsc_stats_timed(const qsc_clock *c, int tracked, CUresult rc) {
    uint64_t driver = c->before_driver ? c->after_driver - c->before_driver : 0;
    qsc_stats_launch(tracked, rc, qs_now_ns() - c->entered - driver, driver);
}

#endif

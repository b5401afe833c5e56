/* memory.c — the vGPU's memory limit on every allocation path, and the memory the
 * program is shown. Each allocation reserves its size against the limit in the
 * segment *before* the driver allocates (atomic check-and-add, so processes racing
 * for the last bytes cannot both win), and is remembered here so that its free
 * returns exactly that size. Over the limit: CUDA_ERROR_OUT_OF_MEMORY, and the
 * driver records an oom event. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "interposer.h"

/* Open-addressing map from an allocation's key (device pointer, VMM handle, array)
 * to its size; linear probing with backward-shift deletion; key 0 is empty. */
typedef struct size_map {
    pthread_mutex_t lock;
    uint64_t *keys;
    uint64_t *sizes;
    size_t cap; /* a power of two, or 0 */
    size_t len;
} size_map;

static size_map pointers = {.lock = PTHREAD_MUTEX_INITIALIZER};
static size_map vmm_handles = {.lock = PTHREAD_MUTEX_INITIALIZER};
static size_map arrays = {.lock = PTHREAD_MUTEX_INITIALIZER};
static size_map pool_of_pointer = {.lock = PTHREAD_MUTEX_INITIALIZER}; /* stream-ordered ones */

static size_t slot_of(const size_map *m, uint64_t key) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & (m->cap - 1);
}

static void insert_unlocked(size_map *m, uint64_t key, uint64_t size) {
    size_t i = slot_of(m, key);
    while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (m->keys[i] == 0) m->len++;
    m->keys[i] = key;
    m->sizes[i] = size;
}

static int grow(size_map *m) {
    size_map bigger = {.cap = m->cap ? m->cap * 2 : 1024};
    bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
    bigger.sizes = calloc(bigger.cap, sizeof *bigger.sizes);
    if (bigger.keys == NULL || bigger.sizes == NULL) {
        free(bigger.keys);
        free(bigger.sizes);
        return 0;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0) insert_unlocked(&bigger, m->keys[i], m->sizes[i]);
    free(m->keys);
    free(m->sizes);
    m->keys = bigger.keys;
    m->sizes = bigger.sizes;
    m->cap = bigger.cap;
    return 1;
}

static int map_put(size_map *m, uint64_t key, uint64_t size) {
    pthread_mutex_lock(&m->lock);
    int ok = (m->len + 1) * 4 <= m->cap * 3 || grow(m);
    if (ok) insert_unlocked(m, key, size);
    pthread_mutex_unlock(&m->lock);
    return ok;
}

/* Remove `key`; its size, or 0 if it was not there. */
static uint64_t map_take(size_map *m, uint64_t key) {
    uint64_t size = 0;
    pthread_mutex_lock(&m->lock);
    if (m->cap != 0 && key != 0) {
        size_t i = slot_of(m, key);
        while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
        if (m->keys[i] == key) {
            size = m->sizes[i];
            m->keys[i] = 0;
            m->len--;
            for (size_t j = (i + 1) & (m->cap - 1); m->keys[j] != 0; j = (j + 1) & (m->cap - 1)) {
                size_t home = slot_of(m, m->keys[j]);
                /* move j back into the hole at i unless its home lies cyclically in (i, j] */
                int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
                if (stays) continue;
                m->keys[i] = m->keys[j];
                m->sizes[i] = m->sizes[j];
                m->keys[j] = 0;
                i = j;
            }
        }
    }
    pthread_mutex_unlock(&m->lock);
    return size;
}

static CUcontext current_context(void) {
    CUcontext ctx = NULL;
    QSC_REAL(qsc_ctx_get_current_fn, cuCtxGetCurrent)(&ctx);
    return ctx;
}

/* 1 when `bytes` more fit under the vGPU's limit as its use stands (or it cannot be read). */
static int room_for(const qsc_session *s, uint64_t bytes) {
    qs_client_info info;
    return qs_client_info_get(s->client, &info) != QS_OK ||
           (info.mem_used <= info.mem_limit && bytes <= info.mem_limit - info.mem_used);
}

/* Memory freed into pools (graph memory pools too) stays reserved while they keep it. */
static int holds_kept(void) { return qsc_pools_hold_freed() || qsc_graphs_hold_residual(); }

/* Give back what the pools no longer keep. 1 (settled). */
static int settle_kept(void) {
    qsc_pools_settle();
    qsc_graphs_settle();
    return 1;
}

/* Settled before a reservation that would not fit, and again when one that seemed to fit is
 * refused: between the look and the reservation, another thread or process may have taken the
 * room, and a reservation refused then, unsettled, was refused although both fit the limit. */
static CUresult reserve(uint64_t bytes) {
    const qsc_session *s = qsc_enter();
    if (s->client == NULL) {
        qsc_leave(s);
        return s->failure;
    }
    if (s->multi && !qsc_ctx_on_card(s, current_context())) { /* no driver call unless multi */
        qsc_leave(s);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    int settled = holds_kept() && !room_for(s, bytes) && settle_kept();
    int rc = qs_mem_reserve(s->client, bytes);
    if (rc == QS_ENOMEM && !settled && holds_kept() && settle_kept())
        rc = qs_mem_reserve(s->client, bytes);
    qsc_leave(s);
    if (rc != QS_OK && rc != QS_ENOMEM)
        qsc_warn_once(QSC_WARN_DRIVER, "memory reservation failed: %s (%s)", qs_strerror(rc),
                      qs_last_error());
    return qsc_cu_status(rc);
}

CUresult qsc_mem_reserve(uint64_t bytes) { return reserve(bytes); }

/* Once the process detached, the owner has taken its reservations back: nothing to release. */
static void release(uint64_t bytes) {
    if (bytes == 0) return;
    const qsc_session *s = qsc_enter();
    if (s->client != NULL) qs_mem_release(s->client, bytes);
    qsc_leave(s);
}

void qsc_mem_release(uint64_t bytes) { release(bytes); }

/* After the driver answered an allocation that `bytes` were reserved for: remember it,
 * or give the reservation back if the driver refused. */
static CUresult settle(CUresult rc, size_map *m, uint64_t key, uint64_t bytes) {
    if (rc != CUDA_SUCCESS || !map_put(m, key, bytes)) release(bytes);
    return rc;
}

#define QSC_RESERVE(bytes)                         \
    do {                                           \
        CUresult reserved_ = reserve(bytes);       \
        if (reserved_ != CUDA_SUCCESS) return reserved_; \
    } while (0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*alloc_pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*alloc_managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle *, size_t,
                                  const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*array_create_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*array3d_create_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult (*array_destroy_fn)(CUarray);
typedef CUresult (*mem_info_fn)(size_t *, size_t *);
typedef CUresult (*total_mem_fn)(size_t *, CUdevice);

QSC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    QSC_RESERVE(bytes);
    CUresult rc = QSC_REAL(alloc_fn, cuMemAlloc_v2)(dptr, bytes);
    return settle(rc, &pointers, rc == CUDA_SUCCESS ? *dptr : 0, bytes);
}

/* The pitch is the driver's choice: reserve the rows unpadded, then settle the padding. */
QSC_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                       size_t height, unsigned int element_size) {
    uint64_t asked = (uint64_t)width * height;
    QSC_RESERVE(asked);
    CUresult rc =
        QSC_REAL(alloc_pitch_fn, cuMemAllocPitch_v2)(dptr, pitch, width, height, element_size);
    if (rc != CUDA_SUCCESS) return settle(rc, &pointers, 0, asked);
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual > asked && reserve(actual - asked) != CUDA_SUCCESS) {
        QSC_REAL(free_fn, cuMemFree_v2)(*dptr);
        release(asked);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return settle(rc, &pointers, *dptr, actual > asked ? actual : asked);
}

QSC_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    QSC_RESERVE(bytes);
    CUresult rc = QSC_REAL(alloc_managed_fn, cuMemAllocManaged)(dptr, bytes, flags);
    return settle(rc, &pointers, rc == CUDA_SUCCESS ? *dptr : 0, bytes);
}

/* After the driver answered the release of `key`, whose size was taken out of `m` before the
 * call (after it, the driver may already have handed the same handle to another thread's
 * allocation): given back, or put back in `m` if the driver refused. */
static CUresult released(CUresult rc, size_map *m, uint64_t key, uint64_t bytes) {
    if (rc == CUDA_SUCCESS) release(bytes);
    else if (bytes != 0) map_put(m, key, bytes);
    return rc;
}

/* An allocation's records (its size; a stream-ordered one's pool), taken out before the driver
 * frees it: once freed, its address may at once be another allocation's (a pool hands it out
 * again), whose records must not be taken for this one's. */
typedef struct recorded {
    uint64_t bytes;
    CUmemoryPool pool;
} recorded;

static recorded take_records(CUdeviceptr dptr) {
    uint64_t bytes = map_take(&pointers, dptr);
    return (recorded){bytes, (CUmemoryPool)(uintptr_t)map_take(&pool_of_pointer, dptr)};
}

/* After the driver answered the free of `dptr`: a stream-ordered allocation's memory goes back to
 * its pool (pool_mem.c), any other's reservation is given back; a refused free leaves the
 * allocation, and its records go back (they fit: they were just taken out). */
static CUresult freed(CUresult rc, CUdeviceptr dptr, recorded r) {
    if (r.pool == NULL) return released(rc, &pointers, dptr, r.bytes);
    if (rc == CUDA_SUCCESS) {
        qsc_pool_freed(r.pool, r.bytes);
    } else {
        if (r.bytes != 0) map_put(&pointers, dptr, r.bytes);
        map_put(&pool_of_pointer, dptr, (uint64_t)(uintptr_t)r.pool);
    }
    return rc;
}

QSC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    recorded r = take_records(dptr);
    return freed(QSC_REAL(free_fn, cuMemFree_v2)(dptr), dptr, r);
}

typedef CUresult (*pointer_attr_fn)(void *, int, CUdeviceptr);
typedef CUresult (*device_pool_fn)(CUmemoryPool *, CUdevice);
#define CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE 17

/* The pool cuMemAllocAsync takes from: the current device's current pool; NULL if unknown. */
static CUmemoryPool current_pool(void) {
    CUdevice dev = 0;
    CUmemoryPool pool = NULL;
    qsc_ctx_get_device_fn get_dev = QSC_REAL(qsc_ctx_get_device_fn, cuCtxGetDevice);
    device_pool_fn get_pool = QSC_REAL(device_pool_fn, cuDeviceGetMemPool);
    if (get_dev == NULL || get_pool == NULL || get_dev(&dev) != CUDA_SUCCESS ||
        get_pool(&pool, dev) != CUDA_SUCCESS)
        return NULL;
    return pool;
}

/* The pool a stream-ordered allocation came from, as the driver says; NULL if it cannot. */
static CUmemoryPool pool_of(CUdeviceptr dptr) {
    CUmemoryPool pool = NULL;
    pointer_attr_fn attr = QSC_REAL(pointer_attr_fn, cuPointerGetAttribute);
    if (attr == NULL || attr(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, dptr) != CUDA_SUCCESS)
        return NULL;
    return pool;
}

/* Free an allocation the program is refused: on its stream, or at once (cuMemFree) when the
 * driver refuses that (a stream destroyed meanwhile, say): left alive, it would stay counted,
 * and held, for good, the program never knowing its address. */
static CUresult free_refused(CUdeviceptr dptr, CUstream stream) {
    CUresult rc = QSC_REAL(free_async_fn, cuMemFreeAsync)(dptr, stream);
    return rc == CUDA_SUCCESS ? rc : QSC_REAL(free_fn, cuMemFree_v2)(dptr);
}

/* The allocation at `dptr` from `pool` is refused after all: freed, its reservation settled, and
 * the pool trimmed of what it holds beyond its reservation. Should the driver refuse both frees,
 * the allocation lives on and stays counted as it is held. */
static CUresult refused_after(CUdeviceptr dptr, CUstream stream, CUmemoryPool pool) {
    recorded r = take_records(dptr);
    freed(free_refused(dptr, stream), dptr, r);
    qsc_pool_trim_unreserved(pool);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The allocation at `dptr` from `pool` (NULL: a pool that cannot be named) is refused before it
 * was recorded, `drawn` of the pool's kept memory and `reserved` more made for it: freed into its
 * pool, which keeps the memory, so both stay with the pool as kept memory (given back as the pool
 * gives it back) and the pool is trimmed to its reservation. Not freed, it stays reserved. */
static CUresult given_back(CUdeviceptr dptr, CUstream stream, CUmemoryPool pool, uint64_t drawn,
                           uint64_t reserved) {
    if (free_refused(dptr, stream) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    if (pool != NULL) qsc_pool_returned(pool, drawn, reserved);
    else release(reserved);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* A stream-ordered allocation came from another pool (`pool`) than `guess`, or failed: what was
 * drawn from `guess` goes back, and a successful one reserves that much more, or is given back
 * into `pool`. */
static CUresult redrawn(CUresult rc, CUdeviceptr dptr, CUmemoryPool pool, uint64_t bytes,
                        CUmemoryPool guess, uint64_t drawn, CUstream stream) {
    qsc_pool_undraw(guess, drawn);
    if (rc != CUDA_SUCCESS) release(bytes - drawn);
    else if (reserve(drawn) != CUDA_SUCCESS) rc = given_back(dptr, stream, pool, 0, bytes - drawn);
    return rc;
}

/* After the driver answered a stream-ordered allocation of `bytes` that `drawn` of the kept
 * memory of `guess` (the pool it was expected from; `named`: the one the program named, so the
 * driver need not be asked) and a reservation of the rest were made for: remember it and tie it
 * to its pool, refusing it after all when the pool grew past the limit. A pool that cannot be
 * named leaves it an ordinary allocation (given back at its free). */
static CUresult pooled(CUresult rc, CUdeviceptr dptr, uint64_t bytes, CUmemoryPool guess,
                       int named, uint64_t drawn, CUstream stream) {
    CUmemoryPool pool = rc != CUDA_SUCCESS ? NULL : named ? guess : pool_of(dptr);
    if (rc != CUDA_SUCCESS || pool != guess) {
        rc = redrawn(rc, dptr, pool, bytes, guess, drawn, stream);
        if (rc != CUDA_SUCCESS) return rc;
        drawn = 0;
    }
    if (!map_put(&pointers, dptr, bytes))
        return given_back(dptr, stream, pool, drawn, bytes - drawn);
    if (pool == NULL) return rc;
    if (!map_put(&pool_of_pointer, dptr, (uint64_t)(uintptr_t)pool)) {
        map_take(&pointers, dptr);
        return given_back(dptr, stream, pool, drawn, bytes - drawn);
    }
    CUresult tied = qsc_pool_allocated(pool, bytes, drawn); /* not found: only when drawn is 0 */
    if (tied == CUDA_ERROR_OUT_OF_MEMORY) return refused_after(dptr, stream, pool);
    if (tied != CUDA_SUCCESS) map_take(&pool_of_pointer, dptr);
    return rc;
}

/* Held from a stream-ordered allocation's driver call until its pool's count was read and its
 * reservation topped up to it: another allocation's growth of the pool in between would be read
 * as this one's, reserved twice, and refuse one of them although both fit the limit. */
static pthread_mutex_t pool_growth_lock = PTHREAD_MUTEX_INITIALIZER;

/* A child forked while another thread allocated has the lock held by no thread of its own. */
static void pool_growth_forked(void) { pthread_mutex_init(&pool_growth_lock, NULL); }

__attribute__((constructor)) static void watch_pool_growth_forks(void) {
    pthread_atfork(NULL, NULL, pool_growth_forked);
}

/* Into a stream being captured, an asynchronous allocation is an allocation node of the graph:
 * nothing is allocated now, and the graph's instantiation reserves it (graph_mem.c). Otherwise
 * what the pool keeps serves it first, and only the rest is reserved before the driver runs;
 * the driver's call and the pool's count after it are taken together (pool_growth_lock). */
#define QSC_ALLOC_ASYNC(type, name, stream, pool, ...)                                   \
    do {                                                                                 \
        qsc_resolve();                                                                   \
        if (qsc_stream_capturing(stream)) return QSC_REAL(type, name)(__VA_ARGS__);      \
        CUmemoryPool from_ = (pool) != NULL ? (CUmemoryPool)(pool) : current_pool();     \
        uint64_t drawn_ = qsc_pool_draw(from_, bytes);                                   \
        CUresult reserved_ = reserve(bytes - drawn_);                                    \
        if (reserved_ != CUDA_SUCCESS) {                                                 \
            qsc_pool_undraw(from_, drawn_);                                              \
            return reserved_;                                                            \
        }                                                                                \
        pthread_mutex_lock(&pool_growth_lock);                                           \
        CUresult rc = QSC_REAL(type, name)(__VA_ARGS__);                                 \
        rc = pooled(rc, rc == CUDA_SUCCESS ? *dptr : 0, bytes, from_, (pool) != NULL,    \
                    drawn_, stream);                                                     \
        pthread_mutex_unlock(&pool_growth_lock);                                         \
        return rc;                                                                       \
    } while (0)

QSC_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    QSC_ALLOC_ASYNC(alloc_async_fn, cuMemAllocAsync, stream, NULL, dptr, bytes, stream);
}

QSC_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    QSC_ALLOC_ASYNC(alloc_async_fn, cuMemAllocAsync_ptsz, qsc_per_thread(stream), NULL, dptr, bytes,
                    stream);
}

QSC_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                            CUstream stream) {
    QSC_ALLOC_ASYNC(alloc_pool_fn, cuMemAllocFromPoolAsync, stream, pool, dptr, bytes, pool,
                    stream);
}

QSC_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                                 CUmemoryPool pool, CUstream stream) {
    QSC_ALLOC_ASYNC(alloc_pool_fn, cuMemAllocFromPoolAsync_ptsz, qsc_per_thread(stream), pool, dptr,
                    bytes, pool, stream);
}

/* A stream-ordered free of a stream-ordered allocation leaves its memory with the pool until
 * the pool gives it back (pool_mem.c). The free of an ordinary allocation gives its bytes back
 * when it is submitted, not when it runs. */
QSC_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    recorded r = take_records(dptr);
    return freed(QSC_REAL(free_async_fn, cuMemFreeAsync)(dptr, stream), dptr, r);
}

QSC_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    recorded r = take_records(dptr);
    return freed(QSC_REAL(free_async_fn, cuMemFreeAsync_ptsz)(dptr, stream), dptr, r);
}

QSC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                                const CUmemAllocationProp *prop, unsigned long long flags) {
    QSC_RESERVE(bytes);
    CUresult rc = QSC_REAL(mem_create_fn, cuMemCreate)(handle, bytes, prop, flags);
    return settle(rc, &vmm_handles, rc == CUDA_SUCCESS ? *handle : 0, bytes);
}

QSC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    uint64_t bytes = map_take(&vmm_handles, handle);
    return released(QSC_REAL(mem_release_fn, cuMemRelease)(handle), &vmm_handles, handle, bytes);
}

static uint64_t element_bytes(int format) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats, and an upper bound for packed ones */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels) {
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * element_bytes(format) * channels;
}

QSC_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    if (desc == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    QSC_RESERVE(bytes);
    CUresult rc = QSC_REAL(array_create_fn, cuArrayCreate_v2)(array, desc);
    return settle(rc, &arrays, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*array : 0, bytes);
}

QSC_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    if (desc == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes =
        array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    QSC_RESERVE(bytes);
    CUresult rc = QSC_REAL(array3d_create_fn, cuArray3DCreate_v2)(array, desc);
    return settle(rc, &arrays, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*array : 0, bytes);
}

QSC_EXPORT CUresult cuArrayDestroy(CUarray array) {
    uint64_t key = (uint64_t)(uintptr_t)array, bytes = map_take(&arrays, key);
    return released(QSC_REAL(array_destroy_fn, cuArrayDestroy)(array), &arrays, key, bytes);
}

/* ---- what the program is shown: the vGPU's limit and its use ---- */

/* A process of several vGPUs bound to none yet sees the real values (asking would bind it). */
static int slice_view(uint64_t *limit, uint64_t *used) {
    if (qsc_session_get()->deferred) return 0;
    const qsc_session *s = qsc_enter();
    qs_client_info info;
    int ok = s->client != NULL && qs_client_info_get(s->client, &info) == QS_OK;
    qsc_leave(s);
    if (!ok) return 0;
    *limit = info.mem_limit;
    *used = info.mem_used < info.mem_limit ? info.mem_used : info.mem_limit;
    return 1;
}

/* The current context's device: a process of several vGPUs binds here, as at a launch. */
QSC_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    const qsc_session *s = qsc_session_get();
    if (s->deferred) s = qsc_bind(NULL);
    if (s->client == NULL) return s->failure;
    size_t real_free = 0, real_total = 0;
    CUresult rc = QSC_REAL(mem_info_fn, cuMemGetInfo_v2)(&real_free, &real_total);
    CUdevice dev = 0;
    uint64_t limit, used;
    if (rc != CUDA_SUCCESS || QSC_REAL(qsc_ctx_get_device_fn, cuCtxGetDevice)(&dev) != CUDA_SUCCESS ||
        !qsc_device_is_card(dev) || !slice_view(&limit, &used)) {
        if (free_bytes != NULL) *free_bytes = real_free;
        if (total_bytes != NULL) *total_bytes = real_total;
        return rc;
    }
    uint64_t slice_free = limit - used;
    if (free_bytes != NULL) *free_bytes = (size_t)(slice_free < real_free ? slice_free : real_free);
    if (total_bytes != NULL) *total_bytes = (size_t)limit;
    return rc;
}

/* Any device, so it binds nothing: a process of several vGPUs asks of every card. */
QSC_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    const qsc_session *s = qsc_session_get();
    if (s->client == NULL && !s->deferred) return s->failure;
    CUresult rc = QSC_REAL(total_mem_fn, cuDeviceTotalMem_v2)(bytes, dev);
    uint64_t limit, used;
    if (rc == CUDA_SUCCESS && bytes != NULL && qsc_device_is_card(dev) && slice_view(&limit, &used))
        *bytes = (size_t)limit;
    return rc;
}

/* NVML: the vGPU's card shows the slice; other cards are shown as they are. */
static int nvml_is_card(nvmlDevice_t device) {
    const qsc_session *s = qsc_session_get();
    if (!s->card_uuid_valid) return 1;
    qsc_nvml_get_uuid_fn get_uuid = QSC_REAL(qsc_nvml_get_uuid_fn, nvmlDeviceGetUUID);
    char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
    if (get_uuid == NULL || get_uuid(device, uuid, sizeof uuid) != NVML_SUCCESS) return 1;
    return strcmp(uuid, s->card_uuid) == 0;
}

QSC_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    typedef nvmlReturn_t (*fn)(nvmlDevice_t, nvmlMemory_t *);
    fn real = QSC_REAL(fn, nvmlDeviceGetMemoryInfo);
    if (real == NULL) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = real(device, memory);
    uint64_t limit, used;
    if (rc == NVML_SUCCESS && nvml_is_card(device) && slice_view(&limit, &used))
        *memory = (nvmlMemory_t){.total = limit, .used = used, .free = limit - used};
    return rc;
}

QSC_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    typedef nvmlReturn_t (*fn)(nvmlDevice_t, nvmlMemory_v2_t *);
    fn real = QSC_REAL(fn, nvmlDeviceGetMemoryInfo_v2);
    if (real == NULL) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = real(device, memory);
    uint64_t limit, used;
    if (rc == NVML_SUCCESS && nvml_is_card(device) && slice_view(&limit, &used)) {
        memory->total = limit;
        memory->reserved = 0;
        memory->used = used;
        memory->free = limit - used;
    }
    return rc;
}

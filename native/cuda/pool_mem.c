/* pool_mem.c — memory pools' cached memory against the vGPU's limit. A stream-ordered free
 * (cuMemFreeAsync, or cuMemFree of such an allocation) gives the memory back to its pool, not to
 * the device: the pool keeps it until a synchronization finds the pool holding more than its
 * release threshold, or until cuMemPoolTrimTo. So a stream-ordered allocation's reservation is
 * tied to its pool, and a pool's reservation is given back only down to what the pool still
 * holds (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), never below its live allocations. The
 * reservations are settled against the pools at each stream-ordered free, at cuMemPoolTrimTo and
 * cuMemPoolDestroy, and before a reservation that would not fit otherwise (docs/driver.md). */
#include <pthread.h>
#include <stdlib.h>

#include "interposer.h"

#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5

typedef CUresult (*pool_attr_fn)(CUmemoryPool, int, void *);
typedef CUresult (*pool_trim_fn)(CUmemoryPool, size_t);
typedef CUresult (*pool_destroy_fn)(CUmemoryPool);

typedef struct pool_rec {
    CUmemoryPool pool;
    uint64_t live;    /* its allocations not yet freed, as reserved */
    uint64_t covered; /* reserved for it: live, and what it keeps of the freed */
    int destroyed;    /* by the program: it gives everything back once nothing is live */
    struct pool_rec *next;
} pool_rec;

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static pool_rec *pools;
static _Atomic uint64_t pools_excess; /* sum of covered - live: a hint read without the lock */

/* Under pools_lock: the record of `pool`, made when `make`; NULL when there is none. */
static pool_rec *record_of(CUmemoryPool pool, int make) {
    pool_rec *r = pools;
    while (r != NULL && r->pool != pool) r = r->next;
    if (r != NULL || !make || (r = calloc(1, sizeof *r)) == NULL) return r;
    r->pool = pool;
    r->next = pools;
    pools = r;
    return r;
}

/* Under pools_lock: give back what `r` covers beyond what its pool holds (and beyond its live
 * allocations). A pool that cannot say what it holds keeps everything reserved. */
static void settle(pool_rec *r) {
    cuuint64_t held = 0;
    pool_attr_fn attr = QSC_REAL(pool_attr_fn, cuMemPoolGetAttribute);
    if (r->destroyed) held = 0;
    else if (attr == NULL || attr(r->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &held) != CUDA_SUCCESS)
        return;
    uint64_t target = held > r->live ? held : r->live;
    if (r->covered <= target) return;
    uint64_t extra = r->covered - target;
    r->covered = target;
    atomic_fetch_sub(&pools_excess, extra);
    qsc_mem_release(extra);
}

/* Under pools_lock: a destroyed pool's record goes once it holds nothing. */
static void drop_if_gone(pool_rec *r) {
    if (!r->destroyed || r->live != 0 || r->covered != 0) return;
    pool_rec **p = &pools;
    while (*p != r) p = &(*p)->next;
    *p = r->next;
    free(r);
}

int qsc_pool_allocated(CUmemoryPool pool, uint64_t bytes) {
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 1);
    if (r != NULL) {
        r->destroyed = 0; /* a new pool given a destroyed one's handle */
        r->live += bytes;
        r->covered += bytes;
    }
    pthread_mutex_unlock(&pools_lock);
    return r != NULL;
}

void qsc_pool_freed(CUmemoryPool pool, uint64_t bytes) {
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 0);
    if (r != NULL) {
        uint64_t freed = bytes < r->live ? bytes : r->live;
        r->live -= freed;
        atomic_fetch_add(&pools_excess, freed);
        settle(r);
        drop_if_gone(r);
    }
    pthread_mutex_unlock(&pools_lock);
    if (r == NULL) qsc_mem_release(bytes);
}

int qsc_pools_hold_freed(void) { return atomic_load(&pools_excess) != 0; }

void qsc_pools_settle(void) {
    pthread_mutex_lock(&pools_lock);
    for (pool_rec *r = pools, *next; r != NULL; r = next) {
        next = r->next;
        settle(r);
        drop_if_gone(r);
    }
    pthread_mutex_unlock(&pools_lock);
}

QSC_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    qsc_resolve();
    pool_trim_fn real = QSC_REAL(pool_trim_fn, cuMemPoolTrimTo);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(pool, keep);
    if (rc == CUDA_SUCCESS) qsc_pools_settle();
    return rc;
}

/* The driver releases a destroyed pool's memory once its allocations are freed. */
QSC_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    qsc_resolve();
    pool_destroy_fn real = QSC_REAL(pool_destroy_fn, cuMemPoolDestroy);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(pool);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 0);
    if (r != NULL) {
        r->destroyed = 1;
        settle(r);
        drop_if_gone(r);
    }
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

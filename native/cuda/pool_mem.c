/* pool_mem.c — memory pools' cached memory against the vGPU's limit. A stream-ordered free
 * (cuMemFreeAsync, or cuMemFree of such an allocation) gives the memory back to its pool, not to
 * the device: the pool keeps it until a synchronization finds the pool holding more than its
 * release threshold, or until cuMemPoolTrimTo. So a stream-ordered allocation's reservation is
 * tied to its pool, and a pool's reservation is given back only down to what the pool still
 * holds (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), never below its live allocations. What a pool
 * keeps serves its next allocations first (the driver hands it out again), so they reserve only
 * the rest, topped up afterwards to what the pool then holds. The reservations are settled
 * against the pools at each stream-ordered free, at cuMemPoolTrimTo and cuMemPoolDestroy, and
 * before a reservation that would not fit otherwise (docs/driver.md). */
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

/* Under pools_lock: `r`'s counts become these, pools_excess (covered beyond live) with them. */
static void set_counts(pool_rec *r, uint64_t live, uint64_t covered) {
    uint64_t before = r->covered - r->live, after = covered - live;
    r->live = live;
    r->covered = covered;
    if (after >= before) atomic_fetch_add(&pools_excess, after - before);
    else atomic_fetch_sub(&pools_excess, before - after);
}

/* What `pool` holds of the device's memory, into `held`; 0 when it cannot say. */
static int pool_holds(CUmemoryPool pool, uint64_t *held) {
    cuuint64_t value = 0;
    pool_attr_fn attr = QSC_REAL(pool_attr_fn, cuMemPoolGetAttribute);
    if (attr == NULL || attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &value) != CUDA_SUCCESS)
        return 0;
    *held = value;
    return 1;
}

/* Under pools_lock: give back what `r` covers beyond what its pool holds (and beyond its live
 * allocations). A pool that cannot say what it holds keeps everything reserved. */
static void settle(pool_rec *r) {
    uint64_t held = 0;
    if (!r->destroyed && !pool_holds(r->pool, &held)) return;
    uint64_t target = held > r->live ? held : r->live;
    if (r->covered <= target) return;
    uint64_t extra = r->covered - target;
    set_counts(r, r->live, target);
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

uint64_t qsc_pool_draw(CUmemoryPool pool, uint64_t bytes) {
    uint64_t drawn = 0;
    if (pool == NULL) return 0;
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 0);
    if (r != NULL && !r->destroyed) {
        uint64_t kept = r->covered - r->live;
        drawn = bytes < kept ? bytes : kept;
        set_counts(r, r->live + drawn, r->covered);
    }
    pthread_mutex_unlock(&pools_lock);
    return drawn;
}

/* `bytes` of `pool`'s live allocations are no more (freed, or drawn for an allocation that did
 * not come): settled against what the pool holds. 0 when the pool has no record. */
static int unlive(CUmemoryPool pool, uint64_t bytes) {
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 0);
    if (r != NULL) {
        set_counts(r, r->live - (bytes < r->live ? bytes : r->live), r->covered);
        settle(r);
        drop_if_gone(r);
    }
    pthread_mutex_unlock(&pools_lock);
    return r != NULL;
}

void qsc_pool_undraw(CUmemoryPool pool, uint64_t drawn) {
    if (pool != NULL && drawn != 0) unlive(pool, drawn);
}

/* Under pools_lock: how much more than `r` covers its pool now holds. */
static uint64_t shortfall(pool_rec *r) {
    uint64_t held = 0;
    return pool_holds(r->pool, &held) && held > r->covered ? held - r->covered : 0;
}

/* The pool grew by more than was reserved for it (its kept memory did not serve the allocation,
 * or served it only in part): reserve the rest. The reservation is made outside pools_lock (a
 * reservation short of room settles the pools, which takes it). */
static CUresult top_up(CUmemoryPool pool, uint64_t more) {
    if (more == 0) return CUDA_SUCCESS;
    if (qsc_mem_reserve(more) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 1);
    if (r != NULL) set_counts(r, r->live, r->covered + more);
    pthread_mutex_unlock(&pools_lock);
    if (r == NULL) qsc_mem_release(more);
    return r != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

void qsc_pool_trim_unreserved(CUmemoryPool pool) {
    pool_trim_fn trim = QSC_REAL(pool_trim_fn, cuMemPoolTrimTo);
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 0);
    if (r != NULL && trim != NULL && trim(pool, r->covered) == CUDA_SUCCESS) settle(r);
    pthread_mutex_unlock(&pools_lock);
}

CUresult qsc_pool_allocated(CUmemoryPool pool, uint64_t bytes, uint64_t drawn) {
    uint64_t more = 0;
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 1);
    if (r != NULL) {
        r->destroyed = 0; /* a new pool given a destroyed one's handle */
        set_counts(r, r->live + bytes - drawn, r->covered + bytes - drawn);
        more = shortfall(r);
    }
    pthread_mutex_unlock(&pools_lock);
    return r == NULL ? CUDA_ERROR_NOT_FOUND : top_up(pool, more);
}

void qsc_pool_returned(CUmemoryPool pool, uint64_t drawn, uint64_t reserved) {
    pthread_mutex_lock(&pools_lock);
    pool_rec *r = record_of(pool, 1);
    if (r != NULL)
        set_counts(r, r->live - (drawn < r->live ? drawn : r->live), r->covered + reserved);
    pthread_mutex_unlock(&pools_lock);
    if (r == NULL) qsc_mem_release(reserved);
    qsc_pool_trim_unreserved(pool);
}

void qsc_pool_freed(CUmemoryPool pool, uint64_t bytes) {
    if (!unlive(pool, bytes)) qsc_mem_release(bytes);
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

/* The driver releases a destroyed pool's memory once its allocations are freed. The destroy
 * runs under pools_lock (it returns at once): a pool created with the same handle right after
 * it is recorded only once this one is marked, never marked destroyed in its place. */
QSC_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    qsc_resolve();
    pool_destroy_fn real = QSC_REAL(pool_destroy_fn, cuMemPoolDestroy);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&pools_lock);
    CUresult rc = real(pool);
    pool_rec *r = rc == CUDA_SUCCESS ? record_of(pool, 0) : NULL;
    if (r != NULL) {
        r->destroyed = 1;
        settle(r);
        drop_if_gone(r);
    }
    pthread_mutex_unlock(&pools_lock);
    return rc;
}

/* context.c — contexts and streams the program destroys. Each context has an epoch that moves
 * when it is destroyed (cuCtxDestroy, a reset of the primary context, the release of its last
 * reference): the interposer's events made in it under an earlier epoch died with it, so they
 * are forgotten (never used or destroyed again) and made anew, while other contexts' events
 * stay in use. Low priority's tracked streams of a dying context, and a destroyed stream, are
 * dropped (lp_batch.c), high priority's fence stops recording into a destroyed stream. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "interposer.h"

#define CTX_EPOCHS 64 /* contexts that have died, each keyed; past it every context moves */

typedef struct ctx_entry {
    _Atomic(CUcontext) ctx; /* appended, never removed: the first NULL ends the table */
    _Atomic uint64_t epoch;
    _Atomic uint32_t destroying; /* its destroys under way (the driver's call) */
} ctx_entry;

static ctx_entry epochs[CTX_EPOCHS];
static _Atomic uint64_t every_epoch; /* moves every context's epoch (table full, unknown one) */
static _Atomic uint32_t every_destroying; /* destroys under way of a context we cannot key */
static _Atomic uint32_t destroys_seq;     /* futex: moves when a destroy returns */
static pthread_mutex_t epochs_lock = PTHREAD_MUTEX_INITIALIZER; /* appending */

/* A child forked while another thread appended has the lock held by no thread of its own, and
 * no destroy under way (the parent's thread making it is not the child's). */
static void epochs_forked(void) {
    pthread_mutex_init(&epochs_lock, NULL);
    for (unsigned i = 0; i < CTX_EPOCHS; i++) atomic_store(&epochs[i].destroying, 0);
    atomic_store(&every_destroying, 0);
}

__attribute__((constructor)) static void watch_forks(void) {
    pthread_atfork(NULL, NULL, epochs_forked);
}

/* The entry of `ctx` if it has one (no lock: entries are appended, never removed). */
static ctx_entry *entry_of(CUcontext ctx) {
    for (unsigned i = 0; i < CTX_EPOCHS; i++) {
        CUcontext known = atomic_load_explicit(&epochs[i].ctx, memory_order_acquire);
        if (known == NULL) break;
        if (known == ctx) return &epochs[i];
    }
    return NULL;
}

uint64_t qsc_ctx_epoch(CUcontext ctx) {
    uint64_t e = atomic_load_explicit(&every_epoch, memory_order_acquire);
    ctx_entry *entry = entry_of(ctx);
    return entry != NULL ? e + atomic_load_explicit(&entry->epoch, memory_order_acquire) : e;
}

/* The entry of `ctx`, appended if new; NULL when the table is full or `ctx` is NULL. */
static ctx_entry *epoch_of(CUcontext ctx) {
    if (ctx == NULL) return NULL;
    pthread_mutex_lock(&epochs_lock);
    ctx_entry *found = NULL;
    for (unsigned i = 0; i < CTX_EPOCHS && found == NULL; i++) {
        CUcontext known = atomic_load(&epochs[i].ctx);
        if (known == NULL) atomic_store(&epochs[i].ctx, ctx);
        if (known == NULL || known == ctx) found = &epochs[i];
    }
    pthread_mutex_unlock(&epochs_lock);
    return found;
}

int qsc_ctx_destroying(CUcontext ctx) {
    if (atomic_load(&every_destroying)) return 1;
    ctx_entry *entry = entry_of(ctx);
    return entry != NULL && atomic_load(&entry->destroying) != 0;
}

void qsc_ctx_wait_destroys(CUcontext ctx) {
    for (;;) {
        uint32_t seq = atomic_load(&destroys_seq);
        if (!qsc_ctx_destroying(ctx)) return;
        qs_futex_wait(&destroys_seq, seq, 0);
    }
}

/* `entry`'s context is destroyed (NULL: one we cannot key, so every context): its epoch moves
 * before the driver's call (events made meanwhile die too) and after it (no event made before
 * is taken for live). */
static void context_dies(ctx_entry *entry) {
    atomic_fetch_add(entry != NULL ? &entry->epoch : &every_epoch, 1);
}

/* Before the driver destroys context `ctx` (NULL: one we cannot name): its events and streams
 * are about to die. */
static void context_dying(CUcontext ctx, ctx_entry *entry) {
    context_dies(entry);
    qsc_lp_context_dies(ctx);
}

/* A destroy under way: from before its context's epoch first moves until the driver's call
 * returned (the driver has then drained the context's work). */
typedef struct destroy_mark {
    ctx_entry *entry;        /* NULL: a context we cannot key */
    _Atomic uint32_t *count; /* its destroys under way */
} destroy_mark;

static destroy_mark destroy_begins(CUcontext ctx) {
    ctx_entry *entry = epoch_of(ctx);
    destroy_mark m = {entry, entry != NULL ? &entry->destroying : &every_destroying};
    atomic_fetch_add(m.count, 1);
    context_dying(ctx, entry);
    return m;
}

static void destroy_ends(destroy_mark m) {
    context_dies(m.entry);
    atomic_fetch_sub(m.count, 1);
    atomic_fetch_add(&destroys_seq, 1);
    qs_futex_wake(&destroys_seq, INT_MAX);
}

QSC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    typedef CUresult (*destroy_fn)(CUcontext);
    qsc_resolve();
    destroy_fn real = QSC_REAL(destroy_fn, cuCtxDestroy_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx == NULL) return real(ctx); /* names no context: the driver refuses it */
    destroy_mark m = destroy_begins(ctx);
    CUresult rc = real(ctx);
    destroy_ends(m);
    return rc;
}

QSC_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    typedef CUresult (*destroy_fn)(CUstream);
    qsc_resolve();
    destroy_fn real = QSC_REAL(destroy_fn, cuStreamDestroy_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return real(stream); /* a default stream: the driver refuses, and it lives on */
    const qsc_session *s = qsc_session_get();
    if (!s->deferred) s = qsc_enter(); /* none bound: nothing of ours is in any stream */
    qsc_hp_stream_destroyed(stream);
    qsc_lp_stream_destroyed(s, stream);
    CUresult rc = real(stream);
    qsc_leave(s);
    return rc;
}

CUcontext qsc_stream_context(CUstream stream, CUcontext current) {
    qsc_stream_get_ctx_fn get = QSC_REAL(qsc_stream_get_ctx_fn, cuStreamGetCtx);
    CUcontext ctx = NULL;
    if (!qsc_stream_created(stream) || get == NULL || get(stream, &ctx) != CUDA_SUCCESS ||
        ctx == NULL)
        return current;
    return ctx;
}

CUresult qsc_event_create_in(CUcontext ctx, CUevent *ev, unsigned int flags) {
    qsc_ctx_set_current_fn set = QSC_REAL(qsc_ctx_set_current_fn, cuCtxSetCurrent);
    CUcontext was = NULL;
    CUresult rc = QSC_REAL(qsc_ctx_get_current_fn, cuCtxGetCurrent)(&was);
    if (rc == CUDA_SUCCESS && was != ctx) rc = set(ctx); /* refused: made in no other context */
    if (rc != CUDA_SUCCESS) return rc;
    rc = QSC_REAL(qsc_event_create_fn, cuEventCreate)(ev, flags);
    if (was != ctx) set(was);
    return rc;
}

typedef CUresult (*primary_reset_fn)(CUdevice);
typedef CUresult (*primary_state_fn)(CUdevice, unsigned int *, int *);

/* 1 if device `dev`'s primary context is active (also when the driver cannot say). */
static int primary_active(CUdevice dev) {
    primary_state_fn state = QSC_REAL(primary_state_fn, cuDevicePrimaryCtxGetState);
    unsigned int flags = 0;
    int active = 1;
    return state == NULL || state(dev, &flags, &active) != CUDA_SUCCESS || active;
}

/* The handle of device `dev`'s primary context while it is active (one retain, given back at
 * once, leaves it as it was); NULL when it cannot be had. */
static CUcontext primary_of(CUdevice dev) {
    typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
    retain_fn retain = QSC_REAL(retain_fn, cuDevicePrimaryCtxRetain);
    primary_reset_fn release = QSC_REAL(primary_reset_fn, cuDevicePrimaryCtxRelease_v2);
    CUcontext ctx = NULL;
    if (retain == NULL || release == NULL || retain(&ctx, dev) != CUDA_SUCCESS) return NULL;
    release(dev);
    return ctx;
}

static CUresult reset_primary(primary_reset_fn real, CUdevice dev) {
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (!primary_active(dev)) return real(dev); /* nothing of ours lives in it */
    CUcontext ctx = primary_of(dev);
    destroy_mark m = destroy_begins(ctx);
    CUresult rc = real(dev);
    destroy_ends(m);
    return rc;
}

/* The release of the primary context's last reference destroys it: known only after the
 * driver's call, from the context's state; its handle is taken before. */
static CUresult release_primary(primary_reset_fn real, CUdevice dev) {
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx = primary_active(dev) ? primary_of(dev) : NULL;
    CUresult rc = real(dev);
    if (rc == CUDA_SUCCESS && !primary_active(dev)) context_dying(ctx, epoch_of(ctx));
    return rc;
}

QSC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    qsc_resolve();
    return release_primary(QSC_REAL(primary_reset_fn, cuDevicePrimaryCtxRelease), dev);
}

QSC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    qsc_resolve();
    return release_primary(QSC_REAL(primary_reset_fn, cuDevicePrimaryCtxRelease_v2), dev);
}

QSC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    qsc_resolve();
    return reset_primary(QSC_REAL(primary_reset_fn, cuDevicePrimaryCtxReset), dev);
}

QSC_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    qsc_resolve();
    return reset_primary(QSC_REAL(primary_reset_fn, cuDevicePrimaryCtxReset_v2), dev);
}

/* hp_unit.c — high priority's launches, coalesced: one open unit covers every launch into
 * one stream until the device has finished all of them. The launching thread only counts
 * (no event, no lock, and no system call unless the driver held its launch while the
 * completion thread waited for it); a completion thread holds one fence event behind
 * the newest covered launch, re-records it while launches keep coming, and ends the unit
 * (qs_launch_end: high priority turns quiet) once the fence completes with nothing after
 * it. So "busy" ends when the work completes, at a cost of one fence per completion round
 * instead of an event per launch. Streams a second thread cannot name (per-thread default
 * streams) and launches into another stream while a unit is open use tracker.c's per-launch
 * units. A fence is re-recorded at most once per QSHARE_HP_FENCE_INTERVAL_US (200 µs unless
 * set; 0: at once), so a host-bound program's launches are not each raced by a driver call
 * on the completion thread, and the unit ends up to one interval after its work completed. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#include "internal.h"
#include "interposer.h"

enum { HP_IDLE = 0, HP_OPENING = 1, HP_OPEN = 2, HP_CLOSING = 3 };

/* The open unit's stream once the program destroyed it: no launch joins it (the driver may
 * hand the same handle to a new stream) and no fence is recorded into it. */
#define STREAM_GONE ((CUstream)(uintptr_t)-1)

static struct {
    _Alignas(64) _Atomic uint32_t state; /* futex: the completion thread sleeps while IDLE */
    _Atomic uint32_t pending;            /* joined launches not yet submitted; futex */
    _Atomic uint32_t joiners_awaited;    /* the completion thread sleeps until `pending` moves */
    _Atomic uint64_t launched;           /* launches into the open unit, counted once submitted */
    _Atomic(CUstream) stream; /* written while OPENING, read by joiners */
    CUcontext ctx;
    CUevent fence;
    uint64_t fence_epoch; /* qsc_ctx_epoch when the fence was made */
    uint64_t covered; /* `launched` as of the fence's last recording */
    uint64_t recorded_ns; /* when the fence was last recorded */
    uint64_t interval_ns; /* QSHARE_HP_FENCE_INTERVAL_US; 0: re-record at once */
    pthread_mutex_t record_lock; /* a recording into `stream` against its destruction */
    _Atomic uint32_t no_thread;  /* the completion thread could not start: no units open */
} hp = {.record_lock = PTHREAD_MUTEX_INITIALIZER};

#define JOIN_SPIN_NS 50000ull /* how long the completion thread yields to a joined launch */
#define FENCE_INTERVAL_MAX_US 100000ul /* a tenth of a second: beyond, release is mostly late */
/* Measured on an H100 (2026-11-24): eager ResNet-50 HP at p50 within 0.7 ms of running without
 * qshare, against 0.9-2.6 ms over at 0; at most 0.2 ms later release per HP request. */
#define FENCE_INTERVAL_DEFAULT_US 200ul

static pthread_once_t hp_once = PTHREAD_ONCE_INIT;

int qsc_hp_coalescable(CUstream stream) {
    return stream != CU_STREAM_PER_THREAD;
}

/* Record the fence, unless `capturing` (qsc_stream_capturing on the launching thread,
 * qsc_stream_unrecordable on the completion thread) says the stream must not be used, or it
 * or the fence was destroyed. */
static CUresult record_fence_locked(int (*capturing)(CUstream)) {
    if (hp.fence_epoch != qsc_ctx_epoch(hp.ctx) || atomic_load(&hp.stream) == STREAM_GONE)
        return CUDA_ERROR_INVALID_HANDLE;
    qsc_record_begin();
    CUresult rc = CUDA_ERROR_NOT_PERMITTED; /* never record into a capture */
    if (!capturing(hp.stream)) {
        if (hp.interval_ns) hp.recorded_ns = qs_now_ns(); /* for pace(): no clock read unpaced */
        rc = QSC_REAL(qsc_event_record_fn, cuEventRecord)(hp.fence, hp.stream);
    }
    qsc_record_end();
    if (rc == CUDA_SUCCESS) qsc_stats_count(QSC_STAT_HP_FENCES, 1);
    return rc;
}

static CUresult record_fence(int (*capturing)(CUstream)) {
    pthread_mutex_lock(&hp.record_lock);
    CUresult rc = record_fence_locked(capturing);
    pthread_mutex_unlock(&hp.record_lock);
    return rc;
}

/* The program destroys `stream`: the fence is not recorded into it again (the unit ends when
 * the fence it has completes), and no launch joins the unit by its handle, which a new stream
 * may get: that stream's launches are units of their own, not taken as covered by this one. */
void qsc_hp_stream_destroyed(CUstream stream) {
    pthread_mutex_lock(&hp.record_lock);
    if (atomic_load(&hp.stream) == stream) atomic_store(&hp.stream, STREAM_GONE);
    pthread_mutex_unlock(&hp.record_lock);
}

/* QSHARE_HP_FENCE_INTERVAL_US in ns: unset or empty is the default; anything but 0..100000
 * is refused with a warning naming it, and the default is used. */
static uint64_t fence_interval_ns(void) {
    const uint64_t fallback = FENCE_INTERVAL_DEFAULT_US * 1000u;
    const char *text = getenv("QSHARE_HP_FENCE_INTERVAL_US");
    if (text == NULL || *text == '\0') return fallback;
    unsigned long us = 0;
    if (!qsc_parse_whole(text, FENCE_INTERVAL_MAX_US, &us)) {
        qsc_warn_once(QSC_WARN_CONFIG,
                      "QSHARE_HP_FENCE_INTERVAL_US='%s' is not a whole number of microseconds "
                      "from 0 to %lu; high priority re-fences every %lu us", text,
                      FENCE_INTERVAL_MAX_US, FENCE_INTERVAL_DEFAULT_US);
        return fallback;
    }
    return (uint64_t)us * 1000u;
}

/* Let launches gather until an interval since the fence was recorded, before it is recorded
 * again or the unit ends (ended, the next launch reopens it with a fence of its own). */
static void pace(void) {
    uint64_t due = hp.recorded_ns + hp.interval_ns, now = qs_now_ns();
    if (hp.interval_ns == 0 || now >= due) return;
    struct timespec left = {.tv_sec = (time_t)((due - now) / 1000000000u),
                            .tv_nsec = (long)((due - now) % 1000000000u)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

/* Try to end the unit: only if no launch is joining or uncounted (the Dekker pair with
 * qsc_hp_join: join raises `pending` then reads `state`; this swaps `state` then reads
 * `pending`). Returns 1 when ended. */
static int try_close(void) {
    uint32_t open = HP_OPEN;
    if (!atomic_compare_exchange_strong(&hp.state, &open, HP_CLOSING)) return 0;
    if (atomic_load(&hp.pending) || atomic_load(&hp.launched) != hp.covered) {
        atomic_store(&hp.state, HP_OPEN);
        return 0;
    }
    atomic_store(&hp.state, HP_IDLE);
    const qsc_session *s = qsc_enter(); /* nothing to end once the process detached */
    if (s->client != NULL) qs_launch_end(s->client);
    qsc_leave(s);
    return 1;
}

/* A joined launch is being submitted: a few instructions away, unless the driver holds it (its
 * queue full), for as long as that lasts. Yield a while, then sleep until `pending` moves (the
 * Dekker pair with qsc_hp_joined: this raises `joiners_awaited`, then reads `pending`; a joiner
 * lowers `pending`, then reads `joiners_awaited`): so only a launch that the driver held, or
 * one that came in that while, makes the wake-up's system call. */
static void wait_for_joiners(void) {
    uint64_t until = qs_now_ns() + JOIN_SPIN_NS;
    while (atomic_load(&hp.pending) && qs_now_ns() < until) sched_yield();
    atomic_store(&hp.joiners_awaited, 1);
    uint32_t pending = atomic_load(&hp.pending);
    if (pending) qs_futex_wait(&hp.pending, pending, 0);
    atomic_store(&hp.joiners_awaited, 0);
}

/* A joined launch stops being pending (submitted, or not joined after all). */
static void joiner_done(void) {
    atomic_fetch_sub(&hp.pending, 1);
    if (atomic_load(&hp.joiners_awaited)) qs_futex_wake(&hp.pending, 1);
}

/* One round: wait for the fence; cover what came after it, or end the unit. */
static void complete_round(void) {
    if (hp.fence_epoch == qsc_ctx_epoch(hp.ctx))
        QSC_REAL(qsc_event_fn, cuEventSynchronize)(hp.fence);
    else /* died with its context: the driver's destroy drains its work */
        qsc_ctx_wait_destroys(hp.ctx);
    pace();
    uint64_t n = atomic_load(&hp.launched);
    if (atomic_load(&hp.pending)) {
        wait_for_joiners();
        return;
    }
    if (n != hp.covered) {
        hp.covered = n;
        if (record_fence(qsc_stream_unrecordable) == CUDA_SUCCESS) return;
        hp.covered = atomic_load(&hp.launched); /* cannot fence (capture): end it as is */
    }
    try_close();
}

static void *completion_main(void *arg) {
    (void)arg;
    qsc_thread_ignores_captures();
    if (hp.interval_ns) prctl(PR_SET_TIMERSLACK, 1000ul); /* pace() sleeps to the microsecond */
    CUcontext current = NULL;
    for (;;) {
        uint32_t st = atomic_load(&hp.state);
        if (st != HP_OPEN) {
            if (st == HP_IDLE || st == HP_OPENING) qs_futex_wait(&hp.state, st, 0);
            continue;
        }
        if (current != hp.ctx) {
            typedef CUresult (*set_fn)(CUcontext);
            QSC_REAL(set_fn, cuCtxSetCurrent)(hp.ctx);
            current = hp.ctx;
        }
        complete_round();
    }
    return NULL;
}

static void start_completion(void) {
    hp.interval_ns = fence_interval_ns();
    if (qsc_start_thread(completion_main, NULL, "the high-priority completion thread; "
                                                "launches are tracked one by one") != 0)
        atomic_store(&hp.no_thread, 1);
}

void qsc_hp_forked(void) {
    atomic_store(&hp.state, HP_IDLE);
    atomic_store(&hp.pending, 0);
    atomic_store(&hp.joiners_awaited, 0);
    atomic_store(&hp.launched, 0);
    atomic_store(&hp.stream, NULL);
    pthread_mutex_init(&hp.record_lock, NULL); /* the parent's threads may have held it */
    hp.ctx = NULL;
    hp.fence = NULL;
    hp.covered = 0;
    atomic_store(&hp.no_thread, 0);
    hp_once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

/* 1 if a launch into `stream` goes into the open unit's stream: a created stream's handle names
 * one stream whichever context is current; the legacy default stream is each context's own,
 * so it is the unit's only while the unit's context is current (one cheap driver call). */
static int unit_stream(CUstream stream) {
    if (hp.stream != stream) return 0;
    if (qsc_stream_created(stream)) return 1;
    CUcontext ctx = NULL;
    QSC_REAL(qsc_ctx_get_current_fn, cuCtxGetCurrent)(&ctx);
    return ctx == hp.ctx;
}

int qsc_hp_join(CUstream stream) {
    if (atomic_load_explicit(&hp.state, memory_order_relaxed) != HP_OPEN || hp.stream != stream)
        return 0; /* cheap miss; the check below is the one that counts */
    atomic_fetch_add(&hp.pending, 1);
    if (atomic_load(&hp.state) == HP_OPEN && unit_stream(stream)) return 1;
    joiner_done();
    return 0;
}

void qsc_hp_joined(void) {
    atomic_fetch_add(&hp.launched, 1);
    joiner_done();
}

int qsc_hp_try_open(void) {
    if (atomic_load_explicit(&hp.no_thread, memory_order_relaxed)) return 0;
    uint32_t idle = HP_IDLE;
    return atomic_compare_exchange_strong(&hp.state, &idle, HP_OPENING);
}

/* After the opening launch was submitted (or failed): arm the fence and hand the unit to
 * the completion thread, or give the slot back. Returns 0 when the unit could not open. */
int qsc_hp_opened(CUstream stream, CUcontext ctx, CUresult submitted) {
    uint64_t epoch = qsc_ctx_epoch(ctx);
    int stale = hp.ctx != ctx || hp.fence == NULL || hp.fence_epoch != epoch;
    if (submitted == CUDA_SUCCESS && stale) {
        /* live by its own context's epoch (not the new one's): a dead one is forgotten */
        if (hp.fence != NULL && hp.fence_epoch == qsc_ctx_epoch(hp.ctx))
            QSC_REAL(qsc_event_fn, cuEventDestroy_v2)(hp.fence);
        hp.fence = NULL;
        hp.ctx = ctx;
        hp.fence_epoch = epoch;
        qsc_event_create_in(ctx, &hp.fence, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
    }
    pthread_mutex_lock(&hp.record_lock);
    atomic_store(&hp.stream, stream);
    pthread_mutex_unlock(&hp.record_lock);
    if (submitted != CUDA_SUCCESS || hp.fence == NULL ||
        record_fence(qsc_stream_capturing) != CUDA_SUCCESS) {
        atomic_store(&hp.state, HP_IDLE);
        return 0;
    }
    atomic_store(&hp.launched, 1);
    hp.covered = 1;
    pthread_once(&hp_once, start_completion);
    if (atomic_load(&hp.no_thread)) { /* nothing would end the unit: the caller ends the launch */
        atomic_store(&hp.state, HP_IDLE);
        return 0;
    }
    atomic_store(&hp.state, HP_OPEN);
    qs_futex_wake(&hp.state, 1);
    return 1;
}

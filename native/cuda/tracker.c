/* tracker.c — units of device work: each launch is bracketed by qs_launch_begin and a
 * qs_launch_end that comes when the work *completes* on the device, seen through an
 * event recorded behind it. So low priority's in-flight bound holds on the device
 * (a suspension drains within about one unit), high priority stays busy until its
 * work is done, and low priority's device time is measured by timing events.
 *
 * Completed units are ended by whoever sees them first: the launching thread (cheap
 * queries, no waiting) or a reaper thread that waits on the oldest event. A launch
 * whose work is already done when recorded is ended inline and touches no ring; a
 * launch that finds the ring busy only appends to it. The reaper is woken (one futex
 * call) only when it sleeps, i.e. after all of the process's work had completed. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "interposer.h"

#define RING_SLOTS 1024u

enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_READY = 2 };
enum { CAPTURE_NONE = 0 };

typedef struct events {
    CUcontext ctx;
    uint64_t epoch; /* qsc_ctx_epoch when these were made */
    CUevent start; /* low priority only: recorded before the launch, for device time */
    CUevent end;
} events;

typedef struct slot {
    _Atomic uint32_t state;
    events ev;
} slot;

static struct {
    slot ring[RING_SLOTS];
    _Alignas(64) _Atomic uint64_t tail; /* next slot to fill */
    _Alignas(64) _Atomic uint64_t head; /* oldest unit not yet ended */
    _Alignas(64) _Atomic uint32_t reaper_sleeping;
    _Atomic uint32_t wake_seq;
    _Atomic uint32_t no_reaper; /* it could not start: launching threads end their own units */
} tracker;

/* The calling thread's events for the unit it is submitting. */
static _Thread_local events current;
/* The context of the unit the calling thread opens (hp_fast), asked before the launch. */
static _Thread_local CUcontext opening_ctx;
static pthread_once_t reaper_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key; /* its destructor destroys an exiting thread's `current` */
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static CUcontext current_context(void) {
    CUcontext ctx = NULL;
    QSC_REAL(qsc_ctx_get_current_fn, cuCtxGetCurrent)(&ctx);
    return ctx;
}

/* The context a launch into `stream` runs in: a created stream's own (one cuStreamGetCtx),
 * else (a default stream, or when the driver cannot say) the current one. */
static CUcontext context_of(CUstream stream) {
    CUcontext own = qsc_stream_context(stream, NULL);
    return own != NULL ? own : current_context();
}

/* Destroy `ev`'s events, or forget them if they died with their context. */
static void destroy_events(events *ev) {
    qsc_event_fn destroy = QSC_REAL(qsc_event_fn, cuEventDestroy_v2);
    int live = ev->epoch == qsc_ctx_epoch(ev->ctx);
    if (live && ev->start != NULL) destroy(ev->start);
    if (live && ev->end != NULL) destroy(ev->end);
    ev->start = ev->end = NULL;
}

/* A thread that made units exits: its events are idle (their units ended, or they are a
 * slot's spares), and nothing else can reach them; destroy them in their context. */
static void drop_thread_events(void *arg) {
    events *ev = arg;
    typedef CUresult (*set_fn)(CUcontext);
    CUcontext was = current_context();
    if (was != ev->ctx) QSC_REAL(set_fn, cuCtxSetCurrent)(ev->ctx);
    destroy_events(ev);
    if (was != ev->ctx) QSC_REAL(set_fn, cuCtxSetCurrent)(was);
}

static void make_exit_key(void) { pthread_key_create(&exit_key, drop_thread_events); }

/* Make `ev` hold events of context `ctx` (the context of the stream they are recorded into:
 * made current for their creation when it is not). The first time a thread has any, they are
 * set to go with the thread when it exits. */
static CUresult prepare_events(events *ev, CUcontext ctx, int timed) {
    uint64_t epoch = qsc_ctx_epoch(ctx);
    if (ev->ctx != ctx || ev->epoch != epoch) {
        destroy_events(ev);
        ev->ctx = ctx;
        ev->epoch = epoch;
    }
    if (ev->end == NULL && ev->start == NULL) {
        pthread_once(&exit_key_once, make_exit_key);
        pthread_setspecific(exit_key, ev);
    }
    unsigned int flags = CU_EVENT_BLOCKING_SYNC | (timed ? 0u : (unsigned)CU_EVENT_DISABLE_TIMING);
    CUresult rc = CUDA_SUCCESS;
    if (ev->end == NULL) rc = qsc_event_create_in(ctx, &ev->end, flags);
    if (rc == CUDA_SUCCESS && timed && ev->start == NULL)
        rc = qsc_event_create_in(ctx, &ev->start, flags);
    return rc;
}

/* Query or wait on one of the interposer's events (`check`), also from a program's thread: in
 * relaxed capture mode for the call, so that no graph capture under way (the thread's own, or
 * another thread's in global mode) forbids it and is invalidated by it; the thread's mode is
 * restored after. */
static CUresult check_event(qsc_event_fn check, CUevent ev) {
    CUstreamCaptureMode was = qsc_capture_mode(CU_STREAM_CAPTURE_MODE_RELAXED);
    CUresult rc = check(ev);
    qsc_capture_mode(was);
    return rc;
}

/* End a unit (`s` from qsc_enter; nothing to end once the process detached). */
static void finish(const qsc_session *s, const events *ev, int completed) {
    if (s->client == NULL) return;
    if (s->low_priority && completed && ev->start != NULL &&
        ev->epoch == qsc_ctx_epoch(ev->ctx)) {
        float ms = 0.0f;
        if (QSC_REAL(qsc_event_elapsed_fn, cuEventElapsedTime)(&ms, ev->start, ev->end) ==
                CUDA_SUCCESS &&
            ms > 0.0f)
            qs_account_device_time(s->client, (uint64_t)((double)ms * 1e6));
    }
    qs_launch_end(s->client);
}

/* End the oldest unit if it has completed (waiting for it when `wait`). 1 if the ring
 * moved, 0 if there was nothing to end. */
static int end_oldest(int wait) {
    uint64_t h = atomic_load(&tracker.head);
    if (h == atomic_load(&tracker.tail)) return 0;
    slot *s = &tracker.ring[h % RING_SLOTS];
    if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_READY) return 0;
    qsc_event_fn check = wait ? QSC_REAL(qsc_event_fn, cuEventSynchronize)
                              : QSC_REAL(qsc_event_fn, cuEventQuery);
    int live = s->ev.epoch == qsc_ctx_epoch(s->ev.ctx);
    if (!live && !wait && qsc_ctx_destroying(s->ev.ctx)) return 0; /* its destroy drains it */
    if (!live) qsc_ctx_wait_destroys(s->ev.ctx);
    CUresult rc = live ? check_event(check, s->ev.end) : CUDA_ERROR_INVALID_HANDLE; /* it died */
    if (rc == CUDA_ERROR_NOT_READY) return 0;
    if (!atomic_compare_exchange_strong(&tracker.head, &h, h + 1)) return 1;
    const qsc_session *session = qsc_enter();
    finish(session, &s->ev, rc == CUDA_SUCCESS);
    qsc_leave(session);
    atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
    return 1;
}

static void *reaper_main(void *arg) {
    (void)arg;
    qsc_thread_ignores_captures();
    for (;;) {
        if (end_oldest(1)) continue;
        if (atomic_load(&tracker.head) != atomic_load(&tracker.tail)) {
            sched_yield(); /* the oldest slot is being filled: a few instructions away */
            continue;
        }
        atomic_store(&tracker.reaper_sleeping, 1);
        uint32_t seq = atomic_load(&tracker.wake_seq);
        if (atomic_load(&tracker.head) == atomic_load(&tracker.tail))
            qs_futex_wait(&tracker.wake_seq, seq, 0);
        atomic_store(&tracker.reaper_sleeping, 0);
    }
    return NULL;
}

static void start_reaper(void) {
    atomic_store(&tracker.reaper_sleeping, 1);
    if (qsc_start_thread(reaper_main, NULL, "the completion thread; launches will wait") != 0)
        atomic_store(&tracker.no_reaper, 1);
}

/* Hand the recorded `current` events to the ring, taking the slot's spare events back. With no
 * reaper, the launching thread waits for its unit here: nothing else would end it. */
static void append(void) {
    pthread_once(&reaper_once, start_reaper);
    uint64_t t = atomic_fetch_add(&tracker.tail, 1);
    slot *s = &tracker.ring[t % RING_SLOTS];
    while (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_FREE)
        if (!end_oldest(1)) sched_yield(); /* ring full: drain it ourselves */
    atomic_store_explicit(&s->state, SLOT_FILLING, memory_order_relaxed);
    events spare = s->ev;
    s->ev = current;
    if (spare.ctx != current.ctx || spare.epoch != current.epoch) {
        destroy_events(&spare);
        spare.ctx = current.ctx;
        spare.epoch = current.epoch;
    }
    current = spare;
    atomic_store_explicit(&s->state, SLOT_READY, memory_order_release);
    if (atomic_load(&tracker.no_reaper)) {
        while (end_oldest(1)) {
        }
        return;
    }
    if (atomic_load(&tracker.reaper_sleeping)) {
        atomic_fetch_add(&tracker.wake_seq, 1);
        qs_futex_wake(&tracker.wake_seq, 1);
    }
}

uint64_t qsc_units_unended(void) {
    uint64_t h = atomic_load(&tracker.head), t = atomic_load(&tracker.tail);
    return t > h ? t - h : 0;
}

void qsc_units_forked(void) {
    memset(&tracker, 0, sizeof tracker);
    current = (events){0};
    reaper_once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

/* The legacy default stream can never be captured (the driver refuses to begin a capture on
 * it), so a launch into it needs no query: one driver call fewer on the common path. */
int qsc_stream_capturing(CUstream stream) {
    if (stream == CU_STREAM_LEGACY) return 0;
    qsc_stream_is_capturing_fn is_capturing =
        QSC_REAL(qsc_stream_is_capturing_fn, cuStreamIsCapturing);
    int status = CAPTURE_NONE;
    return is_capturing != NULL && is_capturing(stream, &status) == CUDA_SUCCESS &&
           status != CAPTURE_NONE;
}

int qsc_stream_unrecordable(CUstream stream) {
    qsc_stream_is_capturing_fn is_capturing =
        QSC_REAL(qsc_stream_is_capturing_fn, cuStreamIsCapturing);
    int status = CAPTURE_NONE;
    return is_capturing != NULL &&
           (is_capturing(stream, &status) != CUDA_SUCCESS || status != CAPTURE_NONE);
}

/* High priority into a stream the completion thread can name: open a unit (joining the
 * open one, in qsc_unit_begin, makes no driver call beyond the legacy stream's context check). */
static int hp_fast(const qsc_session *s, CUstream stream, int *tracked, CUresult *rc) {
    if (s->low_priority || !qsc_hp_coalescable(stream)) return 0;
    if (!qsc_hp_try_open()) return 0;
    int st = qs_launch_begin(s->client);
    if (st != QS_OK) {
        qsc_hp_opened(stream, NULL, CUDA_ERROR_NOT_PERMITTED); /* gives the slot back */
        qsc_warn_once(QSC_WARN_DRIVER, "launch refused: %s (%s)", qs_strerror(st), qs_last_error());
        *rc = qsc_cu_status(st);
        return 1;
    }
    *tracked = QSC_UNIT_OPENING;
    return 1;
}

/* The units appended and not yet ended: the head is read first, so the tail read after it is
 * never behind it (read the other way, units ended in between would wrap the count). */
static uint64_t units_in_flight(void) {
    uint64_t head = atomic_load(&tracker.head);
    return atomic_load(&tracker.tail) - head;
}

/* Low priority's window holds the launches of both paths together (batched, and units here):
 * wait while they are estimated at the window or more, for the next batch while batches are
 * in flight, else for the oldest unit (a unit still being appended does not hold the launch). */
static void lp_wait_window(uint64_t window) {
    for (;;) {
        uint64_t units = units_in_flight();
        if (qsc_lp_wait_window(window, units)) return;
        if (units != 0 && !end_oldest(1)) return;
    }
}

/* Low priority: batched into every stream lp_batch.c tracks, or one unit per launch into the
 * others (per-thread default streams, and streams past LP_STREAMS), under one window. */
static CUresult lp_begin(const qsc_session *s, CUstream stream, int *tracked) {
    uint64_t window = qsc_lp_window(s);
    CUcontext ctx = current_context();
    if (!qsc_ctx_allowed(s, ctx)) return CUDA_ERROR_NOT_PERMITTED;
    int batched = qsc_lp_tracks(s, stream, ctx);
    lp_wait_window(window);
    int rc = qs_launch_begin(s->client);
    if (rc != QS_OK) {
        qsc_warn_once(QSC_WARN_DRIVER, "launch refused: %s (%s)", qs_strerror(rc), qs_last_error());
        return qsc_cu_status(rc);
    }
    *tracked = batched ? QSC_UNIT_BATCHED : QSC_UNIT_EVENT;
    if (batched) qsc_lp_opening(s);
    else if (prepare_events(&current, qsc_stream_context(stream, ctx), 1) == CUDA_SUCCESS)
        QSC_REAL(qsc_event_record_fn, cuEventRecord)(current.start, stream);
    return CUDA_SUCCESS;
}

CUresult qsc_unit_begin(const qsc_session *s, CUstream stream, int *tracked) {
    *tracked = QSC_UNIT_NONE;
    if (s->client == NULL) return s->failure;
    /* Joining the open unit needs no capture check: a captured launch only counts, and a
     * fence cannot be recorded into a capture, which ends the unit. */
    if (!s->low_priority && qsc_hp_join(stream)) {
        *tracked = QSC_UNIT_JOINED;
        return CUDA_SUCCESS;
    }
    if (qsc_stream_capturing(stream)) return CUDA_SUCCESS; /* recorded into a graph */
    if (s->low_priority) return lp_begin(s, stream, tracked);
    CUcontext ctx = context_of(stream);
    if (!qsc_ctx_allowed(s, ctx)) return CUDA_ERROR_NOT_PERMITTED;
    CUresult fast_rc = CUDA_SUCCESS;
    opening_ctx = ctx;
    if (hp_fast(s, stream, tracked, &fast_rc)) return fast_rc;
    while (end_oldest(0)) {
    }
    int rc = qs_launch_begin(s->client);
    if (rc != QS_OK) {
        qsc_warn_once(QSC_WARN_DRIVER, "launch refused: %s (%s)", qs_strerror(rc), qs_last_error());
        return qsc_cu_status(rc);
    }
    *tracked = QSC_UNIT_EVENT;
    prepare_events(&current, ctx, 0);
    return CUDA_SUCCESS;
}

void qsc_unit_end(const qsc_session *s, CUstream stream, CUresult submitted, int tracked) {
    if (tracked == QSC_UNIT_JOINED) {
        qsc_hp_joined();
        return;
    }
    if (tracked == QSC_UNIT_BATCHED) {
        if (submitted == CUDA_SUCCESS) qsc_lp_counted(stream, qsc_lp_window(s));
        else qs_launch_end(s->client);
        return;
    }
    if (tracked == QSC_UNIT_OPENING) {
        if (!qsc_hp_opened(stream, opening_ctx, submitted)) /* once per unit */
            qs_launch_end(s->client);
        return;
    }
    if (submitted != CUDA_SUCCESS || current.end == NULL ||
        QSC_REAL(qsc_event_record_fn, cuEventRecord)(current.end, stream) != CUDA_SUCCESS) {
        qs_launch_end(s->client);
        return;
    }
    if (atomic_load(&tracker.head) == atomic_load(&tracker.tail) &&
        check_event(QSC_REAL(qsc_event_fn, cuEventQuery), current.end) == CUDA_SUCCESS) {
        finish(s, &current, 1);
        return;
    }
    append();
}

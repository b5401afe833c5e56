/* lp_batch.c — low priority's launches into one stream, tracked by batch. Each launch is
 * gated (qs_launch_begin: it blocks at once when the gate closes) and counted; completion
 * is seen through one timed fence event behind a batch of launches, recorded by the
 * launch that closes the batch (its launches' estimated device time reached a quarter of
 * the window) or, at the end of a burst, by a completion thread that waits on the fences
 * in order, ends their launches (qs_launch_end), accounts the device time between
 * consecutive fences and keeps the estimate of device time per launch. A launch waits
 * while the process's launches in flight are estimated at the card's window or more
 * (qs_client_lp_window_ns, re-read at every batch), so the device stays fed while high
 * priority, when the gate closes, waits at most for the window; with the device gate
 * (lp_device_gate.c) high priority waits for a slice instead and the window is the deep one.
 * A launch that neither blocks nor closes a batch makes no system call and takes no lock.
 * Other streams use tracker.c's per-launch units. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "interposer.h"

#define FENCES 16u        /* batches in flight, plus the completed one kept as reference */
#define EST_INITIAL_DIV 8 /* before any batch was measured: a launch costs window / 8 */
#define BATCH_DIV 4       /* a batch closes at a quarter of the window */
#define BATCH_MAX 256u    /* ... or at this many launches, whatever the estimate */
#define TAIL_QUIET_NS 50000ull /* launches this far apart end a burst: its tail gets a fence */

enum { UNBOUND = 0, BINDING = 1, BOUND = 2 };
#define STREAM_GONE ((CUstream)(uintptr_t)-1) /* the tracked stream once destroyed */

typedef struct fence {
    CUevent ev;
    uint64_t epoch;    /* qsc_ctx_epoch when `ev` was made */
    uint64_t covered;  /* `launched` when recorded: every launch it completes */
    uint64_t episodes; /* the card's HP episodes when recorded (qs_client_hp_episodes) */
} fence;

static struct {
    _Atomic uint32_t bound; /* the tracked stream and context are chosen by the first launch */
    _Atomic(CUstream) stream; /* STREAM_GONE once the program destroyed it */
    CUcontext ctx;
    qs_client *client; /* the process's, as of binding: used only within a launch's qsc_enter */
    _Alignas(64) _Atomic uint64_t launched; /* submitted into the stream, counted after */
    _Atomic uint64_t covered;               /* `launched` as of the newest fence */
    _Atomic uint32_t sleeping;              /* the completion thread waits for work */
    _Atomic uint32_t watching;              /* ... or for the end of a burst */
    _Atomic uint32_t work_seq;              /* futex: ... here */
    _Alignas(64) _Atomic uint64_t completed; /* launches ended */
    _Atomic uint64_t est_ns;                 /* device ns per launch, 0 until measured */
    _Atomic uint64_t window_ns;              /* the window in force, re-read every batch */
    _Atomic uint32_t done_seq;               /* futex: launches waiting for the window */
    _Atomic uint32_t done_waiters;
    _Alignas(64) pthread_mutex_t lock; /* the fence queue: taken once per batch */
    fence q[FENCES];
    uint64_t head, tail; /* q[head] oldest pending, q[head - 1] the reference */
    int ref_valid; /* completion thread only: q[head - 1] has completed (a launch into an idle
                    * pipeline records a marker, so the reference never spans an idle card) */
} lp = {.lock = PTHREAD_MUTEX_INITIALIZER, .head = 1, .tail = 1};

static pthread_once_t lp_once = PTHREAD_ONCE_INIT;

/* The window in force: the card's, or with the device gate on (high priority then waits for
 * a slice, not for the window), at least the one kept while nobody needs protecting. */
static uint64_t window_of(const qsc_session *s) {
    uint64_t w = qs_client_lp_window_ns(s->client);
    return qsc_dgate_on() && w < QS_LP_WINDOW_ALONE_NS ? QS_LP_WINDOW_ALONE_NS : w;
}

static uint64_t estimate(uint64_t window) {
    uint64_t e = atomic_load_explicit(&lp.est_ns, memory_order_relaxed);
    return e ? e : window / EST_INITIAL_DIV + 1;
}

/* Record a fence behind every launch counted so far (lock held): with `marker`, even when
 * that is none (it times the next batch from here), unless `capturing` says the stream must
 * not be recorded into. `client` is the entered session's (NULL once detached). 1 if one was
 * pushed. */
static int push_fence_locked(int marker, qs_client *client, int (*capturing)(CUstream)) {
    uint64_t n = atomic_load(&lp.launched); /* read before recording: all of them precede it */
    CUstream stream = atomic_load(&lp.stream);
    if ((n == atomic_load(&lp.covered) && !marker) || lp.tail - lp.head + 1 >= FENCES ||
        stream == STREAM_GONE)
        return 0;
    fence *f = &lp.q[lp.tail % FENCES];
    uint64_t epoch = qsc_ctx_epoch();
    if (f->ev != NULL && f->epoch != epoch) f->ev = NULL; /* died with its context: forgotten */
    if (f->ev == NULL) {
        if (QSC_REAL(qsc_event_create_fn, cuEventCreate)(&f->ev, CU_EVENT_BLOCKING_SYNC) !=
            CUDA_SUCCESS)
            return 0;
        f->epoch = epoch;
    }
    if (capturing(stream) ||
        QSC_REAL(qsc_event_record_fn, cuEventRecord)(f->ev, stream) != CUDA_SUCCESS)
        return 0;
    f->covered = n;
    f->episodes = qs_client_hp_episodes(client);
    atomic_store(&lp.covered, n);
    lp.tail++;
    return 1;
}

/* End launches up to `covered`, charging `device_ns` for them (`s` from qsc_enter: once the
 * process detached, there is nothing to end or charge), and wake window waiters. */
static void end_launches(const qsc_session *s, uint64_t covered, uint64_t device_ns) {
    uint64_t from = atomic_load(&lp.completed);
    if (device_ns && s->client != NULL) qs_account_device_time(s->client, device_ns);
    for (uint64_t i = from; i < covered && s->client != NULL; i++) qs_launch_end(s->client);
    atomic_store(&lp.completed, covered);
    qsc_stats_count(QSC_STAT_LP_BATCH_DONE, 1);
    atomic_fetch_add(&lp.done_seq, 1);
    if (atomic_load(&lp.done_waiters)) qs_futex_wake(&lp.done_seq, INT_MAX);
}

/* The device time of the launches behind `f`: from the previous fence when it completed in
 * this burst (the device had them queued) and, with the device gate on, high priority did not
 * close the gate in between (the card then held them); else from the estimate. */
static uint64_t batch_device_ns(const qsc_session *s, const fence *f, uint64_t launches) {
    float ms = 0.0f;
    const fence *ref = &lp.q[(lp.head - 1) % FENCES];
    int held = qsc_dgate_on() && qs_client_hp_episodes(s->client) != ref->episodes;
    int live = ref->epoch == f->epoch && f->epoch == qsc_ctx_epoch();
    if (lp.ref_valid && launches && !held && live &&
        QSC_REAL(qsc_event_elapsed_fn, cuEventElapsedTime)(&ms, ref->ev, f->ev) == CUDA_SUCCESS &&
        ms >= 0.0f) {
        uint64_t ns = (uint64_t)((double)ms * 1e6), per = ns / launches;
        uint64_t e = atomic_load(&lp.est_ns);
        atomic_store(&lp.est_ns, e ? (3 * e + per) / 4 + 1 : per + 1);
        return ns;
    }
    return launches * atomic_load(&lp.est_ns);
}

static void complete_oldest(fence f) {
    if (f.epoch == qsc_ctx_epoch()) QSC_REAL(qsc_event_fn, cuEventSynchronize)(f.ev);
    const qsc_session *s = qsc_enter();
    if (s->client != NULL)
        atomic_store_explicit(&lp.window_ns, window_of(s), memory_order_relaxed);
    uint64_t device_ns = batch_device_ns(s, &f, f.covered - atomic_load(&lp.completed));
    end_launches(s, f.covered, device_ns);
    qsc_leave(s);
    pthread_mutex_lock(&lp.lock);
    lp.head++;
    pthread_mutex_unlock(&lp.lock);
    lp.ref_valid = 1;
}

/* Nothing in flight: sleep until a launch is counted or closes a batch (the Dekker pairs with
 * qsc_lp_counted: it raises `launched`, or pushes a fence under the lock, then reads
 * `sleeping`; this raises `sleeping`, then reads both). A fence that a launch pushed after the
 * loop last looked is pending though every launch is covered: sleeping then would leave it
 * uncompleted, and a launch waiting for the window would wait for good. */
static void idle(void) {
    uint32_t seq = atomic_load(&lp.work_seq);
    atomic_store(&lp.sleeping, 1);
    pthread_mutex_lock(&lp.lock);
    int nothing = lp.head == lp.tail && atomic_load(&lp.launched) == atomic_load(&lp.covered);
    pthread_mutex_unlock(&lp.lock);
    if (nothing) qs_futex_wait(&lp.work_seq, seq, 0);
    atomic_store(&lp.sleeping, 0);
}

/* Launches counted but not fenced, none pending: while they keep coming, the launches close
 * their own batches; once they pause (or one waits for the window), fence the tail. 1 when
 * the burst has paused at `n` launches. */
static int burst_paused(uint64_t n) {
    if (atomic_load(&lp.done_waiters)) return 1;
    uint32_t seq = atomic_load(&lp.work_seq);
    atomic_store(&lp.watching, 1);
    qs_futex_wait(&lp.work_seq, seq, qs_now_ns() + TAIL_QUIET_NS);
    atomic_store(&lp.watching, 0);
    return atomic_load(&lp.launched) == n;
}

static void fence_tail(uint64_t n) {
    const qsc_session *s = qsc_enter();
    pthread_mutex_lock(&lp.lock);
    int pushed = lp.head != lp.tail;
    if (!pushed && push_fence_locked(0, s->client, qsc_stream_unrecordable)) {
        pushed = 1;
        qsc_stats_count(QSC_STAT_LP_FENCE_TAIL, 1);
    }
    pthread_mutex_unlock(&lp.lock);
    if (!pushed) { /* cannot fence them (a capture began): end them as they are */
        atomic_store(&lp.covered, n);
        end_launches(s, n, 0);
    }
    qsc_leave(s);
}

static void *completion_main(void *arg) {
    (void)arg;
    typedef CUresult (*set_fn)(CUcontext);
    qsc_thread_ignores_captures();
    QSC_REAL(set_fn, cuCtxSetCurrent)(lp.ctx);
    for (;;) {
        pthread_mutex_lock(&lp.lock);
        int pending = lp.head != lp.tail;
        fence f = lp.q[lp.head % FENCES];
        pthread_mutex_unlock(&lp.lock);
        uint64_t n = atomic_load(&lp.launched);
        if (pending)
            complete_oldest(f);
        else if (n == atomic_load(&lp.covered))
            idle();
        else if (burst_paused(n))
            fence_tail(n);
    }
    return NULL;
}

static void start_completion(void) {
    qsc_start_thread(completion_main, "the low-priority completion thread");
}

int qsc_lp_tracks(const qsc_session *s, CUstream stream, CUcontext ctx) {
    if (!qsc_hp_coalescable(stream) || ctx == NULL) return 0;
    uint32_t b = atomic_load_explicit(&lp.bound, memory_order_acquire);
    if (b == UNBOUND) {
        uint32_t unbound = UNBOUND;
        if (atomic_compare_exchange_strong(&lp.bound, &unbound, BINDING)) {
            atomic_store(&lp.stream, stream);
            lp.ctx = ctx;
            lp.client = s->client;
            qsc_dgate_bind(s);
            atomic_store_explicit(&lp.bound, BOUND, memory_order_release);
            pthread_once(&lp_once, start_completion);
        }
        b = atomic_load_explicit(&lp.bound, memory_order_acquire);
    }
    return b == BOUND && atomic_load_explicit(&lp.stream, memory_order_relaxed) == stream &&
           lp.ctx == ctx;
}

/* Wait for the window, counted and timed when statistics are on. */
static void wait_for_room(uint32_t seq) {
    uint64_t since = qsc_stamp();
    qs_futex_wait(&lp.done_seq, seq, 0);
    if (since == 0) return;
    qsc_stats_count(QSC_STAT_LP_WINDOW_WAITS, 1);
    qsc_stats_count(QSC_STAT_LP_WINDOW_WAIT_NS, qs_now_ns() - since);
}

void qsc_lp_wait_window(uint64_t window_ns) {
    for (;;) {
        uint32_t seq = atomic_load(&lp.done_seq);
        uint64_t done = atomic_load(&lp.completed), inflight = atomic_load(&lp.launched) - done;
        if (inflight == 0 || inflight * estimate(window_ns) < window_ns) return;
        atomic_fetch_add(&lp.done_waiters, 1);
        if (atomic_load(&lp.watching)) { /* it waits for the burst to pause: this is the pause */
            atomic_fetch_add(&lp.work_seq, 1);
            qs_futex_wake(&lp.work_seq, 1);
        }
        wait_for_room(seq);
        atomic_fetch_sub(&lp.done_waiters, 1);
    }
}

void qsc_lp_counted(uint64_t window_ns) {
    uint64_t n = atomic_fetch_add(&lp.launched, 1) + 1;
    if (qsc_dgate_on())
        qsc_dgate_after(atomic_load_explicit(&lp.stream, memory_order_relaxed), n,
                        estimate(window_ns));
    if (atomic_load(&lp.sleeping)) {
        atomic_fetch_add(&lp.work_seq, 1);
        qs_futex_wake(&lp.work_seq, 1);
        return;
    }
    uint64_t open = n - atomic_load_explicit(&lp.covered, memory_order_relaxed);
    if (open < BATCH_MAX && open * estimate(window_ns) < window_ns / BATCH_DIV) return;
    if (pthread_mutex_trylock(&lp.lock) != 0) return; /* another launch is closing one */
    int pushed = push_fence_locked(0, lp.client, qsc_stream_capturing); /* in its qsc_enter */
    pthread_mutex_unlock(&lp.lock);
    if (pushed) qsc_stats_count(QSC_STAT_LP_FENCE_LAUNCH, 1);
    if (pushed && (atomic_load(&lp.watching) || atomic_load(&lp.sleeping))) { /* it has work */
        atomic_fetch_add(&lp.work_seq, 1);
        qs_futex_wake(&lp.work_seq, 1);
    }
}

void qsc_lp_opening(const qsc_session *s) {
    uint64_t done = atomic_load(&lp.completed);
    if (atomic_load(&lp.launched) != done) return;
    atomic_store_explicit(&lp.window_ns, window_of(s), memory_order_relaxed);
    pthread_mutex_lock(&lp.lock);
    int pushed = lp.head == lp.tail && push_fence_locked(1, s->client, qsc_stream_capturing);
    pthread_mutex_unlock(&lp.lock);
    if (pushed) qsc_stats_count(QSC_STAT_LP_FENCE_MARKER, 1);
}

uint64_t qsc_lp_window(const qsc_session *s) {
    uint64_t w = atomic_load_explicit(&lp.window_ns, memory_order_relaxed);
    if (w == 0) {
        w = window_of(s);
        atomic_store_explicit(&lp.window_ns, w, memory_order_relaxed);
    }
    return w;
}

uint64_t qsc_lp_window_launches(uint64_t window_ns) {
    uint64_t n = window_ns / estimate(window_ns);
    return n ? n : 1;
}

/* The tracked stream is destroyed: fence what was launched into it while it lives; nothing
 * is recorded into it afterwards (launches the fence could not cover end as they are), and
 * launches into other streams stay per-launch units. */
void qsc_lp_stream_destroyed(const qsc_session *s, CUstream stream) {
    if (atomic_load(&lp.bound) != BOUND || atomic_load(&lp.stream) != stream) return;
    pthread_mutex_lock(&lp.lock);
    if (push_fence_locked(0, s->client, qsc_stream_capturing))
        qsc_stats_count(QSC_STAT_LP_FENCE_TAIL, 1);
    atomic_store(&lp.stream, STREAM_GONE);
    pthread_mutex_unlock(&lp.lock);
}

void qsc_lp_forked(void) {
    memset(&lp, 0, sizeof lp);
    pthread_mutex_init(&lp.lock, NULL); /* the parent's completion thread may have held it */
    lp.head = lp.tail = 1;
    lp_once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

uint64_t qsc_lp_estimate_ns(void) { return atomic_load(&lp.est_ns); }

uint64_t qsc_lp_window_now(void) { return atomic_load(&lp.window_ns); }

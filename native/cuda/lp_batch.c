/* lp_batch.c — low priority's launches, tracked by batch in every stream the process
 * launches into (up to LP_STREAMS at once). Each launch is gated (qs_launch_begin: it blocks
 * at once when the gate closes) and counted; completion is seen, per stream, through one timed
 * fence event behind a batch of that stream's launches (fences order only the work of their
 * own stream), recorded by the launch that closes the batch (its launches' estimated device
 * time reached a quarter of the window) or, at the end of a burst, by the stream's completion
 * thread, which waits on the stream's fences in order, ends their launches (qs_launch_end),
 * accounts the device time between consecutive fences and keeps the estimates of device time
 * per launch: the process's and each stream's own (what its batches are charged at when they
 * cannot be timed alone), and each stream's hold (what high priority waits behind per launch).
 * Every stream shares one window: a launch waits while the process's launches in flight, each
 * stream's counted at its hold and summed, come to the card's window or more
 * (qs_client_lp_window_ns, re-read at every batch), so the device stays fed while high
 * priority, when the gate closes, waits at most for the window; a stream of long kernels
 * beside streams of short ones is held by its own kernels' length. With the
 * device gate (lp_device_gate.c), every tracked stream waits on the device after each slice
 * of its own launches, so high priority waits for a slice instead and the window is the deep
 * one. A launch that neither blocks nor closes a batch makes no system call and takes no lock
 * (the first launch into a new stream binds it under a lock). Streams beyond LP_STREAMS use
 * tracker.c's per-launch units, which count in the same window (qsc_lp_wait_window). */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "interposer.h"

#define FENCES 16u        /* batches in flight per stream, plus the completed one as reference */
#define EST_INITIAL_DIV 8 /* before any batch was measured: a launch costs window / 8 */
#define BATCH_DIV 4       /* a batch closes at a quarter of the window */
#define BATCH_MAX 256u    /* ... or at this many launches, whatever the estimate */
#define TAIL_QUIET_NS 50000ull /* launches this far apart end a burst: its tail gets a fence */
#define STREAM_QUIET_NS 1000000ull /* ... or a stream's own launches, while others go on */

#define STREAM_GONE ((CUstream)(uintptr_t)-1) /* a tracked stream once destroyed */

typedef struct fence {
    CUevent ev;
    uint64_t epoch;      /* qsc_ctx_epoch of the stream's context when `ev` was made */
    uint64_t covered;    /* the stream's `launched` when recorded: every launch it completes */
    uint64_t episodes;   /* the card's HP episodes when recorded (qs_client_hp_episodes) */
    int overlapped; /* its batch began in an idle stream while others had work in flight: its
                     * time may include theirs, so it teaches the stream's hold only */
} fence;

/* One tracked stream. Free while `claimed` is 0; bound while `stream` names it; STREAM_GONE
 * once the program destroyed it (or its context), until its completion thread has ended its
 * launches and frees the slot for another stream. */
typedef struct lp_stream {
    _Atomic(CUstream) stream; /* NULL: never bound */
    _Atomic(CUcontext) ctx;
    _Atomic uint32_t claimed;       /* under lp.bind_lock */
    _Atomic uint32_t thread_started; /* its completion thread runs (started under lp.bind_lock,
                                      * before the slot's first stream is published) */
    _Alignas(64) _Atomic uint64_t launched; /* submitted into the stream, counted after */
    _Atomic uint64_t covered;               /* `launched` as of the newest fence */
    _Atomic uint64_t gate_since;            /* `launched` at its last wait on the device gate */
    _Atomic uint32_t sleeping;              /* the completion thread waits for work */
    _Atomic uint32_t watching;              /* ... or for the end of a burst */
    _Atomic uint32_t work_seq;              /* futex: ... here */
    _Atomic uint32_t overlapped; /* the open batch began while other streams had work */
    _Atomic uint64_t hold_ns; /* device ns per launch that high priority would wait behind,
                               * from every timed batch of this stream; 0 until measured */
    _Alignas(64) _Atomic uint64_t completed; /* launches ended */
    _Atomic uint64_t accounted; /* ... of them, by a completion thread of the attached process */
    _Alignas(64) pthread_mutex_t lock; /* the fence queue: taken once per batch */
    fence q[FENCES];
    uint64_t head, tail; /* q[head] oldest pending, q[head - 1] the reference */
    int ref_valid; /* completion thread only: q[head - 1] has completed (a launch into an idle
                    * pipeline records a marker, so the reference never spans an idle card) */
    uint64_t quiet_since; /* completion thread only: when it saw the stream's launches pause */
    _Atomic uint64_t est_ns; /* this stream's device ns per launch, 0 until measured (an
                              * overlapped batch is charged at it: streams differ) */
} lp_stream;

static struct {
    lp_stream streams[LP_STREAMS];
    pthread_mutex_t bind_lock;
    _Atomic uint32_t claimed;        /* slots claimed: at LP_STREAMS, new streams go per launch */
    _Atomic uint32_t no_thread; /* a completion thread could not start: new streams go per launch */
    qs_client *client; /* the process's, as of binding: used only within a launch's qsc_enter */
    _Atomic uint32_t bound;          /* bit i: streams[i] is claimed (under bind_lock) */
    _Alignas(64) _Atomic uint64_t launched; /* every stream's, summed */
    _Alignas(64) _Atomic uint64_t completed;
    _Atomic uint64_t est_ns;    /* device ns per launch, 0 until measured (every stream's) */
    _Atomic uint64_t window_ns; /* the window in force, re-read every batch */
    _Atomic uint32_t done_seq;  /* futex: launches waiting for the window */
    _Atomic uint32_t done_waiters;
} lp = {.bind_lock = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t lp_once = PTHREAD_ONCE_INIT;
static _Thread_local lp_stream *launching; /* the stream of this thread's batched launch */

static void init_streams(void) {
    for (unsigned i = 0; i < LP_STREAMS; i++) {
        pthread_mutex_init(&lp.streams[i].lock, NULL);
        lp.streams[i].head = lp.streams[i].tail = 1;
    }
}

/* The window in force: the card's, or with the device gate on (high priority then waits for
 * a slice, not for the window), at least the one kept while nobody needs protecting. */
static uint64_t window_of(const qsc_session *s) {
    return qs_lp_window_in_force(qs_client_lp_window_ns(s->client), qsc_dgate_on());
}

static uint64_t estimate(uint64_t window) {
    uint64_t e = atomic_load_explicit(&lp.est_ns, memory_order_relaxed);
    return e ? e : window / EST_INITIAL_DIV + 1;
}

/* What a launch into `st` holds of the window: the stream's own hold once measured (streams of
 * long kernels beside streams of short ones are held to their own), else the process's. */
static uint64_t cost_in(lp_stream *st, uint64_t window) {
    uint64_t hold = atomic_load_explicit(&st->hold_ns, memory_order_relaxed);
    return hold ? hold : estimate(window);
}

static void wake_completion(lp_stream *st) {
    atomic_fetch_add(&st->work_seq, 1);
    qs_futex_wake(&st->work_seq, 1);
}

/* Record a fence behind every launch counted so far into `st` (its lock held): with `marker`,
 * even when that is none (it times the next batch from here), unless `capturing` says the
 * stream must not be recorded into. `client` is the entered session's (NULL once detached).
 * 1 if one was pushed. */
static int push_fence_locked(lp_stream *st, int marker, qs_client *client,
                             int (*capturing)(CUstream)) {
    uint64_t n = atomic_load(&st->launched); /* read before recording: all of them precede it */
    CUstream stream = atomic_load(&st->stream);
    if ((n == atomic_load(&st->covered) && !marker) || st->tail - st->head + 1 >= FENCES ||
        stream == STREAM_GONE)
        return 0;
    fence *f = &st->q[st->tail % FENCES];
    CUcontext ctx = atomic_load(&st->ctx);
    uint64_t epoch = qsc_ctx_epoch(ctx);
    if (f->ev != NULL && f->epoch != epoch) f->ev = NULL; /* died with its context: forgotten */
    if (f->ev == NULL) {
        if (qsc_event_create_in(ctx, &f->ev, CU_EVENT_BLOCKING_SYNC) != CUDA_SUCCESS) return 0;
        f->epoch = epoch;
    }
    qsc_record_begin();
    int unrecorded = capturing(stream) ||
                     QSC_REAL(qsc_event_record_fn, cuEventRecord)(f->ev, stream) != CUDA_SUCCESS;
    qsc_record_end();
    if (unrecorded) return 0;
    f->covered = n;
    f->episodes = qs_client_hp_episodes(client);
    f->overlapped = (int)atomic_exchange(&st->overlapped, 0);
    atomic_store(&st->covered, n);
    st->tail++;
    return 1;
}

/* End `st`'s launches up to `covered`, charging `device_ns` for them (`s` from qsc_enter: once
 * the process detached, there is nothing to end or charge), and wake window waiters. */
static void end_launches(const qsc_session *s, lp_stream *st, uint64_t covered,
                         uint64_t device_ns) {
    uint64_t from = atomic_load(&st->completed);
    if (device_ns && s->client != NULL) qs_account_device_time(s->client, device_ns);
    if (s->client != NULL) atomic_store(&st->accounted, covered); /* see qsc_lp_unended_ns */
    for (uint64_t i = from; i < covered && s->client != NULL; i++) qs_launch_end(s->client);
    atomic_store(&st->completed, covered);
    atomic_fetch_add(&lp.completed, covered - from);
    qsc_stats_count(QSC_STAT_LP_BATCH_DONE, 1);
    atomic_fetch_add(&lp.done_seq, 1);
    if (atomic_load(&lp.done_waiters)) qs_futex_wake(&lp.done_seq, INT_MAX);
}

/* Fold `per` (device ns per launch, just measured) into the estimate at `est`. */
static uint64_t folded(uint64_t est, uint64_t per) {
    return est ? (3 * est + per) / 4 + 1 : per + 1;
}

/* 1, with the device ns between the previous fence and `f` in `ns`, when it completed in this
 * burst (the device had them queued) and, with the device gate on, high priority did not
 * close the gate in between (the card then held them); 0 when they cannot be timed. */
static int batch_elapsed(const qsc_session *s, lp_stream *st, const fence *f, uint64_t *ns) {
    float ms = 0.0f;
    const fence *ref = &st->q[(st->head - 1) % FENCES];
    int held = qsc_dgate_on() && qs_client_hp_episodes(s->client) != ref->episodes;
    int live = ref->epoch == f->epoch && f->epoch == qsc_ctx_epoch(atomic_load(&st->ctx));
    if (!st->ref_valid || held || !live ||
        QSC_REAL(qsc_event_elapsed_fn, cuEventElapsedTime)(&ms, ref->ev, f->ev) != CUDA_SUCCESS ||
        ms < 0.0f)
        return 0;
    *ns = (uint64_t)((double)ms * 1e6);
    return 1;
}

/* The device time of the launches behind `f`, timed (batch_elapsed), which teaches the
 * estimates; an overlapped batch's time, which may include other streams' work, teaches only
 * the stream's hold (what high priority would wait behind) and is charged at the stream's own
 * estimate (the process's until the stream has one: another stream's kernels may be far
 * longer or shorter), as is an untimed one. */
static uint64_t batch_device_ns(const qsc_session *s, lp_stream *st, const fence *f,
                                uint64_t launches) {
    uint64_t ns = 0;
    int timed = launches && batch_elapsed(s, st, f, &ns);
    uint64_t per = timed ? ns / launches : 0;
    if (timed) atomic_store(&st->hold_ns, folded(atomic_load(&st->hold_ns), per));
    if (timed && !f->overlapped) {
        atomic_store(&lp.est_ns, folded(atomic_load(&lp.est_ns), per));
        atomic_store(&st->est_ns, folded(atomic_load(&st->est_ns), per));
        return ns;
    }
    uint64_t own = atomic_load(&st->est_ns);
    return launches * (own ? own : atomic_load(&lp.est_ns));
}

/* Wait for the oldest fence; one that died with its context stands for work the driver's
 * destroy drains, so its launches stay in the window until that call returned. */
static void complete_oldest(lp_stream *st, fence f) {
    if (f.epoch == qsc_ctx_epoch(atomic_load(&st->ctx)))
        QSC_REAL(qsc_event_fn, cuEventSynchronize)(f.ev);
    else
        qsc_ctx_wait_destroys(atomic_load(&st->ctx));
    const qsc_session *s = qsc_enter();
    if (s->client != NULL)
        atomic_store_explicit(&lp.window_ns, window_of(s), memory_order_relaxed);
    uint64_t device_ns = batch_device_ns(s, st, &f, f.covered - atomic_load(&st->completed));
    end_launches(s, st, f.covered, device_ns);
    qsc_leave(s);
    pthread_mutex_lock(&st->lock);
    st->head++;
    pthread_mutex_unlock(&st->lock);
    st->ref_valid = 1;
}

/* Nothing in flight: sleep until a launch is counted or closes a batch (the Dekker pairs with
 * qsc_lp_counted: it raises `launched`, or pushes a fence under the lock, then reads
 * `sleeping`; this raises `sleeping`, then reads both). A fence that a launch pushed after the
 * loop last looked is pending though every launch is covered: sleeping then would leave it
 * uncompleted, and a launch waiting for the window would wait for good. */
static void idle(lp_stream *st) {
    uint32_t seq = atomic_load(&st->work_seq);
    atomic_store(&st->sleeping, 1);
    pthread_mutex_lock(&st->lock);
    int nothing = st->head == st->tail && atomic_load(&st->launched) == atomic_load(&st->covered);
    pthread_mutex_unlock(&st->lock);
    if (nothing) qs_futex_wait(&st->work_seq, seq, 0);
    atomic_store(&st->sleeping, 0);
}

/* Launches counted but not fenced, none pending: while they keep coming, the launches close
 * their own batches; once the process's launches pause (or one waits for the window), or this
 * stream's have paused for STREAM_QUIET_NS while other streams go on, fence the tail. 1 when
 * the burst has paused at `n` launches. */
static int burst_paused(lp_stream *st, uint64_t n) {
    if (atomic_load(&lp.done_waiters)) return 1;
    uint64_t all = atomic_load(&lp.launched);
    uint32_t seq = atomic_load(&st->work_seq);
    atomic_store(&st->watching, 1);
    qs_futex_wait(&st->work_seq, seq, qs_now_ns() + TAIL_QUIET_NS);
    atomic_store(&st->watching, 0);
    if (atomic_load(&st->launched) != n) {
        st->quiet_since = 0;
        return 0;
    }
    uint64_t now = qs_now_ns();
    if (st->quiet_since == 0) st->quiet_since = now;
    int paused = atomic_load(&lp.launched) == all || now - st->quiet_since >= STREAM_QUIET_NS ||
                 atomic_load(&lp.done_waiters);
    if (paused) st->quiet_since = 0;
    return paused;
}

/* A completion thread's current context: the one its slot's fences are made in. */
static _Thread_local CUcontext completion_ctx;

/* Make `st`'s context current to its completion thread, unless it is (or the stream died). */
static void use_context(lp_stream *st) {
    typedef CUresult (*set_fn)(CUcontext);
    if (atomic_load(&st->stream) == STREAM_GONE) return; /* read first: claim() publishes it last */
    CUcontext ctx = atomic_load(&st->ctx);
    if (ctx == completion_ctx) return;
    QSC_REAL(set_fn, cuCtxSetCurrent)(ctx);
    completion_ctx = ctx;
}

/* The tail's fence may be made here: in the stream's context, which the slot may have changed
 * since the thread last looked (freed by a stream of one context, claimed for another's). */
static void fence_tail(lp_stream *st, uint64_t n) {
    if (atomic_load(&st->stream) == STREAM_GONE) /* see complete_oldest */
        qsc_ctx_wait_destroys(atomic_load(&st->ctx));
    use_context(st);
    const qsc_session *s = qsc_enter();
    pthread_mutex_lock(&st->lock);
    int pushed = st->head != st->tail;
    if (!pushed && push_fence_locked(st, 0, s->client, qsc_stream_unrecordable)) {
        pushed = 1;
        qsc_stats_count(QSC_STAT_LP_FENCE_TAIL, 1);
    }
    pthread_mutex_unlock(&st->lock);
    if (!pushed) { /* cannot fence them (a capture began, the stream died): end them as they are */
        atomic_store(&st->covered, n);
        end_launches(s, st, n, 0);
    }
    qsc_leave(s);
}

/* A destroyed stream whose launches have all ended: its events are destroyed while their
 * context lives (forgotten if it died), and the slot is free for another stream. */
static void release_slot(lp_stream *st) {
    uint64_t epoch = qsc_ctx_epoch(atomic_load(&st->ctx));
    for (unsigned i = 0; i < FENCES; i++) {
        fence *f = &st->q[i];
        if (f->ev != NULL && f->epoch == epoch) QSC_REAL(qsc_event_fn, cuEventDestroy_v2)(f->ev);
        f->ev = NULL;
    }
    pthread_mutex_lock(&lp.bind_lock);
    st->ref_valid = 0;
    st->quiet_since = 0;
    atomic_store(&st->est_ns, 0);
    atomic_store(&st->hold_ns, 0);
    atomic_store(&st->claimed, 0);
    atomic_fetch_and(&lp.bound, ~(1u << (st - lp.streams)));
    atomic_fetch_sub(&lp.claimed, 1);
    pthread_mutex_unlock(&lp.bind_lock);
}

static int drained_and_gone(lp_stream *st) {
    return atomic_load(&st->claimed) && atomic_load(&st->stream) == STREAM_GONE &&
           atomic_load(&st->completed) == atomic_load(&st->launched);
}

/* One round of a stream's completion thread. */
static void complete_round(lp_stream *st) {
    pthread_mutex_lock(&st->lock);
    int pending = st->head != st->tail;
    fence f = st->q[st->head % FENCES];
    pthread_mutex_unlock(&st->lock);
    uint64_t n = atomic_load(&st->launched);
    if (pending)
        complete_oldest(st, f);
    else if (n != atomic_load(&st->covered)) {
        if (burst_paused(st, n)) fence_tail(st, n);
    } else if (drained_and_gone(st))
        release_slot(st);
    else
        idle(st);
}

static void *completion_main(void *arg) {
    lp_stream *st = arg;
    qsc_thread_ignores_captures();
    for (;;) {
        use_context(st);
        complete_round(st);
    }
    return NULL;
}

/* 1 if `st` is bound to `stream` launched into with `ctx` current. */
static int bound_to(lp_stream *st, CUstream stream, CUcontext ctx) {
    if (atomic_load_explicit(&st->stream, memory_order_acquire) != stream) return 0;
    if (qsc_stream_created(stream)) return 1; /* one stream whichever context is current */
    return atomic_load_explicit(&st->ctx, memory_order_relaxed) == ctx;
}

/* The slot bound to `stream` (`ctx` current), if any: the one this thread used last, else a
 * scan. */
static lp_stream *find(CUstream stream, CUcontext ctx) {
    lp_stream *last = launching;
    if (last != NULL && bound_to(last, stream, ctx)) return last;
    for (unsigned i = 0; i < LP_STREAMS; i++)
        if (bound_to(&lp.streams[i], stream, ctx)) return &lp.streams[i];
    return NULL;
}

/* A free slot, its counters started afresh (bind_lock held); NULL when none is free. */
static lp_stream *free_slot(void) {
    for (unsigned i = 0; i < LP_STREAMS; i++) {
        lp_stream *st = &lp.streams[i];
        if (atomic_load(&st->claimed)) continue;
        pthread_mutex_lock(&st->lock);
        atomic_store(&st->launched, 0);
        atomic_store(&st->covered, 0);
        atomic_store(&st->completed, 0);
        atomic_store(&st->accounted, 0);
        atomic_store(&st->overlapped, 0);
        atomic_store(&st->gate_since, 0);
        st->head = st->tail = 1;
        pthread_mutex_unlock(&st->lock);
        return st;
    }
    return NULL;
}

/* Claim a free slot for `stream` (bind_lock held), its completion thread running, then publish
 * the stream (a launch that finds it sees the counters reset, and the process's client and
 * device gate, set by the first stream claimed). A slot whose thread cannot start is left free:
 * nothing would end its launches, so the stream goes one unit per launch. */
static lp_stream *claim(const qsc_session *s, CUstream stream, CUcontext ctx) {
    lp_stream *st = free_slot();
    if (st == NULL) return NULL;
    atomic_store_explicit(&st->ctx, ctx, memory_order_relaxed);
    if (!atomic_load(&st->thread_started)) {
        if (qsc_start_thread(completion_main, st, "a low-priority completion thread; launches "
                                                  "into new streams are tracked one by one") != 0) {
            atomic_store(&lp.no_thread, 1);
            return NULL;
        }
        atomic_store(&st->thread_started, 1);
    }
    atomic_store(&st->claimed, 1);
    atomic_fetch_or(&lp.bound, 1u << (st - lp.streams));
    atomic_fetch_add(&lp.claimed, 1);
    if (lp.client == NULL) { /* the first stream bound: before any launch can find it */
        lp.client = s->client;
        qsc_dgate_bind(s);
    }
    atomic_store_explicit(&st->stream, stream, memory_order_release);
    return st;
}

/* The first launch into `stream` (`ctx` current): bind a slot to it, in its own context. */
static lp_stream *bind(const qsc_session *s, CUstream stream, CUcontext ctx) {
    pthread_once(&lp_once, init_streams);
    CUcontext own = qsc_stream_context(stream, ctx);
    if (own == NULL) return NULL;
    pthread_mutex_lock(&lp.bind_lock);
    lp_stream *st = find(stream, ctx); /* another thread may have bound it meanwhile */
    if (st == NULL) st = claim(s, stream, own);
    pthread_mutex_unlock(&lp.bind_lock);
    return st;
}

int qsc_lp_tracks(const qsc_session *s, CUstream stream, CUcontext ctx) {
    if (!qsc_hp_coalescable(stream) || (ctx == NULL && !qsc_stream_created(stream))) return 0;
    lp_stream *st = find(stream, ctx);
    if (st != NULL) {
        launching = st;
        return 1;
    }
    int room = atomic_load_explicit(&lp.claimed, memory_order_relaxed) < LP_STREAMS;
    if (room && !atomic_load_explicit(&lp.no_thread, memory_order_relaxed))
        st = bind(s, stream, ctx);
    if (st != NULL) {
        launching = st;
        return 1;
    }
    if (!room)
        qsc_warn_once(QSC_WARN_STREAMS, "a low-priority process launches into more than %u "
                      "streams at once; launches into the others are tracked one by one",
                      LP_STREAMS);
    return 0;
}

/* Wait for the window, counted and timed when statistics are on. */
static void wait_for_room(uint32_t seq) {
    uint64_t since = qsc_stamp();
    qs_futex_wait(&lp.done_seq, seq, 0);
    if (since == 0) return;
    qsc_stats_count(QSC_STAT_LP_WINDOW_WAITS, 1);
    qsc_stats_count(QSC_STAT_LP_WINDOW_WAIT_NS, qs_now_ns() - since);
}

/* A launch waits for the window: completion threads that wait for a burst to pause are told
 * that this is the pause. */
static void end_bursts(void) {
    for (unsigned i = 0; i < LP_STREAMS; i++)
        if (atomic_load(&lp.streams[i].watching)) wake_completion(&lp.streams[i]);
}

/* The batched launches in flight, each stream's at its hold as of now (a hold just learned
 * reprices what is already queued). `completed` is read first: a stream's `launched` is then
 * never behind it, but for a slot being reset for a new stream. */
static uint64_t batched_in_flight_ns(uint64_t window_ns) {
    uint64_t ns = 0;
    for (uint32_t bound = atomic_load(&lp.bound); bound != 0; bound &= bound - 1) {
        lp_stream *st = &lp.streams[__builtin_ctz(bound)];
        uint64_t done = atomic_load(&st->completed), launched = atomic_load(&st->launched);
        if (launched > done) ns += (launched - done) * cost_in(st, window_ns);
    }
    return ns;
}

int qsc_lp_wait_window(uint64_t window_ns, uint64_t units) {
    uint32_t seq = atomic_load(&lp.done_seq);
    /* A launch's thread counts it in the total first, then in its stream, whose fences end it;
     * the total read after `done` is then never behind it. Kept safe anyway: never below 0. */
    uint64_t done = atomic_load(&lp.completed), launched = atomic_load(&lp.launched);
    uint64_t inflight = launched > done ? launched - done : 0;
    uint64_t queued = batched_in_flight_ns(window_ns) + units * estimate(window_ns);
    if (qs_lp_window_admits(queued, window_ns)) return 1;
    if (inflight == 0) return 0;
    atomic_fetch_add(&lp.done_waiters, 1);
    end_bursts();
    wait_for_room(seq);
    atomic_fetch_sub(&lp.done_waiters, 1);
    return 0;
}

void qsc_lp_counted(CUstream stream, uint64_t window_ns) {
    lp_stream *st = launching;
    uint64_t cost = cost_in(st, window_ns);
    atomic_fetch_add(&lp.launched, 1); /* before the stream's: see qsc_lp_wait_window */
    uint64_t n = atomic_fetch_add(&st->launched, 1) + 1;
    if (qsc_dgate_on()) /* every tracked stream waits on the device, counted by its own; into
                         * the launch's stream (the slot's may be marked gone meanwhile) */
        qsc_dgate_after(stream, &st->gate_since, n, cost);
    if (atomic_load(&st->sleeping)) {
        wake_completion(st);
        return;
    }
    uint64_t open = n - atomic_load_explicit(&st->covered, memory_order_relaxed);
    if (open < BATCH_MAX && open * cost < window_ns / BATCH_DIV) return;
    if (pthread_mutex_trylock(&st->lock) != 0) return; /* another launch is closing one */
    int pushed = push_fence_locked(st, 0, lp.client, qsc_stream_capturing); /* in its qsc_enter */
    pthread_mutex_unlock(&st->lock);
    if (pushed) qsc_stats_count(QSC_STAT_LP_FENCE_LAUNCH, 1);
    if (pushed && (atomic_load(&st->watching) || atomic_load(&st->sleeping))) /* it has work */
        wake_completion(st);
}

/* A launch into an idle stream marks where its batch starts, so that the batch is timed from
 * there. While other streams have work in flight, the batch is marked overlapped: its time
 * teaches only the stream's hold (the estimates come from batches queued behind one another),
 * so that a stream of long kernels beside busy streams of short ones is still held to its own. */
void qsc_lp_opening(const qsc_session *s) {
    lp_stream *st = launching;
    uint64_t done = atomic_load(&st->completed);
    if (atomic_load(&st->launched) != done) return;
    int others = atomic_load(&lp.launched) != atomic_load(&lp.completed);
    if (!others) atomic_store_explicit(&lp.window_ns, window_of(s), memory_order_relaxed);
    pthread_mutex_lock(&st->lock);
    int pushed = st->head == st->tail && push_fence_locked(st, 1, s->client, qsc_stream_capturing);
    if (others) atomic_store(&st->overlapped, 1); /* after the marker: the batch's fence takes it */
    pthread_mutex_unlock(&st->lock);
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

/* `st` dies (lock not held): nothing is recorded into it from now on; its completion thread
 * ends what no fence covers and frees the slot. */
static void stream_gone(lp_stream *st) {
    pthread_mutex_lock(&st->lock);
    atomic_store(&st->stream, STREAM_GONE);
    pthread_mutex_unlock(&st->lock);
    wake_completion(st);
}

/* A tracked stream is destroyed: fence what was launched into it while it lives; nothing is
 * recorded into it afterwards (launches the fence could not cover end as they are). */
void qsc_lp_stream_destroyed(const qsc_session *s, CUstream stream) {
    for (unsigned i = 0; i < LP_STREAMS; i++) {
        lp_stream *st = &lp.streams[i];
        if (!atomic_load(&st->claimed) || atomic_load(&st->stream) != stream) continue;
        pthread_mutex_lock(&st->lock);
        if (push_fence_locked(st, 0, s->client, qsc_stream_capturing))
            qsc_stats_count(QSC_STAT_LP_FENCE_TAIL, 1);
        pthread_mutex_unlock(&st->lock);
        stream_gone(st);
    }
}

/* Context `ctx` (NULL: every context) is about to be destroyed: its streams die with it. */
void qsc_lp_context_dies(CUcontext ctx) {
    for (unsigned i = 0; i < LP_STREAMS; i++) {
        lp_stream *st = &lp.streams[i];
        if (!atomic_load(&st->claimed) || (ctx != NULL && atomic_load(&st->ctx) != ctx) ||
            atomic_load(&st->stream) == STREAM_GONE)
            continue;
        stream_gone(st);
    }
}

void qsc_lp_forked(void) {
    memset(&lp, 0, sizeof lp);
    pthread_mutex_init(&lp.bind_lock, NULL); /* the parent's threads may have held them */
    lp_once = (pthread_once_t)PTHREAD_ONCE_INIT;
    pthread_once(&lp_once, init_streams);
    launching = NULL;
}

uint64_t qsc_lp_estimate_ns(void) { return atomic_load(&lp.est_ns); }

uint64_t qsc_lp_unended_ns(void) {
    uint64_t ns = 0, process = atomic_load(&lp.est_ns);
    for (uint32_t bound = atomic_load(&lp.bound); bound != 0; bound &= bound - 1) {
        lp_stream *st = &lp.streams[__builtin_ctz(bound)];
        uint64_t done = atomic_load(&st->accounted), n = atomic_load(&st->launched);
        uint64_t own = atomic_load(&st->est_ns);
        if (n > done) ns += (n - done) * (own ? own : process);
    }
    return ns;
}

uint64_t qsc_lp_window_now(void) { return atomic_load(&lp.window_ns); }

/* unit_lp_batch.c — lp_batch.c's completion thread tested on its own: the file is compiled
 * into this program with stand-ins for the interposer's other parts and no driver (the node
 * driver's sources are linked for futexes and clocks), so a test can set the state that an
 * interleaving of threads leaves and check what the completion thread does from there.
 * Built with AddressSanitizer and UBSan (`make -C native/cuda unit`). */
#include "../lp_batch.c"
#include "unit_runner.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

/* ---- stand-ins for the rest of the interposer ---- */
void *qsc_real_table[QSC_N_ALL];
_Atomic int qsc_stats_on;
static qsc_session no_session = {.failure = CUDA_ERROR_DEINITIALIZED};

static int dgate_on; /* the device gate, off unless a test turns it on */
static CUstream gate_waits_into; /* the stream the last wait on the gate word went into */
int qsc_dgate_on(void) { return dgate_on; }
int qsc_dgate_bind(const qsc_session *s) { return (void)s, 0; }
void qsc_dgate_after(CUstream stream, _Atomic uint64_t *since, uint64_t n, uint64_t est) {
    (void)since, (void)n, (void)est;
    gate_waits_into = stream;
}
int qsc_stream_capturing(CUstream stream) { return (void)stream, 0; }
int qsc_stream_unrecordable(CUstream stream) { return (void)stream, 0; }
void qsc_stats_count(int counter, uint64_t n) { (void)counter, (void)n; }
const qsc_session *qsc_enter(void) { return &no_session; }
void qsc_leave(const qsc_session *s) { (void)s; }
void qsc_thread_ignores_captures(void) {}
void qsc_record_begin(void) {}
void qsc_record_end(void) {}
int qsc_start_thread(void *(*main)(void *), void *arg, const char *what) {
    return (void)main, (void)arg, (void)what, 1;
}
int qsc_hp_coalescable(CUstream stream) { return stream != CU_STREAM_PER_THREAD; }
uint64_t qsc_ctx_epoch(CUcontext ctx) { return (void)ctx, 0; }
int qsc_ctx_destroying(CUcontext ctx) { return (void)ctx, 0; }
CUresult qsc_event_create_in(CUcontext ctx, CUevent *ev, unsigned int flags) {
    return (void)ctx, QSC_REAL(qsc_event_create_fn, cuEventCreate)(ev, flags);
}
CUcontext qsc_stream_context(CUstream stream, CUcontext current) {
    return (void)stream, current;
}
void qsc_ctx_wait_destroys(CUcontext ctx) { (void)ctx; }
void qsc_warn_once(int key, const char *fmt, ...) { (void)key, (void)fmt; }

/* ---- tests ---- */

static void *run_idle(void *arg) {
    idle(arg);
    return NULL;
}

/* 1 if idle() returned within `ms` (else its thread is left asleep). */
static int idle_returns_within(lp_stream *st, long ms) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, run_idle, st) != 0) return 0;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    return pthread_timedjoin_np(thread, NULL, &deadline) == 0;
}

/* A launch closed a batch (its fence is pending and covers every launch counted) after the
 * completion thread had found no fence pending: the thread must not go to sleep, or the
 * batch is never completed and a launch waiting for the window waits for good. */
static int test_completion_thread_does_not_sleep_while_a_fence_is_pending(void) {
    pthread_once(&lp_once, init_streams);
    lp_stream *st = &lp.streams[0];
    st->head = 1;
    st->tail = 2;
    atomic_store(&st->launched, 5);
    atomic_store(&st->covered, 5);
    EXPECT(idle_returns_within(st, 1000));
    return 0;
}

static void *run_wait_window(void *arg) {
    while (!qsc_lp_wait_window(*(const uint64_t *)arg, 0)) {
    }
    return NULL;
}

/* Six launches in flight in each of two streams, estimated at 100 ns each, under a 1,000 ns
 * window: each stream alone is under it, their sum is not, so a launch waits; once one stream's
 * launches end, it goes. */
static int test_the_window_bounds_the_launches_in_flight_summed_over_streams(void) {
    qsc_lp_forked(); /* a fresh state */
    static const uint64_t window = 1000;
    atomic_store(&lp.est_ns, 100);
    for (unsigned i = 0; i < 2; i++) atomic_store(&lp.streams[i].launched, 6);
    atomic_store(&lp.bound, 3u);
    atomic_store(&lp.launched, 12);
    pthread_t waiter;
    EXPECT(pthread_create(&waiter, NULL, run_wait_window, (void *)&window) == 0);
    struct timespec pause = {0, 100000000L};
    nanosleep(&pause, NULL);
    EXPECT(pthread_tryjoin_np(waiter, NULL) == EBUSY);
    end_launches(&no_session, &lp.streams[1], 6, 0);
    EXPECT(pthread_join(waiter, NULL) == 0);
    return 0;
}

/* A launch is counted in its stream, not yet in the process's total (its thread is between the
 * two counts), and a fence that covers it completes: the stream's launches end, so the total's
 * completed count passes its launched count for a moment. A launch that then checks the window
 * must not take that for a huge number in flight and sleep: nothing may complete after it, and
 * it would sleep for good. */
static int test_a_launch_ended_before_the_total_counts_it_does_not_hold_the_window(void) {
    qsc_lp_forked();
    static const uint64_t window = 1000;
    atomic_store(&lp.est_ns, 100);
    atomic_store(&lp.streams[0].launched, 5);
    atomic_store(&lp.bound, 1u);
    atomic_store(&lp.launched, 4);
    end_launches(&no_session, &lp.streams[0], 5, 0);
    pthread_t waiter;
    EXPECT(pthread_create(&waiter, NULL, run_wait_window, (void *)&window) == 0);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    EXPECT(pthread_timedjoin_np(waiter, NULL, &deadline) == 0);
    return 0;
}

/* A stream whose launches were measured at 2,000 ns each, in a process whose estimate is
 * 100 ns (its other streams run short kernels), under a 1,000 ns window: one launch counted
 * into it holds the window at its stream's hold, so the next launch waits until it ends.
 * Before, it was counted at the process's estimate, and 10 such launches went in at once. */
static int test_a_launch_holds_the_window_at_its_own_streams_hold(void) {
    qsc_lp_forked();
    static const uint64_t window = 1000;
    atomic_store(&lp.est_ns, 100);
    lp_stream *st = &lp.streams[1];
    atomic_store(&st->hold_ns, 2000);
    atomic_store(&lp.bound, 2u); /* claimed */
    atomic_store(&st->sleeping, 1); /* its completion thread takes the batch from here */
    launching = st;
    qsc_lp_counted((CUstream)(uintptr_t)0x3000, window);
    pthread_t waiter;
    EXPECT(pthread_create(&waiter, NULL, run_wait_window, (void *)&window) == 0);
    struct timespec pause = {0, 100000000L};
    nanosleep(&pause, NULL);
    EXPECT(pthread_tryjoin_np(waiter, NULL) == EBUSY);
    end_launches(&no_session, st, 1, 0);
    EXPECT(pthread_join(waiter, NULL) == 0);
    return 0;
}

/* The first launch into a stream binds a slot and starts its completion thread; the thread
 * cannot start (here no thread ever does: a process at its thread limit). The stream must not
 * be tracked by batch, where nothing would ever end its launches (the window fills and every
 * launch waits for good): it goes one unit per launch, and its slot stays free. */
static int test_a_stream_whose_completion_thread_cannot_start_is_not_tracked(void) {
    qsc_lp_forked();
    CUstream stream = (CUstream)(uintptr_t)0x1000;
    CUcontext ctx = (CUcontext)(uintptr_t)0x2000;
    EXPECT(!qsc_lp_tracks(&no_session, stream, ctx));
    EXPECT(atomic_load(&lp.claimed) == 0);
    return 0;
}

/* Driver stand-ins for a completion thread's fence: the calling thread's current context, and
 * the context each event was made in. */
static _Thread_local CUcontext stub_current;
static CUcontext made_in[4];
static unsigned made;

static CUresult stub_set_current(CUcontext ctx) { return stub_current = ctx, CUDA_SUCCESS; }

static CUresult stub_event_create(CUevent *ev, unsigned int flags) {
    (void)flags;
    if (made == 4) return CUDA_ERROR_OUT_OF_MEMORY;
    made_in[made] = stub_current;
    *ev = (CUevent)(uintptr_t)(0x100 + made++);
    return CUDA_SUCCESS;
}

static CUresult stub_event_record(CUevent ev, CUstream stream) {
    return (void)ev, (void)stream, CUDA_SUCCESS;
}

/* A slot freed by a stream of context A is claimed for a stream of context B after its
 * completion thread last looked at the slot's context (A is still current to it), and a launch
 * is counted with no marker (other streams were busy). The tail fence the thread then records
 * is made in B, the stream's context: an event of A would not belong to the stream (and A may
 * be destroyed). */
static int test_a_tail_fence_is_made_in_the_streams_context_after_the_slot_changed_context(void) {
    qsc_lp_forked();
    qsc_real_table[QSC_cuCtxSetCurrent] = (void *)stub_set_current;
    qsc_real_table[QSC_cuEventCreate] = (void *)stub_event_create;
    qsc_real_table[QSC_cuEventRecord] = (void *)stub_event_record;
    CUcontext a = (CUcontext)(uintptr_t)0xa000, b = (CUcontext)(uintptr_t)0xb000;
    lp_stream *st = &lp.streams[0];
    stub_current = a; /* what the thread made current while the slot was A's */
    atomic_store(&st->thread_started, 1); /* its thread runs (this one, below) */
    pthread_mutex_lock(&lp.bind_lock);
    EXPECT(claim(&no_session, (CUstream)(uintptr_t)0x5000, b) == st);
    pthread_mutex_unlock(&lp.bind_lock);
    atomic_store(&st->launched, 1);
    atomic_store(&lp.launched, 1);
    complete_round(st); /* the burst has paused: the tail is fenced */
    EXPECT(made == 1 && made_in[0] == b);
    return 0;
}

/* A launch into a live stream found its slot; then, before it is counted, a destroy of a context
 * the interposer could not name (every context's streams are dropped) marks the slot gone.
 * With the device gate on, the launch's wait on the gate word goes into the stream it was
 * launched into: before, it went to the slot's marker, an invalid handle, which the driver
 * refused, and the device gate was turned off for the rest of the process. */
static int test_a_counted_launch_gates_its_own_stream_after_its_slot_was_dropped(void) {
    qsc_lp_forked();
    CUstream stream = (CUstream)(uintptr_t)0x7000;
    lp_stream *st = &lp.streams[0];
    atomic_store(&st->claimed, 1);
    atomic_store(&st->stream, stream);
    launching = st; /* as qsc_lp_tracks left it */
    qsc_lp_context_dies(NULL);
    dgate_on = 1;
    gate_waits_into = NULL;
    qsc_lp_counted(stream, 1000);
    dgate_on = 0;
    EXPECT(gate_waits_into == stream);
    return 0;
}

int main(void) {
    static const unit_test tests[] = {
        {"completion thread does not sleep while a fence is pending",
         test_completion_thread_does_not_sleep_while_a_fence_is_pending},
        {"the window bounds the launches in flight summed over streams",
         test_the_window_bounds_the_launches_in_flight_summed_over_streams},
        {"a launch ended before the total counts it does not hold the window",
         test_a_launch_ended_before_the_total_counts_it_does_not_hold_the_window},
        {"a launch holds the window at its own stream's hold",
         test_a_launch_holds_the_window_at_its_own_streams_hold},
        {"a stream whose completion thread cannot start is not tracked",
         test_a_stream_whose_completion_thread_cannot_start_is_not_tracked},
        {"a tail fence is made in the stream's context after the slot changed context",
         test_a_tail_fence_is_made_in_the_streams_context_after_the_slot_changed_context},
        {"a counted launch gates its own stream after its slot was dropped",
         test_a_counted_launch_gates_its_own_stream_after_its_slot_was_dropped},
    };
    return UNIT_RUN_ALL(tests);
}

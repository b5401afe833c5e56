/* unit_tracker.c — tracker.c's per-launch units tested on their own: the file is compiled into
 * this program with stand-ins for the interposer's other parts and the driver calls it makes,
 * so a test can put it where a process can be (no thread can start) and check what follows.
 * Built with AddressSanitizer and UBSan (`make -C native/cuda unit`). */
#include "../tracker.c"
#include "unit_runner.h"

#include <stdio.h>

/* ---- stand-ins for the rest of the interposer and the driver ---- */
void *qsc_real_table[QSC_N_ALL];
static qsc_session no_session = {.failure = CUDA_ERROR_DEINITIALIZED};
const qsc_session *qsc_enter(void) { return &no_session; }
int qsc_ctx_on_card(const qsc_session *s, CUcontext ctx) { return (void)s, (void)ctx, 1; }
void qsc_leave(const qsc_session *s) { (void)s; }
void qsc_thread_ignores_captures(void) {}
CUstreamCaptureMode qsc_capture_mode(CUstreamCaptureMode mode) { return mode; }
uint64_t qsc_ctx_epoch(CUcontext ctx) { return (void)ctx, 0; }
int qsc_ctx_destroying(CUcontext ctx) { return (void)ctx, 0; }
CUcontext qsc_stream_context(CUstream stream, CUcontext current) {
    return (void)stream, current;
}
void qsc_ctx_wait_destroys(CUcontext ctx) { (void)ctx; }
CUresult qsc_event_create_in(CUcontext ctx, CUevent *ev, unsigned int flags) {
    return (void)ctx, (void)ev, (void)flags, CUDA_ERROR_NOT_SUPPORTED;
}
void qsc_warn_once(int key, const char *fmt, ...) { (void)key, (void)fmt; }
int qsc_start_thread(void *(*main)(void *), void *arg, const char *what) {
    return (void)main, (void)arg, (void)what, 1; /* a process at its thread limit */
}
CUresult qsc_cu_status(int status) { return (void)status, CUDA_ERROR_NOT_PERMITTED; }
int qsc_hp_coalescable(CUstream stream) { return (void)stream, 0; }
int qsc_hp_join(CUstream stream) { return (void)stream, 0; }
void qsc_hp_joined(void) {}
int qsc_hp_try_open(void) { return 0; }
int qsc_hp_opened(CUstream stream, CUcontext ctx, CUresult rc) {
    return (void)stream, (void)ctx, (void)rc, 0;
}
int qsc_lp_tracks(const qsc_session *s, CUstream stream, CUcontext ctx) {
    return (void)s, (void)stream, (void)ctx, 0;
}
static uint64_t most_units_seen; /* the most units lp_wait_window counted in the window */
int qsc_lp_wait_window(uint64_t window_ns, uint64_t units) {
    (void)window_ns;
    if (units > most_units_seen) most_units_seen = units;
    return 1;
}
void qsc_lp_opening(const qsc_session *s) { (void)s; }
void qsc_lp_counted(CUstream stream, uint64_t window_ns) { (void)stream, (void)window_ns; }
uint64_t qsc_lp_window(const qsc_session *s) { return (void)s, 0; }

static CUresult event_done(CUevent ev) { return (void)ev, CUDA_SUCCESS; }

/* ---- tests ---- */

/* A unit is handed to the ring, but the thread that waits for units to complete cannot start:
 * the unit must still be ended (before, it waited for a later launch to end it, and after the
 * process's last launch its units stayed in flight for good: high priority busy for good). */
static int test_a_unit_is_ended_when_the_reaper_cannot_start(void) {
    static int end_event;
    qsc_real_table[QSC_cuEventSynchronize] = (void *)event_done;
    qsc_real_table[QSC_cuEventQuery] = (void *)event_done;
    current.end = (CUevent)&end_event;
    append();
    EXPECT(atomic_load(&tracker.head) == atomic_load(&tracker.tail));
    return 0;
}

static _Atomic int churning;

/* A count this large is a wrapped one (about 2^64). The units appended while the counting
 * thread is descheduled between its two reads are many on a loaded machine (QSC_LP_MAX_INFLIGHT,
 * 2^20, was passed in 10 ms of it: a failure of this test under a full test run), never 2^40. */
#define WRAPPED (1ull << 40)

/* Units appended and ended as fast as they come, one in flight at most: what a reaper and a
 * launching thread do to the ring's counters while another thread counts the window. */
static void *churn_units(void *arg) {
    (void)arg;
    while (atomic_load_explicit(&churning, memory_order_relaxed)) {
        atomic_fetch_add(&tracker.tail, 1);
        atomic_fetch_add(&tracker.head, 1);
    }
    return NULL;
}

/* Low priority counts the per-launch units in its window as the ring's tail less its head while
 * other threads append and end units: at most those appended meanwhile too, never a wrapped
 * count (before, the tail was read
 * first, a unit appended and ended in between made the head pass it, and the count wrapped to
 * about 2^64 units, so a launch with room waited for a completion or one past the window
 * went). */
static int test_the_units_counted_in_the_window_never_wrap(void) {
    memset(&tracker, 0, sizeof tracker);
    most_units_seen = 0;
    atomic_store(&churning, 1);
    pthread_t churner;
    if (pthread_create(&churner, NULL, churn_units, NULL) != 0) return 1;
    for (int i = 0; i < 20000000 && most_units_seen < WRAPPED; i++)
        lp_wait_window(1000000);
    atomic_store(&churning, 0);
    pthread_join(churner, NULL);
    EXPECT(most_units_seen < WRAPPED);
    return 0;
}

int main(void) {
    static const unit_test tests[] = {
        {"a unit is ended when the reaper cannot start",
         test_a_unit_is_ended_when_the_reaper_cannot_start},
        {"the units counted in the window never wrap", test_the_units_counted_in_the_window_never_wrap},
    };
    return UNIT_RUN_ALL(tests);
}

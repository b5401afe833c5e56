/* unit_hp_unit.c — hp_unit.c's coalesced units tested on their own: the file is compiled into
 * this program with stand-ins for the interposer's other parts and the driver calls it makes,
 * so a test can put it where a process can be (no thread can start) and check what follows.
 * Built with AddressSanitizer and UBSan (`make -C native/cuda unit`). */
#include "../hp_unit.c"
#include "unit_runner.h"

#include <stdio.h>

/* ---- stand-ins for the rest of the interposer and the driver ---- */
void *qsc_real_table[QSC_N_ALL];
_Atomic int qsc_stats_on;
static qsc_session no_session = {.failure = CUDA_ERROR_DEINITIALIZED};
const qsc_session *qsc_enter(void) { return &no_session; }
void qsc_leave(const qsc_session *s) { (void)s; }
void qsc_thread_ignores_captures(void) {}
void qsc_record_begin(void) {}
void qsc_record_end(void) {}
void qsc_stats_count(int counter, uint64_t n) { (void)counter, (void)n; }
uint64_t qsc_ctx_epoch(CUcontext ctx) { return (void)ctx, 0; }
int qsc_ctx_destroying(CUcontext ctx) { return (void)ctx, 0; }
CUresult qsc_event_create_in(CUcontext ctx, CUevent *ev, unsigned int flags) {
    return (void)ctx, QSC_REAL(qsc_event_create_fn, cuEventCreate)(ev, flags);
}
void qsc_ctx_wait_destroys(CUcontext ctx) { (void)ctx; }
int qsc_stream_unrecordable(CUstream stream) { return (void)stream, 0; }
void qsc_warn_once(int key, const char *fmt, ...) { (void)key, (void)fmt; }
int qsc_start_thread(void *(*main)(void *), void *arg, const char *what) {
    return (void)main, (void)arg, (void)what, 1; /* a process at its thread limit */
}

static CUresult stub_event_create(CUevent *ev, unsigned int flags) {
    static int event;
    return (void)flags, *ev = (CUevent)&event, CUDA_SUCCESS;
}
static CUresult stub_event_record(CUevent ev, CUstream stream) {
    return (void)ev, (void)stream, CUDA_SUCCESS;
}
int qsc_stream_capturing(CUstream stream) { return (void)stream, 0; }

/* ---- tests ---- */

/* A launch opens a unit, but the completion thread that would end it cannot start: the unit
 * must not stay open (high priority would be busy for good, and every low-priority launch on
 * the card held at the gate for good). The opening launch is ended by its caller, and later
 * launches do not try to open units. */
static int test_a_unit_is_not_left_open_when_its_completion_thread_cannot_start(void) {
    qsc_real_table[QSC_cuEventCreate] = (void *)stub_event_create;
    qsc_real_table[QSC_cuEventRecord] = (void *)stub_event_record;
    CUstream stream = (CUstream)(uintptr_t)0x5000;
    CUcontext ctx = (CUcontext)(uintptr_t)0xc000;
    EXPECT(qsc_hp_try_open());
    EXPECT(qsc_hp_opened(stream, ctx, CUDA_SUCCESS) == 0);
    EXPECT(atomic_load(&hp.state) == HP_IDLE);
    EXPECT(!qsc_hp_try_open());
    return 0;
}

/* The program destroys the open unit's stream, and the driver hands its handle to a new
 * stream: a launch into the new stream must not join the unit (its work would be taken for
 * covered by the old stream's fence, and the unit would end before it), nor may the fence be
 * recorded into the new stream by the old one's name. */
static int test_a_new_stream_with_a_destroyed_streams_handle_does_not_join_its_unit(void) {
    qsc_hp_forked(); /* a fresh state */
    CUstream stream = (CUstream)(uintptr_t)0x5000;
    atomic_store(&hp.stream, stream); /* a unit open on `stream`, as qsc_hp_opened leaves it */
    atomic_store(&hp.state, HP_OPEN);
    EXPECT(qsc_hp_join(stream));
    qsc_hp_joined();
    qsc_hp_stream_destroyed(stream);
    EXPECT(!qsc_hp_join(stream)); /* the recycled handle: a new stream */
    EXPECT(record_fence(qsc_stream_capturing) == CUDA_ERROR_INVALID_HANDLE);
    qsc_hp_forked();
    return 0;
}

static _Thread_local CUcontext stub_current;
static CUresult stub_get_current(CUcontext *ctx) { return *ctx = stub_current, CUDA_SUCCESS; }

/* A unit open on context A's legacy default stream: a launch into the legacy stream while
 * context B is current goes into B's legacy stream, another stream that A's fence does not
 * follow, so it must not join the unit (the unit would end before its work); a launch with A
 * current joins. */
static int test_the_legacy_stream_of_another_context_does_not_join_the_unit(void) {
    qsc_hp_forked();
    qsc_real_table[QSC_cuCtxGetCurrent] = (void *)stub_get_current;
    CUcontext a = (CUcontext)(uintptr_t)0xa000, b = (CUcontext)(uintptr_t)0xb000;
    hp.ctx = a;
    atomic_store(&hp.stream, CU_STREAM_LEGACY);
    atomic_store(&hp.state, HP_OPEN);
    stub_current = b;
    EXPECT(!qsc_hp_join(CU_STREAM_LEGACY));
    stub_current = a;
    EXPECT(qsc_hp_join(CU_STREAM_LEGACY));
    qsc_hp_joined();
    qsc_hp_forked();
    return 0;
}

int main(void) {
    static const unit_test tests[] = {
        {"a unit is not left open when its completion thread cannot start",
         test_a_unit_is_not_left_open_when_its_completion_thread_cannot_start},
        {"a new stream with a destroyed stream's handle does not join its unit",
         test_a_new_stream_with_a_destroyed_streams_handle_does_not_join_its_unit},
        {"the legacy stream of another context does not join the unit",
         test_the_legacy_stream_of_another_context_does_not_join_the_unit},
    };
    return UNIT_RUN_ALL(tests);
}

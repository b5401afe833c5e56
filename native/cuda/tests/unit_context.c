/* unit_context.c — context.c's epoch table tested on its own: the file is compiled into this
 * program with stand-ins for the interposer's other parts and no driver, so a test can set the
 * state another thread leaves (a lock held at a fork) and check what a call does from there.
 * Built with AddressSanitizer and UBSan (`make -C native/cuda unit`). */
#include "../context.c"
#include "unit_runner.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- stand-ins for the rest of the interposer ---- */
void *qsc_real_table[QSC_N_ALL];
void qsc_resolve(void) {}
void qsc_lp_context_dies(CUcontext ctx) { (void)ctx; }
void qsc_hp_stream_destroyed(CUstream stream) { (void)stream; }
void qsc_lp_stream_destroyed(const qsc_session *s, CUstream stream) { (void)s, (void)stream; }
static qsc_session no_session = {.failure = CUDA_ERROR_DEINITIALIZED};
const qsc_session *qsc_enter(void) { return &no_session; }
const qsc_session *qsc_session_get(void) { return &no_session; }
void qsc_leave(const qsc_session *s) { (void)s; }

/* ---- tests ---- */

/* Another thread is destroying a context (it holds the epoch table's lock) when the process
 * forks. The child, the forking thread alone, destroys a context: it must not wait for good on
 * a lock that no thread of its own will release. */
static int test_a_child_forked_while_the_epoch_table_is_locked_can_destroy_a_context(void) {
    CUcontext ctx = (CUcontext)(uintptr_t)0xc000;
    context_dies(epoch_of(ctx)); /* the process has destroyed a context before */
    pthread_mutex_lock(&epochs_lock); /* as another thread's destroy holds it */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        alarm(2);
        context_dies(epoch_of(ctx));
        _exit(0);
    }
    pthread_mutex_unlock(&epochs_lock);
    int status = 0;
    EXPECT(child > 0 && waitpid(child, &status, 0) == child);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}

/* ---- a driver whose destroy of one context is held until the test lets it return ---- */
static struct CUctx_st *const CTX_A = (CUcontext)(uintptr_t)0xa000;
static struct CUctx_st *const CTX_B = (CUcontext)(uintptr_t)0xb000;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cond = PTHREAD_COND_INITIALIZER;
static int b_inside, b_released;

static CUresult destroy_holding_b(CUcontext ctx) {
    if (ctx != CTX_B) return CUDA_SUCCESS;
    pthread_mutex_lock(&held_lock);
    b_inside = 1;
    pthread_cond_broadcast(&held_cond);
    while (!b_released) pthread_cond_wait(&held_cond, &held_lock);
    pthread_mutex_unlock(&held_lock);
    return CUDA_SUCCESS;
}

static void *destroy_b(void *arg) {
    (void)arg;
    cuCtxDestroy_v2(CTX_B);
    return NULL;
}

static _Atomic int waited;

static void *wait_for(void *ctx) {
    qsc_ctx_wait_destroys(ctx);
    atomic_store(&waited, 1);
    return NULL;
}

/* Let B's destroy return, and wait for its thread and the waiter (unless it is B's). */
static void release_b(pthread_t b, pthread_t waiter) {
    pthread_mutex_lock(&held_lock);
    b_released = 1;
    pthread_cond_broadcast(&held_cond);
    pthread_mutex_unlock(&held_lock);
    pthread_join(b, NULL);
    if (!pthread_equal(b, waiter)) pthread_join(waiter, NULL);
}

/* Start destroying B on a thread of its own; return once it is inside the driver's call. */
static int start_destroying_b(pthread_t *b) {
    qsc_real_table[QSC_cuCtxDestroy_v2] = (void *)destroy_holding_b;
    b_inside = b_released = 0;
    atomic_store(&waited, 0);
    if (pthread_create(b, NULL, destroy_b, NULL) != 0) return 0;
    pthread_mutex_lock(&held_lock);
    while (!b_inside) pthread_cond_wait(&held_cond, &held_lock);
    pthread_mutex_unlock(&held_lock);
    return 1;
}

/* 1 once `flag` is set, polled for at most `ms`. */
static int set_within(_Atomic int *flag, long ms) {
    struct timespec tick = {0, 1000000L};
    for (long i = 0; i < ms && !atomic_load(flag); i++) nanosleep(&tick, NULL);
    return atomic_load(flag);
}

/* Context A's events died with it, and A's destroy has returned (the driver drained A's work)
 * while another thread's destroy of context B is still inside the driver. A wait for A's work
 * returns now: it is not held until B's destroy returns too (a completion thread held so kept
 * A's ended launches in the window, and high priority busy, for as long as other contexts were
 * being destroyed: for good while some thread always was). */
static int test_a_wait_for_one_contexts_destroy_does_not_wait_for_another_contexts(void) {
    pthread_t b, waiter;
    EXPECT(start_destroying_b(&b));
    EXPECT(cuCtxDestroy_v2(CTX_A) == CUDA_SUCCESS);
    EXPECT(pthread_create(&waiter, NULL, wait_for, CTX_A) == 0);
    int returned = set_within(&waited, 500);
    release_b(b, waiter);
    EXPECT(returned);
    return 0;
}

/* The wait for B's work lasts until B's destroy returned (the driver drained it). */
static int test_a_wait_for_a_contexts_destroy_lasts_until_the_destroy_returns(void) {
    pthread_t b, waiter;
    EXPECT(start_destroying_b(&b));
    EXPECT(qsc_ctx_destroying(CTX_B) && !qsc_ctx_destroying(CTX_A));
    EXPECT(pthread_create(&waiter, NULL, wait_for, CTX_B) == 0);
    int early = set_within(&waited, 100);
    release_b(b, waiter);
    EXPECT(!early && atomic_load(&waited));
    EXPECT(!qsc_ctx_destroying(CTX_B));
    return 0;
}

/* A child forked while another thread destroys B has no destroy under way (that thread is not
 * the child's): a wait for B's work in it returns at once, never for good. */
static int test_a_child_forked_during_a_destroy_does_not_wait_for_it(void) {
    pthread_t b;
    EXPECT(start_destroying_b(&b));
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        alarm(2);
        qsc_ctx_wait_destroys(CTX_B);
        _exit(qsc_ctx_destroying(CTX_B));
    }
    release_b(b, b);
    int status = 0;
    EXPECT(child > 0 && waitpid(child, &status, 0) == child);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}

/* ---- a driver with a current context per thread, which refuses to make a dead one current ---- */
static struct CUctx_st *const CTX_DEAD = (CUcontext)(uintptr_t)0xdead0;
static _Thread_local CUcontext current_ctx;
static CUresult get_current_rc;
static int events_made;
static CUcontext event_made_in;

static CUresult fake_get_current(CUcontext *ctx) {
    if (get_current_rc == CUDA_SUCCESS) *ctx = current_ctx;
    return get_current_rc;
}

static CUresult fake_set_current(CUcontext ctx) {
    if (ctx == CTX_DEAD) return CUDA_ERROR_INVALID_CONTEXT;
    current_ctx = ctx;
    return CUDA_SUCCESS;
}

static CUresult fake_event_create(CUevent *ev, unsigned int flags) {
    (void)flags;
    static int event;
    events_made++;
    event_made_in = current_ctx;
    *ev = (CUevent)&event;
    return current_ctx != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static void use_fake_contexts(CUresult get_rc) {
    qsc_real_table[QSC_cuCtxGetCurrent] = (void *)fake_get_current;
    qsc_real_table[QSC_cuCtxSetCurrent] = (void *)fake_set_current;
    qsc_real_table[QSC_cuEventCreate] = (void *)fake_event_create;
    get_current_rc = get_rc;
    current_ctx = CTX_A;
    events_made = 0;
    event_made_in = NULL;
}

/* An event is made in another context than the current one: that context made current for
 * the call, and the thread's own current again after. */
static int test_an_event_is_made_in_the_context_asked_for_and_the_current_one_restored(void) {
    use_fake_contexts(CUDA_SUCCESS);
    CUevent ev = NULL;
    EXPECT(qsc_event_create_in(CTX_B, &ev, 0) == CUDA_SUCCESS);
    EXPECT(events_made == 1 && event_made_in == CTX_B && current_ctx == CTX_A);
    return 0;
}

/* The context asked for cannot be made current (it died): no event is made, in the current
 * context or any, and the error says so; the current context stays. Before, the event was made
 * in the current context, could never be recorded into the stream, and was leaked once its
 * context's epoch moved. */
static int test_no_event_is_made_when_its_context_cannot_be_made_current(void) {
    use_fake_contexts(CUDA_SUCCESS);
    CUevent ev = NULL;
    EXPECT(qsc_event_create_in(CTX_DEAD, &ev, 0) == CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(events_made == 0 && ev == NULL && current_ctx == CTX_A);
    return 0;
}

/* The current context cannot be read: no event is made (it could not be said which context
 * it would be made in, nor the current one restored), and that error is returned. */
static int test_no_event_is_made_when_the_current_context_cannot_be_read(void) {
    use_fake_contexts(CUDA_ERROR_DEINITIALIZED);
    CUevent ev = NULL;
    EXPECT(qsc_event_create_in(CTX_B, &ev, 0) == CUDA_ERROR_DEINITIALIZED);
    EXPECT(events_made == 0 && ev == NULL && current_ctx == CTX_A);
    return 0;
}

int main(void) {
    static const unit_test tests[] = {
        {"a child forked while the epoch table is locked can destroy a context",
         test_a_child_forked_while_the_epoch_table_is_locked_can_destroy_a_context},
        {"a wait for one context's destroy does not wait for another context's",
         test_a_wait_for_one_contexts_destroy_does_not_wait_for_another_contexts},
        {"a wait for a context's destroy lasts until the destroy returns",
         test_a_wait_for_a_contexts_destroy_lasts_until_the_destroy_returns},
        {"a child forked during a destroy does not wait for it",
         test_a_child_forked_during_a_destroy_does_not_wait_for_it},
        {"an event is made in the context asked for and the current one restored",
         test_an_event_is_made_in_the_context_asked_for_and_the_current_one_restored},
        {"no event is made when its context cannot be made current",
         test_no_event_is_made_when_its_context_cannot_be_made_current},
        {"no event is made when the current context cannot be read",
         test_no_event_is_made_when_the_current_context_cannot_be_read},
    };
    return UNIT_RUN_ALL(tests);
}

/* unit_context.c — context.c's epoch table tested on its own: the file is compiled into this
 * program with stand-ins for the interposer's other parts and no driver, so a test can set the
 * state another thread leaves (a lock held at a fork) and check what a call does from there.
 * Built with AddressSanitizer and UBSan (`make -C native/cuda unit`). */
#include "../context.c"
#include "unit_runner.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- stand-ins for the rest of the interposer ---- */
void *qsc_real_table[QSC_N_ALL];
void qsc_resolve(void) {}
void qsc_lp_context_dies(CUcontext ctx) { (void)ctx; }
void qsc_hp_stream_destroyed(CUstream stream) { (void)stream; }
void qsc_lp_stream_destroyed(const qsc_session *s, CUstream stream) { (void)s, (void)stream; }
static qsc_session no_session = {.failure = CUDA_ERROR_DEINITIALIZED};
const qsc_session *qsc_enter(void) { return &no_session; }
void qsc_leave(const qsc_session *s) { (void)s; }

/* ---- tests ---- */

/* Another thread is destroying a context (it holds the epoch table's lock) when the process
 * forks. The child, the forking thread alone, destroys a context: it must not wait for good on
 * a lock that no thread of its own will release. */
static int test_a_child_forked_while_the_epoch_table_is_locked_can_destroy_a_context(void) {
    CUcontext ctx = (CUcontext)(uintptr_t)0xc000;
    context_dies(ctx); /* the process has destroyed a context before */
    pthread_mutex_lock(&epochs_lock); /* as another thread's destroy holds it */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        alarm(2);
        context_dies(ctx);
        _exit(0);
    }
    pthread_mutex_unlock(&epochs_lock);
    int status = 0;
    EXPECT(child > 0 && waitpid(child, &status, 0) == child);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}

int main(void) {
    static const unit_test tests[] = {
        {"a child forked while the epoch table is locked can destroy a context",
         test_a_child_forked_while_the_epoch_table_is_locked_can_destroy_a_context},
    };
    return UNIT_RUN_ALL(tests);
}

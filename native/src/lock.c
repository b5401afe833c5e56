/* lock.c — robust process-shared mutexes: a holder killed at any instruction leaves
 * the lock to the next locker, which repairs the guarded data before going on. A vGPU's memory
 * lock lives in its memory part, which the vGPU's tenants map writable (the owner never takes
 * it): one that a tenant takes and keeps (or a stopped process holds) fails the locker with
 * QS_ETIMEDOUT after QS_LOCK_WAIT_NS, never holds it for good. */
#include "internal.h"

#include <errno.h>
#include <time.h>

#define QS_LOCK_WAIT_NS 1000000000ull /* critical sections last microseconds */

int qs_robust_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t attr;
    if (pthread_mutexattr_init(&attr))
        return qs_fail(QS_ESYS, "pthread_mutexattr_init failed");
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    int r = pthread_mutex_init(m, &attr);
    pthread_mutexattr_destroy(&attr);
    return r ? qs_fail(QS_ESYS, "pthread_mutex_init failed: %d", r) : QS_OK;
}

int qs_robust_lock(pthread_mutex_t *m, void (*recover)(void *), void *arg)
{
    struct timespec deadline; /* timedlock's clock: CLOCK_REALTIME */
    clock_gettime(CLOCK_REALTIME, &deadline);
    uint64_t ns = (uint64_t)deadline.tv_nsec + QS_LOCK_WAIT_NS;
    deadline.tv_sec += (time_t)(ns / 1000000000ull);
    deadline.tv_nsec = (long)(ns % 1000000000ull);
    int r = pthread_mutex_timedlock(m, &deadline);
    if (r == EOWNERDEAD) {
        if (recover)
            recover(arg);
        pthread_mutex_consistent(m);
        return QS_OK;
    }
    if (r == ENOTRECOVERABLE)
        return qs_fail(QS_ECORRUPT, "a segment lock is not recoverable");
    if (r == ETIMEDOUT)
        return qs_fail(QS_ETIMEDOUT, "a segment lock was held for over %llu ms (by a stopped "
                                     "process, or a tenant keeping it)",
                       (unsigned long long)(QS_LOCK_WAIT_NS / 1000000ull));
    return r ? qs_fail(QS_ESYS, "pthread_mutex_lock failed: %d", r) : QS_OK;
}

void qs_robust_unlock(pthread_mutex_t *m)
{
    pthread_mutex_unlock(m);
}

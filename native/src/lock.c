/* lock.c — robust process-shared mutexes: a holder killed at any instruction leaves
 * the lock to the next locker, which repairs the guarded data before going on. */
#include "internal.h"

#include <errno.h>

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
    int r = pthread_mutex_lock(m);
    if (r == EOWNERDEAD) {
        if (recover)
            recover(arg);
        pthread_mutex_consistent(m);
        return QS_OK;
    }
    if (r == ENOTRECOVERABLE)
        return qs_fail(QS_ECORRUPT, "a segment lock is not recoverable");
    return r ? qs_fail(QS_ESYS, "pthread_mutex_lock failed: %d", r) : QS_OK;
}

void qs_robust_unlock(pthread_mutex_t *m)
{
    pthread_mutex_unlock(m);
}

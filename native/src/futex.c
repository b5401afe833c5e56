/* futex.c — waiting on and waking 32-bit words in shared memory, and small atomics. */
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint64_t qs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleep while *word == expected, until woken or CLOCK_MONOTONIC reaches deadline_ns
 * (0: no deadline). Returns 0, or QS_ETIMEDOUT. Spurious returns are the caller's to loop on. */
int qs_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t deadline_ns)
{
    struct timespec ts, *tp = NULL;
    if (deadline_ns) {
        ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
        ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
        tp = &ts;
    }
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, expected, tp, NULL,
                     FUTEX_BITSET_MATCH_ANY);
    if (r == -1 && errno == ETIMEDOUT)
        return QS_ETIMEDOUT;
    return 0;
}

void qs_futex_wake(_Atomic uint32_t *word, int count)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, count, NULL, NULL, 0);
}

void qs_atomic_max(_Atomic uint64_t *word, uint64_t value)
{
    uint64_t cur = atomic_load(word);
    while (cur < value && !atomic_compare_exchange_weak(word, &cur, value)) {
    }
}

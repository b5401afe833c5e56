/* test_races.c — threads sharing one context (as they do under the CUDA interposer): the
 * low-priority in-flight bound holds and launch counts are exact. Built under ASan/UBSan with
 * the other C tests, and under ThreadSanitizer by `make tsan`. */
#include "harness.h"
#include "node.h"

#include <pthread.h>
#include <stdlib.h>

#define GiB (1ull << 30)

enum { THREADS = 4, ROUNDS = 20000 };

struct shared {
    qs_client *cl;
    _Atomic int inside, max_inside, failures;
};

static void *launch_loop(void *arg)
{
    struct shared *sh = arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (qs_launch_begin(sh->cl) != QS_OK) {
            atomic_fetch_add(&sh->failures, 1);
            continue;
        }
        int now = atomic_fetch_add(&sh->inside, 1) + 1;
        int max = atomic_load(&sh->max_inside);
        while (now > max && !atomic_compare_exchange_weak(&sh->max_inside, &max, now)) {
        }
        for (int k = 0; k < 50; k++) /* keep the unit in flight a moment */
            qs_cpu_relax();
        atomic_fetch_sub(&sh->inside, 1);
        qs_launch_end(sh->cl);
    }
    return NULL;
}

static int run_threads(uint32_t prio, const char *tag, struct shared *sh, qs_vgpu_stats *st)
{
    qs_node *node = NULL;
    qs_vgpu_spec spec = {.id = 1, .card = 0, .priority = prio, .core_share = 50, .mem_limit = GiB};
    if (qs_node_create(test_segment(tag), NULL, 1, &node) || qs_card_add(node, 0, "GPU-r", GiB) ||
        qs_vgpu_create(node, &spec) || qs_client_attach(test_segment(tag), NULL, 1, &sh->cl))
        return 1;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, launch_loop, sh);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    int rc = qs_vgpu_stats_get(node, 1, st);
    qs_client_detach(sh->cl);
    qs_node_close(node);
    return rc;
}

static int test_low_priority_inflight_bound_holds_across_threads(void)
{
    struct shared sh = {0};
    qs_vgpu_stats st;
    EXPECT(run_threads(QS_PRIO_LOW, "lpbound", &sh, &st) == 0);
    EXPECT(atomic_load(&sh.failures) == 0);
    EXPECT(atomic_load(&sh.max_inside) == 1); /* the vGPU's bound: one unit in flight */
    return 0;
}

static int test_launch_counts_are_exact_across_threads(void)
{
    struct shared sh = {0};
    qs_vgpu_stats st;
    EXPECT(run_threads(QS_PRIO_HIGH, "counts", &sh, &st) == 0);
    EXPECT(st.launches == (uint64_t)THREADS * ROUNDS);
    return 0;
}

enum { PUSHERS = 3, PUSHES = 20000 };

static void *push_loop(void *arg)
{
    struct qs_ring *ring = ((void **)arg)[0];
    uint32_t who = (uint32_t)(uintptr_t)((void **)arg)[1];
    for (uint32_t i = 0; i < PUSHES; i++)
        qs_ring_push(ring, 1, who, i, (int32_t)who, ((uint64_t)who << 32) | i);
    return NULL;
}

/* Every event read is one a pusher wrote whole, and each pusher's events come in order; the
 * ring may drop the oldest when the consumer falls behind, and says how many. */
static int test_event_ring_reads_whole_events_while_threads_push(void)
{
    struct qs_ring *ring = calloc(1, sizeof *ring);
    EXPECT(ring != NULL);
    pthread_t t[PUSHERS];
    void *args[PUSHERS][2];
    for (uintptr_t i = 0; i < PUSHERS; i++) {
        args[i][0] = ring;
        args[i][1] = (void *)i;
        pthread_create(&t[i], NULL, push_loop, args[i]);
    }
    struct qs_ring_cursor cur = {0};
    int64_t last[PUSHERS] = {-1, -1, -1};
    uint64_t read = 0, torn = 0;
    qs_event ev;
    while (read + atomic_load(&ring->dropped) < (uint64_t)PUSHERS * PUSHES &&
           qs_ring_pop(ring, &cur, &ev, 1000) == QS_OK) {
        read++;
        if (ev.card >= PUSHERS || ev.value != (((uint64_t)ev.card << 32) | ev.vgpu) ||
            (int64_t)ev.vgpu <= last[ev.card] || ev.pid != (int32_t)ev.card)
            torn++;
        else
            last[ev.card] = ev.vgpu;
    }
    for (int i = 0; i < PUSHERS; i++)
        pthread_join(t[i], NULL);
    EXPECT(torn == 0);
    EXPECT(read + atomic_load(&ring->dropped) == (uint64_t)PUSHERS * PUSHES);
    free(ring);
    return 0;
}

int main(void)
{
    const struct test_case tests[] = {
        {"low-priority in-flight bound holds across threads",
         test_low_priority_inflight_bound_holds_across_threads},
        {"launch counts are exact across threads", test_launch_counts_are_exact_across_threads},
        {"event ring reads whole events while threads push",
         test_event_ring_reads_whole_events_while_threads_push},
    };
    return run_tests(tests, sizeof tests / sizeof tests[0]);
}

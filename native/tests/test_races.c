/* test_races.c — threads sharing one context (as they do under the CUDA interposer): the
 * low-priority in-flight bound holds and launch counts are exact; memory counts stay exact
 * while the owner reaps without the vGPU's memory lock. Built under ASan/UBSan with
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

/* Processes of one vGPU come and go (the owner reaps each without the vGPU's memory lock) while
 * others reserve and release under it: no reservation passes the limit, and once all are gone
 * the vGPU counts nothing and serves its whole limit again, not a byte more. */
enum { MEM_THREADS = 3, MEM_ROUNDS = 150, MEM_LIMIT_MIB = 64 };

struct mem_shared {
    const char *seg;
    qs_node *node;
    _Atomic int failures, over;
};

static void *attach_reserve_leave(void *arg)
{
    struct mem_shared *sh = arg;
    for (int i = 0; i < MEM_ROUNDS; i++) {
        qs_client *cl = NULL;
        if (qs_client_attach(sh->seg, NULL, 1, &cl) != QS_OK) {
            atomic_fetch_add(&sh->failures, 1);
            continue;
        }
        for (int k = 0; k < 8; k++) {
            int rc = qs_mem_reserve(cl, 3ull << 20);
            if (rc != QS_OK && rc != QS_ENOMEM)
                atomic_fetch_add(&sh->failures, 1);
            qs_vgpu_stats st;
            if (qs_vgpu_stats_get(sh->node, 1, &st) == QS_OK &&
                st.mem_used > ((uint64_t)MEM_LIMIT_MIB << 20))
                atomic_fetch_add(&sh->over, 1);
            if (k % 3 == 2 && qs_mem_release(cl, 1ull << 20) != QS_OK)
                atomic_fetch_add(&sh->failures, 1);
        }
        qs_client_detach(cl); /* what it still holds goes back in the owner's reap */
    }
    return NULL;
}

static int test_memory_counts_stay_exact_while_the_owner_reaps(void)
{
    struct mem_shared sh = {.seg = test_segment("memreap")};
    qs_vgpu_spec spec = {.id = 1, .card = 0, .priority = QS_PRIO_LOW, .core_share = 50,
                         .mem_limit = (uint64_t)MEM_LIMIT_MIB << 20};
    EXPECT(qs_node_create(sh.seg, NULL, 1, &sh.node) == QS_OK);
    EXPECT(qs_card_add(sh.node, 0, "GPU-r", GiB) == QS_OK && qs_vgpu_create(sh.node, &spec) == 0);
    pthread_t t[MEM_THREADS];
    for (int i = 0; i < MEM_THREADS; i++)
        pthread_create(&t[i], NULL, attach_reserve_leave, &sh);
    for (int i = 0; i < MEM_THREADS; i++)
        pthread_join(t[i], NULL);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(sh.node, 1, &st) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(sh.seg, NULL, 1, &cl) == QS_OK);
    int full = qs_mem_reserve(cl, spec.mem_limit), more = qs_mem_reserve(cl, 1);
    qs_client_detach(cl);
    qs_node_close(sh.node);
    EXPECT(atomic_load(&sh.failures) == 0 && atomic_load(&sh.over) == 0);
    EXPECT(st.mem_used == 0 && full == QS_OK && more == QS_ENOMEM);
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
        {"memory counts stay exact while the owner reaps",
         test_memory_counts_stay_exact_while_the_owner_reaps},
    };
    return run_tests(tests, sizeof tests / sizeof tests[0]);
}

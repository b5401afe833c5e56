/* test_races.c — threads sharing one context (as they do under the CUDA interposer): the
 * low-priority in-flight bound holds and launch counts are exact. Built under ASan/UBSan with
 * the other C tests, and under ThreadSanitizer by `make tsan`. */
#include "harness.h"
#include "node.h"

#include <pthread.h>

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

int main(void)
{
    const struct test_case tests[] = {
        {"low-priority in-flight bound holds across threads",
         test_low_priority_inflight_bound_holds_across_threads},
        {"launch counts are exact across threads", test_launch_counts_are_exact_across_threads},
    };
    return run_tests(tests, sizeof tests / sizeof tests[0]);
}

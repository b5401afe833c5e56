/* qshare_testnode.c — TEST FIXTURE: a minimal node owner for the CUDA tests and
 * benchmarks (on machines where the node agent and the Python binding are not set up).
 * It creates a segment with the cards and vGPUs named on the command line, prints
 * "ready", then prints every driver event as a line and answers commands on stdin:
 *   stats ID | suspend ID | resume ID | window CARD US (LP window) | memhold ID MS (the vGPU's
 *   memory lock kept MS ms, as by another process reserving) | quit (or end of input).
 * Usage: qshare-testnode --name N [--dir D] [--release-delay-ms MS] [--release-auto-us BOUND]
 *        [--lp-window-us US] --card UUID:TOTAL_BYTES ... --vgpu ID:CARD:high|low:SHARE:LIMIT ... */
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "node.h"
#include "qshare.h"

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stopping;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_lock);
    vprintf(fmt, ap);
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    va_end(ap);
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "qshare-testnode: %s: %s (%s)\n", what, qs_strerror(rc), qs_last_error());
    return 1;
}

static void *event_loop(void *arg) {
    qs_node *node = arg;
    while (!atomic_load(&stopping)) {
        qs_event ev;
        if (qs_node_next_event(node, &ev, 50) != QS_OK) continue;
        say("event kind=%u card=%u vgpu=%u pid=%d value=%llu time=%llu\n", ev.kind, ev.card,
            ev.vgpu, ev.pid, (unsigned long long)ev.value, (unsigned long long)ev.time_ns);
    }
    return NULL;
}

static int add_card(qs_node *node, uint32_t index, const char *spec) {
    char uuid[QS_UUID_MAX];
    unsigned long long total = 0;
    if (sscanf(spec, "%63[^:]:%llu", uuid, &total) != 2) return fail("bad --card", QS_EINVAL);
    int rc = qs_card_add(node, index, uuid, total);
    return rc == QS_OK ? 0 : fail("qs_card_add", rc);
}

static int add_vgpu(qs_node *node, const char *spec) {
    unsigned id, card, share;
    char prio[8];
    unsigned long long limit;
    if (sscanf(spec, "%u:%u:%7[a-z]:%u:%llu", &id, &card, prio, &share, &limit) != 5)
        return fail("bad --vgpu", QS_EINVAL);
    qs_vgpu_spec v = {.id = id, .card = card, .core_share = share, .mem_limit = limit,
                      .priority = strcmp(prio, "high") == 0 ? QS_PRIO_HIGH : QS_PRIO_LOW};
    int rc = qs_vgpu_create(node, &v);
    return rc == QS_OK ? 0 : fail("qs_vgpu_create", rc);
}

/* The lock of the vGPU's memory part, taken and kept a while by a thread of its own (the thread
 * that takes a mutex gives it back), as another process between its check and its add would. */
typedef struct holding {
    pthread_mutex_t *lock;
    unsigned long long ms;
    sem_t taken;
    int rc;
} holding;

static void *hold_main(void *arg) {
    holding *h = arg;
    h->rc = pthread_mutex_lock(h->lock);
    sem_post(&h->taken);
    if (h->rc != 0) return NULL;
    struct timespec ts = {(time_t)(h->ms / 1000u), (long)(h->ms % 1000u) * 1000000L};
    nanosleep(&ts, NULL);
    pthread_mutex_unlock(h->lock);
    return NULL;
}

/* Answers once the lock is taken; one hold at a time. */
static void memhold(qs_node *node, unsigned id, unsigned long long ms) {
    static holding h;
    int slot = qs_find_vgpu(node->seg.cfg, id);
    pthread_t thread;
    if (slot < 0 || node->seg.vmem[slot] == NULL) {
        say("memhold rc=%d\n", QS_ENOENT);
        return;
    }
    h = (holding){.lock = &node->seg.vmem[slot]->lock, .ms = ms};
    sem_init(&h.taken, 0, 0);
    if (pthread_create(&thread, NULL, hold_main, &h) != 0) {
        h.rc = QS_ESYS;
    } else {
        pthread_detach(thread);
        sem_wait(&h.taken);
    }
    say("memhold rc=%d\n", h.rc);
}

static void command(qs_node *node, const char *line) {
    char verb[16] = "";
    unsigned id = 0;
    unsigned long long us = 0;
    if (sscanf(line, "%15s %u %llu", verb, &id, &us) < 1) return;
    if (strcmp(verb, "stats") == 0) {
        qs_vgpu_stats s;
        int rc = qs_vgpu_stats_get(node, id, &s);
        say("stats rc=%d id=%u mem_used=%llu mem_limit=%llu launches=%llu device_ns=%llu "
            "contexts=%u dropped_events=%llu\n",
            rc, id, (unsigned long long)s.mem_used, (unsigned long long)s.mem_limit,
            (unsigned long long)s.launches, (unsigned long long)s.device_ns, s.contexts,
            (unsigned long long)qs_node_dropped_events(node));
    } else if (strcmp(verb, "suspend") == 0) {
        say("suspend rc=%d\n", qs_vgpu_suspend(node, id));
    } else if (strcmp(verb, "resume") == 0) {
        say("resume rc=%d\n", qs_vgpu_resume(node, id));
    } else if (strcmp(verb, "window") == 0) {
        int rc = qs_card_set_lp_window(node, id, us * 1000ull);
        qs_card_stats c = {0};
        if (rc == QS_OK) rc = qs_card_stats_get(node, id, &c);
        say("window rc=%d card=%u lp_window_ns=%llu\n", rc, id, (unsigned long long)c.lp_window_ns);
    } else if (strcmp(verb, "devgate") == 0) {
        int rc = qs_card_set_lp_device_gate(node, id, (int)us);
        qs_card_stats c = {0};
        if (rc == QS_OK) rc = qs_card_stats_get(node, id, &c);
        say("devgate rc=%d card=%u lp_device_gate=%u\n", rc, id, c.lp_device_gate);
    } else if (strcmp(verb, "memhold") == 0) {
        memhold(node, id, us);
    } else {
        say("%s rc=-1 error=unknown-command\n", verb);
    }
}

int main(int argc, char **argv) {
    const char *name = NULL, *dir = NULL;
    unsigned long long delay_ms = 0, auto_bound_us = 0, window_us = 0;
    int have_delay = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--name") == 0) name = argv[i + 1];
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
        if (strcmp(argv[i], "--release-delay-ms") == 0) {
            delay_ms = strtoull(argv[i + 1], NULL, 10);
            have_delay = 1;
        }
        if (strcmp(argv[i], "--release-auto-us") == 0) auto_bound_us = strtoull(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--lp-window-us") == 0) window_us = strtoull(argv[i + 1], NULL, 10);
    }
    qs_node *node = NULL;
    int rc = qs_node_create(name, dir, 1, &node);
    if (rc != QS_OK) return fail("qs_node_create", rc);
    uint32_t cards = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--card") != 0) continue;
        if (add_card(node, cards, argv[i + 1]) != 0) return 1;
        if (have_delay && (rc = qs_card_set_release_delay(node, cards, delay_ms * 1000000ull)))
            return fail("qs_card_set_release_delay", rc);
        if (auto_bound_us &&
            (rc = qs_card_set_release_auto(node, cards, 1, auto_bound_us * 1000ull, 0)))
            return fail("qs_card_set_release_auto", rc);
        if (window_us && (rc = qs_card_set_lp_window(node, cards, window_us * 1000ull)))
            return fail("qs_card_set_lp_window", rc);
        cards++;
    }
    for (int i = 1; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "--vgpu") == 0 && add_vgpu(node, argv[i + 1]) != 0) return 1;
    pthread_t events;
    pthread_create(&events, NULL, event_loop, node);
    say("ready\n");
    char line[128];
    while (fgets(line, sizeof line, stdin) != NULL && strncmp(line, "quit", 4) != 0)
        command(node, line);
    atomic_store(&stopping, 1);
    pthread_join(events, NULL);
    qs_node_close(node);
    return 0;
}

/* stats.c — what the interposer did in this process, for diagnosis on a real GPU. With
 * QSHARE_STATS_FILE set, every launch is counted by the path it took and timed (the
 * interposer's own part apart from the driver's call), low priority's fences and window
 * waits and high priority's fences are counted, and the whole is written to that file as one
 * JSON object when the process exits. Unset, a launch pays one predictable branch. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interposer.h"

#define BUCKETS 256 /* quarter-octave buckets of nanoseconds: 0 .. 2^64 */

typedef struct histogram {
    _Atomic uint64_t count[BUCKETS];
    _Atomic uint64_t sum_ns;
} histogram;

static const char *const path_names[QSC_UNIT_KINDS] = {"untracked", "event", "joined",
                                                       "opening", "batched"};
static const char *const counter_names[QSC_STAT_COUNT] = {
    "failed",          "lp_fences_by_launch", "lp_fences_by_tail", "lp_fence_markers",
    "lp_batches_done", "lp_window_waits",     "lp_window_wait_ns", "hp_fences",
    "lp_device_gate_waits"};

static struct {
    FILE *out;
    int pid; /* the process that opened `out`: a forked child's counters are copies of its */
    _Atomic uint64_t paths[QSC_UNIT_KINDS];
    _Atomic uint64_t counters[QSC_STAT_COUNT];
    histogram own, driver;
} stats;

_Atomic int qsc_stats_on;

/* The bucket of `ns`: its octave times four plus the two bits below its leading one. */
static unsigned bucket_of(uint64_t ns) {
    if (ns < 4) return (unsigned)ns;
    unsigned octave = 63u - (unsigned)__builtin_clzll(ns);
    return octave * 4u + (unsigned)((ns >> (octave - 2u)) & 3u);
}

/* The middle of bucket `b` in ns (the inverse of bucket_of, to within a quarter octave). */
static double bucket_middle(unsigned b) {
    if (b < 4) return (double)b;
    unsigned octave = b / 4u, quarter = b % 4u;
    double low = (double)(1ull << octave) * (1.0 + quarter / 4.0);
    return low * (1.0 + 1.0 / 8.0);
}

static void add(histogram *h, uint64_t ns) {
    atomic_fetch_add_explicit(&h->count[bucket_of(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void qsc_stats_init(void) {
    const char *path = getenv("QSHARE_STATS_FILE");
    if (path == NULL || *path == '\0') return;
    stats.out = fopen(path, "we"); /* close-on-exec: not left open in programs it starts */
    if (stats.out == NULL) {
        qsc_warn_once(QSC_WARN_CONFIG, "QSHARE_STATS_FILE='%s' cannot be written (%s); no "
                                       "statistics will be kept", path, strerror(errno));
        return;
    }
    stats.pid = (int)getpid();
    atomic_store(&qsc_stats_on, 1);
}

void qsc_stats_launch(int tracked, CUresult rc, uint64_t own_ns, uint64_t driver_ns) {
    if (tracked < 0 || tracked >= QSC_UNIT_KINDS) tracked = QSC_UNIT_NONE;
    atomic_fetch_add_explicit(&stats.paths[tracked], 1, memory_order_relaxed);
    if (rc != CUDA_SUCCESS) qsc_stats_count(QSC_STAT_FAILED, 1);
    add(&stats.own, own_ns);
    add(&stats.driver, driver_ns);
}

void qsc_stats_count(int counter, uint64_t n) {
    if (qsc_stats_enabled() && counter >= 0 && counter < QSC_STAT_COUNT)
        atomic_fetch_add_explicit(&stats.counters[counter], n, memory_order_relaxed);
}

/* The value below which `share` of the recorded times lie (bucket middles). */
static double quantile(const histogram *h, uint64_t total, double share) {
    uint64_t want = (uint64_t)((double)total * share), seen = 0;
    for (unsigned b = 0; b < BUCKETS; b++) {
        seen += atomic_load(&h->count[b]);
        if (seen > want) return bucket_middle(b);
    }
    return 0.0;
}

static void write_histogram(const char *name, const histogram *h, uint64_t total) {
    fprintf(stats.out, "\"%s\": {\"sum\": %llu, \"mean\": %.1f, \"p50\": %.0f, \"p99\": %.0f}",
            name, (unsigned long long)atomic_load(&h->sum_ns),
            total ? (double)atomic_load(&h->sum_ns) / (double)total : 0.0,
            quantile(h, total, 0.50), quantile(h, total, 0.99));
}

static uint64_t write_paths(void) {
    uint64_t total = 0;
    fputs("\"launches\": {", stats.out);
    for (int i = 0; i < QSC_UNIT_KINDS; i++) {
        uint64_t n = atomic_load(&stats.paths[i]);
        total += n;
        fprintf(stats.out, "\"%s\": %llu, ", path_names[i], (unsigned long long)n);
    }
    fprintf(stats.out, "\"total\": %llu}, ", (unsigned long long)total);
    return total;
}

/* Written once, at exit (a destructor: after the program's own exit handlers), by the process
 * that opened the file only: a child forked from it holds copies of its counters and writes
 * nothing (the file stays one JSON object). */
__attribute__((destructor)) static void write_at_exit(void) {
    if (!atomic_exchange(&qsc_stats_on, 0) || stats.pid != (int)getpid()) return;
    const qsc_session *s = qsc_session_get();
    fprintf(stats.out, "{\"pid\": %d, \"priority\": \"%s\", ", (int)getpid(),
            s->client == NULL ? "none" : s->low_priority ? "low" : "high");
    uint64_t total = write_paths();
    for (int i = 0; i < QSC_STAT_COUNT; i++)
        fprintf(stats.out, "\"%s\": %llu, ", counter_names[i],
                (unsigned long long)atomic_load(&stats.counters[i]));
    fprintf(stats.out, "\"lp_estimate_ns\": %llu, \"lp_window_ns\": %llu, ",
            (unsigned long long)qsc_lp_estimate_ns(), (unsigned long long)qsc_lp_window_now());
    fputs("\"ns_per_launch\": {", stats.out);
    write_histogram("interposer", &stats.own, total);
    fputs(", ", stats.out);
    write_histogram("driver", &stats.driver, total);
    fputs("}}\n", stats.out);
    fclose(stats.out);
    stats.out = NULL;
}

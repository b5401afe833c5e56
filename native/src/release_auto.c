/* release_auto.c — the auto release rule as pure functions of a decayed history of high
 * priority's gaps and low priority's kernels: the owner's release thread (gate.c) and models
 * (`qshare bench model`, through the binding) decide with the same code. */
#include "node.h"

#include <string.h>

#define AUTO_DECAY 0.99           /* per period: the history forgets with tau = 2 s */
#define AUTO_MIN_GAPS 50.0        /* until this many gaps are seen, keep the maximum delay */
#define AUTO_GAIN 4.0             /* expose a gap only if LP gains 4x what HP loses */
#define AUTO_MARGIN 2u            /* twice the shortest gap worth exposing */
#define AUTO_REQUEST_GAP_LOG2 21u /* gaps of 2^21 ns (2.1 ms) or more separate HP requests */

uint32_t qs_release_auto_bucket(uint64_t gap_ns)
{
    if (gap_ns == 0)
        return 0;
    uint32_t b = 63u - (uint32_t)__builtin_clzll(gap_ns);
    return b < QS_RELEASE_AUTO_BUCKETS ? b : QS_RELEASE_AUTO_BUCKETS - 1;
}

int qs_release_auto_fold(qs_release_auto_history *h, const qs_release_auto_period *p)
{
    if (!h || !p)
        return qs_fail(QS_EINVAL, "auto release: history and period must not be NULL");
    for (uint32_t b = 0; b < QS_RELEASE_AUTO_BUCKETS; b++) {
        h->gaps_seen += p->gap_count[b];
        h->gap_count[b] = h->gap_count[b] * AUTO_DECAY + (double)p->gap_count[b];
        h->gap_sum_ns[b] = h->gap_sum_ns[b] * AUTO_DECAY + (double)p->gap_sum_ns[b];
    }
    /* Weighted by launches, so that a period in which low priority ran one long kernel (its
     * process woke late, say) moves the mean by one kernel, not by a whole period. */
    h->lp_device_ns = h->lp_device_ns * AUTO_DECAY + (double)p->lp_device_ns;
    h->lp_launches = h->lp_launches * AUTO_DECAY + (double)p->lp_launches;
    return QS_OK;
}

void qs_release_auto_restart(qs_release_auto_history *h)
{
    memset(h->gap_count, 0, sizeof h->gap_count);
    memset(h->gap_sum_ns, 0, sizeof h->gap_sum_ns);
    h->gaps_seen = 0;
}

uint64_t qs_release_auto_penalty(const qs_release_auto_history *h, uint64_t inflight,
                                 uint64_t held_ns, uint64_t bound_ns)
{
    if (!h)
        return 0;
    if (h->lp_launches < 1.0) /* LP has not run lately: assume it costs the bound */
        return inflight ? (bound_ns ? bound_ns : 1) : 0;
    /* Both saturate at UINT64_MAX: LP's counters are in the state part, which any tenant can
     * rewrite, and a product past 2^64 must not wrap (or convert, undefined) into a short one. */
    double mean = h->lp_device_ns / h->lp_launches * (double)inflight;
    uint64_t per_kernel = mean < 0x1p64 ? (uint64_t)mean : UINT64_MAX;
    uint64_t windowed = held_ns && inflight > UINT64_MAX / held_ns ? UINT64_MAX
                                                                    : inflight * held_ns;
    return per_kernel > windowed ? per_kernel : windowed;
}

/* Each gap longer than the delay is "exposed": low priority gets its remainder, and high
 * priority's next launch waits `penalty` behind low priority's work. Exposures are counted per
 * request (gaps shorter than 2^AUTO_REQUEST_GAP_LOG2 ns are taken as inside one request, as the
 * device gaps of a host-bound model are): a delay is a candidate only if a request's exposures
 * cost at most the bound. Among the candidates, take the bucket boundary that maximises what
 * low priority harvests minus AUTO_GAIN times what high priority loses, doubled for margin. */
uint64_t qs_release_auto_choose(const qs_release_auto_history *h, uint64_t bound,
                                uint64_t max_delay, uint64_t penalty)
{
    const uint32_t n = QS_RELEASE_AUTO_BUCKETS;
    double cnt_ge[QS_RELEASE_AUTO_BUCKETS + 1] = {0}, sum_ge[QS_RELEASE_AUTO_BUCKETS + 1] = {0};
    if (!h || max_delay == 0)
        return max_delay;
    for (int b = (int)n - 1; b >= 0; b--) {
        cnt_ge[b] = cnt_ge[b + 1] + h->gap_count[b];
        sum_ge[b] = sum_ge[b + 1] + h->gap_sum_ns[b];
    }
    /* Warm-up counts every gap seen, not the decayed count: that one settles at the gap rate
     * times the time constant, so a steady 30 requests/s would hover about 60 and fall back to
     * the maximum whenever a quiet second took it under 50, and under 25/s never leave it. */
    if ((double)h->gaps_seen < AUTO_MIN_GAPS || cnt_ge[0] <= 0.0 || penalty == 0 ||
        penalty > bound)
        return max_delay;
    double cost = AUTO_GAIN * (double)penalty, delay = (double)max_delay;
    double requests = cnt_ge[AUTO_REQUEST_GAP_LOG2] > 1.0 ? cnt_ge[AUTO_REQUEST_GAP_LOG2] : 1.0;
    uint32_t top = 63u - (uint32_t)__builtin_clzll(max_delay);
    top = top + 1 < n ? top + 1 : n;
    double best = sum_ge[top] - cnt_ge[top] * delay - cost * cnt_ge[top];
    for (int b = (int)top - 1; b >= 0; b--) {
        double d = b ? (double)(1ull << b) : 0.0;
        double inside = (uint32_t)b < AUTO_REQUEST_GAP_LOG2 ? cnt_ge[b] - requests : 0.0;
        if ((1.0 + (inside > 0.0 ? inside : 0.0) / requests) * (double)penalty > (double)bound)
            continue; /* a request would wait behind LP more often than the bound allows */
        double net = sum_ge[b] - cnt_ge[b] * d - cost * cnt_ge[b];
        if (d < (double)max_delay && net > best) {
            best = net;
            delay = d;
        }
    }
    uint64_t out = (uint64_t)delay * AUTO_MARGIN;
    return out < max_delay ? out : max_delay;
}

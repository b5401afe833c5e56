/* simdev.c — the simulated device: per card one timeline of kernels shared by every process.
 * A launch books the card from the end of the last kernel booked (or from now), first come
 * first served, the way a GPU queues work; its process then sleeps until the kernel ends.
 * A queued kernel runs on time whether or not its process is awake, as on a real card, so
 * host scheduling delays only when work is submitted, never when it runs. Booking is one
 * compare-and-swap: there is no holder to hand on and nothing a dead process leaves held.
 * qs_sim_replay replays a recorded timeline: host gaps, then launches that queue without
 * waiting (bounded by a window of queued device time), ended as the card finishes them. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#define SPIN_BELOW_NS 200000ull /* host gaps shorter than this are spun, longer ones slept */

uint64_t qs_sim_book(struct qs_segment *seg, uint32_t card, uint64_t duration_ns)
{
    _Atomic uint64_t *until = &seg->state->cards[card].sim_busy_until_ns;
    uint64_t now = qs_now_ns(), cur = atomic_load(until), start;
    do {
        start = cur > now ? cur : now;
    } while (!atomic_compare_exchange_weak(until, &cur, start + duration_ns));
    return start;
}

static void replay_sleep_until(uint64_t deadline)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                          .tv_nsec = (long)(deadline % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Host time: a short gap is spent spinning (as the host computes), a long one asleep. */
static void host_gap(uint64_t ns)
{
    uint64_t until = qs_now_ns() + ns;
    if (ns >= SPIN_BELOW_NS)
        replay_sleep_until(until);
    while (qs_now_ns() < until) {
    }
}

struct replay {
    qs_client *cl;
    const uint64_t *dur;
    uint64_t *ends;
    uint32_t head, tail; /* launched [head, tail) not yet ended */
};

/* End the launched kernels the card has finished by `now`. */
static void end_finished(struct replay *r, uint64_t now)
{
    for (; r->head < r->tail && r->ends[r->head] <= now; r->head++) {
        qs_account_device_time(r->cl, r->dur[r->head]);
        qs_launch_end(r->cl);
    }
}

static void wait_window(struct replay *r, uint64_t window_ns)
{
    uint64_t now = qs_now_ns();
    end_finished(r, now);
    while (window_ns && r->head < r->tail && r->ends[r->tail - 1] >= now + window_ns) {
        replay_sleep_until(r->ends[r->tail - 1] - window_ns);
        end_finished(r, now = qs_now_ns());
    }
}

static int replay_launch(struct replay *r, struct qs_segment *seg, uint32_t card)
{
    int rc = qs_launch_begin(r->cl);
    if (rc != QS_OK)
        return rc;
    uint64_t d = r->dur[r->tail];
    r->ends[r->tail] = qs_sim_book(seg, card, d) + d;
    r->tail++;
    return QS_OK;
}

int qs_sim_replay(qs_client *cl, const uint64_t *gap_ns, const uint64_t *dur_ns, uint32_t count,
                  uint64_t window_ns, uint64_t *first_end_ns, uint64_t *last_end_ns)
{
    QS_REQUIRE(cl, "client");
    if (count && (!gap_ns || !dur_ns))
        return qs_fail(QS_EINVAL, "gap_ns and dur_ns must be non-NULL");
    struct replay r = {.cl = cl, .dur = dur_ns, .ends = calloc(count ? count : 1, sizeof(uint64_t))};
    if (!r.ends)
        return qs_fail(QS_ESYS, "out of memory for %u launches", count);
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    uint32_t card;
    struct qs_segment *seg = qs_client_segment(cl, &card);
    int rc = QS_OK;
    qs_client_set_inflight_cap(cl, UINT32_MAX); /* bounded by the window here, not in launches */
    for (uint32_t i = 0; i < count && rc == QS_OK; i++) {
        host_gap(gap_ns[i]);
        wait_window(&r, window_ns);
        rc = replay_launch(&r, seg, card);
    }
    if (r.tail) {
        replay_sleep_until(r.ends[r.tail - 1]);
        end_finished(&r, r.ends[r.tail - 1]);
    }
    qs_client_set_inflight_cap(cl, 0);
    if (first_end_ns)
        *first_end_ns = r.tail ? r.ends[0] : 0;
    if (last_end_ns)
        *last_end_ns = r.tail ? r.ends[r.tail - 1] : 0;
    free(r.ends);
    return rc;
}

/* simdev.c — the simulated device: per card one timeline of kernels shared by every process.
 * A launch books the card from the end of the last kernel booked (or from now), first come
 * first served, the way a GPU queues work; its process then sleeps until the kernel ends.
 * A queued kernel runs on time whether or not its process is awake, as on a real card, so
 * host scheduling delays only when work is submitted, never when it runs. Booking is one
 * compare-and-swap: there is no holder to hand on and nothing a dead process leaves held.
 * qs_sim_replay replays a recorded timeline: host gaps, then launches that queue without
 * waiting (bounded by a window of queued device time), ended as the card finishes them.
 * qs_sim_replay_gated models the interposer's device gate: launches past the booked slice
 * are held, and the next slice is booked only when the card reaches it with the gate open. */
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

#define FEED_LEAD_NS 100000ull /* a gated replay books its next slice this early: the host
                                * wakes late where a card would not (HP may wait this more) */
#define GATE_POLL_NS 20000ull /* ... and looks at a closed gate word this often, as a card polls */

struct replay {
    qs_client *cl;
    const uint64_t *dur;
    uint64_t *ends;
    uint32_t head, booked, tail; /* [head, booked) on the card; [booked, tail) held behind a wait */
    uint64_t held_ns;            /* the device time of the held launches */
    uint64_t slice_ns;           /* 0: a launch books at once (no device gate) */
    struct qs_segment *seg;
    uint32_t card;
};

/* End the launched kernels the card has finished by `now`. */
static void end_finished(struct replay *r, uint64_t now)
{
    for (; r->head < r->booked && r->ends[r->head] <= now; r->head++) {
        qs_account_device_time(r->cl, r->dur[r->head]);
        qs_launch_end(r->cl);
    }
}

static uint64_t last_end(const struct replay *r)
{
    return r->booked ? r->ends[r->booked - 1] : 0;
}

/* The device gate: once the card is (nearly) through the booked slice, and the gate word
 * reads open, book the next slice of held launches. When the next look is due (or 0). */
static uint64_t feed(struct replay *r, uint64_t now)
{
    if (r->booked == r->tail)
        return 0;
    if (now + FEED_LEAD_NS < last_end(r))
        return last_end(r) - FEED_LEAD_NS;
    if (atomic_load(&r->seg->state->cards[r->card].gate) != QS_GATE_OPEN)
        return now + GATE_POLL_NS;
    uint64_t sliced = 0;
    while (r->booked < r->tail && (sliced == 0 || sliced + r->dur[r->booked] <= r->slice_ns)) {
        uint64_t d = r->dur[r->booked];
        r->ends[r->booked++] = qs_sim_book(r->seg, r->card, d) + d;
        r->held_ns -= d;
        sliced += d;
    }
    return r->booked < r->tail ? last_end(r) - FEED_LEAD_NS : 0;
}

/* Sleep (or spin) until `until`, feeding the device gate on the way (at least once). */
static void pass_time(struct replay *r, uint64_t until, int spin)
{
    uint64_t now = qs_now_ns();
    do {
        uint64_t next = r->slice_ns ? feed(r, now) : 0;
        uint64_t wake = next && next < until ? next : until;
        if (!spin && wake > now)
            replay_sleep_until(wake);
        now = qs_now_ns();
    } while (now < until);
}

/* Host time: a short gap is spent spinning (as the host computes), a long one asleep. */
static void host_gap(struct replay *r, uint64_t ns)
{
    pass_time(r, qs_now_ns() + ns, ns < SPIN_BELOW_NS);
}

/* The process's queued device time: booked and not yet run, plus held. */
static uint64_t queued_ns(const struct replay *r, uint64_t now)
{
    return (last_end(r) > now ? last_end(r) - now : 0) + r->held_ns;
}

static void wait_window(struct replay *r, uint64_t window_ns)
{
    uint64_t now = qs_now_ns();
    end_finished(r, now);
    while (window_ns &&
           !qs_lp_window_admits(r->head < r->tail ? queued_ns(r, now) : 0, window_ns)) {
        pass_time(r, now + (queued_ns(r, now) - window_ns) + 1, 0);
        end_finished(r, now = qs_now_ns());
    }
}

static int replay_launch(struct replay *r)
{
    int rc = qs_launch_begin(r->cl);
    if (rc != QS_OK)
        return rc;
    uint64_t d = r->dur[r->tail++];
    if (!r->slice_ns) {
        r->ends[r->booked++] = qs_sim_book(r->seg, r->card, d) + d;
        return QS_OK;
    }
    r->held_ns += d;
    feed(r, qs_now_ns());
    return QS_OK;
}

/* Until every launch has been booked and has ended. */
static void drain(struct replay *r)
{
    while (r->booked < r->tail) {
        uint64_t next = feed(r, qs_now_ns());
        if (next)
            replay_sleep_until(next);
    }
    if (r->booked) {
        replay_sleep_until(last_end(r));
        end_finished(r, last_end(r));
    }
}

int qs_sim_replay(qs_client *cl, const uint64_t *gap_ns, const uint64_t *dur_ns, uint32_t count,
                  uint64_t window_ns, uint64_t *first_end_ns, uint64_t *last_end_ns)
{
    return qs_sim_replay_gated(cl, gap_ns, dur_ns, count, window_ns, 0, first_end_ns,
                               last_end_ns);
}

int qs_sim_replay_gated(qs_client *cl, const uint64_t *gap_ns, const uint64_t *dur_ns,
                        uint32_t count, uint64_t window_ns, uint64_t slice_ns,
                        uint64_t *first_end_ns, uint64_t *last_end_ns)
{
    QS_REQUIRE(cl, "client");
    if (count && (!gap_ns || !dur_ns))
        return qs_fail(QS_EINVAL, "gap_ns and dur_ns must be non-NULL");
    struct replay r = {.cl = cl, .dur = dur_ns, .slice_ns = slice_ns,
                       .ends = calloc(count ? count : 1, sizeof(uint64_t))};
    if (!r.ends)
        return qs_fail(QS_ESYS, "out of memory for %u launches", count);
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    r.seg = qs_client_segment(cl, &r.card);
    int rc = QS_OK;
    qs_client_set_inflight_cap(cl, UINT32_MAX); /* bounded by the window here, not in launches */
    for (uint32_t i = 0; i < count && rc == QS_OK; i++) {
        host_gap(&r, gap_ns[i]);
        wait_window(&r, window_ns);
        rc = replay_launch(&r);
    }
    drain(&r);
    qs_client_set_inflight_cap(cl, 0);
    if (first_end_ns)
        *first_end_ns = r.booked ? r.ends[0] : 0;
    if (last_end_ns)
        *last_end_ns = last_end(&r);
    free(r.ends);
    return rc;
}

/* gate.c — the priority gate of one card. High priority closes it with one atomic
 * exchange and never waits; low priority passes only while it is open, and sleeps on
 * a futex otherwise. Whoever waits (low-priority contexts, the owner's release thread)
 * reopens it once every high-priority context has been quiet for the release delay.
 * The delay is fixed, or chosen by the owner's release thread in auto mode from the gaps
 * high priority leaves between its bursts (see docs/colocation.md). */
#include "node.h"

#include <limits.h>
#include <string.h>

#define GATE_RECHECK_NS 50000000ull /* a client's gate sleep never lasts longer unchecked */
#define BUSY_SLEEP_MIN_NS 100000ull /* at this delay or more, a waiter sleeps through HP's work */

enum release_result { OPENED, NOT_QUIET, QUIET_UNTIL };

static void push(struct qs_segment *seg, uint32_t kind, uint32_t card, uint64_t value)
{
    qs_ring_push(&seg->state->ring, kind, card, UINT32_MAX, 0, value);
}

/* Auto mode: count the gap since high priority last finished, once per gap. Several
 * high-priority contexts overlapping make some gaps look longer than they are. */
static void observe_gap(struct qs_card_state *cs)
{
    uint64_t last = atomic_load(&cs->last_hp_ns), seen = atomic_load(&cs->gap_seen_ns);
    if (!last || last == seen || !atomic_compare_exchange_strong(&cs->gap_seen_ns, &seen, last))
        return;
    uint64_t now = qs_now_ns();
    if (now <= last)
        return;
    uint64_t gap = now - last;
    uint32_t b = qs_release_auto_bucket(gap);
    atomic_fetch_add_explicit(&cs->gap_count[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&cs->gap_sum_ns[b], gap, memory_order_relaxed);
}

void qs_gate_hp_begin(struct qs_segment *seg, uint32_t card)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    if (atomic_load_explicit(&seg->cfg->cards[card].release_auto, memory_order_relaxed))
        observe_gap(cs);
    if (atomic_load(&cs->gate) == QS_GATE_CLOSED)
        return;
    if (atomic_exchange(&cs->gate, QS_GATE_CLOSED) == QS_GATE_OPEN) {
        uint64_t now = qs_now_ns();
        atomic_store(&cs->busy_since_ns, now);
        atomic_fetch_add(&cs->episodes, 1);
        push(seg, QS_EV_BUSY, card, 0);
    }
}

void qs_gate_hp_end(struct qs_card_state *cs)
{
    if (atomic_load(&cs->untimed_sleepers)) {
        atomic_fetch_add(&cs->wake_seq, 1);
        qs_futex_wake(&cs->wake_seq, INT_MAX);
    }
}

/* Every high-priority context of the card has nothing in flight. */
static int hp_quiet(struct qs_segment *seg, struct qs_card_state *cs)
{
    for (int i = qs_mask_next(cs->hp_mask, QS_MASK_WORDS, 0); i >= 0;
         i = qs_mask_next(cs->hp_mask, QS_MASK_WORDS, (uint32_t)i + 1))
        if (atomic_load(&seg->state->ctxs[i].inflight))
            return 0;
    return 1;
}

static uint64_t release_delay(struct qs_segment *seg, uint32_t card)
{
    const struct qs_cfg_card *cc = &seg->cfg->cards[card];
    return atomic_load(&cc->release_auto) ? atomic_load(&cc->auto_delay_ns)
                                          : atomic_load(&cc->release_delay_ns);
}

static uint64_t release_deadline(struct qs_segment *seg, uint32_t card)
{
    return atomic_load(&seg->state->cards[card].last_hp_ns) + release_delay(seg, card);
}

/* While high priority is busy the gate cannot open before now + delay, so a waiter sleeps
 * until then instead of asking every high-priority completion for a wake-up (a system call
 * on high priority's path, and a thread woken on its cores, hundreds of times per request
 * of a host-bound model). Returns 0 for a delay too short to sleep through: such a waiter is
 * woken when high priority turns quiet. */
static uint64_t busy_deadline(struct qs_segment *seg, uint32_t card)
{
    uint64_t delay = release_delay(seg, card);
    return delay >= BUSY_SLEEP_MIN_NS ? qs_now_ns() + delay : 0;
}

static void open_gate(struct qs_segment *seg, uint32_t card, uint64_t now)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    push(seg, QS_EV_IDLE, card, now - atomic_load(&cs->busy_since_ns));
    atomic_fetch_add(&cs->wake_seq, 1);
    qs_futex_wake(&cs->wake_seq, INT_MAX);
}

/* Try to reopen a closed gate. The RELEASING state makes the check and the opening one
 * step: a high-priority launch in between exchanges it back to CLOSED and the final
 * compare-and-swap fails. */
static enum release_result try_release(struct qs_segment *seg, uint32_t card, uint64_t *deadline)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    if (!hp_quiet(seg, cs))
        return NOT_QUIET;
    uint64_t now = qs_now_ns();
    *deadline = release_deadline(seg, card);
    if (now < *deadline)
        return QUIET_UNTIL;
    uint32_t expect = QS_GATE_CLOSED;
    if (!atomic_compare_exchange_strong(&cs->gate, &expect, QS_GATE_RELEASING))
        return expect == QS_GATE_OPEN ? OPENED : NOT_QUIET;
    int ok = hp_quiet(seg, cs) && now >= release_deadline(seg, card);
    expect = QS_GATE_RELEASING;
    if (ok && atomic_compare_exchange_strong(&cs->gate, &expect, QS_GATE_OPEN)) {
        open_gate(seg, card, now);
        return OPENED;
    }
    expect = QS_GATE_RELEASING;
    atomic_compare_exchange_strong(&cs->gate, &expect, QS_GATE_CLOSED);
    atomic_fetch_add(&cs->wake_seq, 1); /* others that saw RELEASING recompute */
    qs_futex_wake(&cs->wake_seq, INT_MAX);
    *deadline = release_deadline(seg, card);
    return hp_quiet(seg, cs) ? QUIET_UNTIL : NOT_QUIET;
}

/* One round of waiting on a closed gate: sleep until the release deadline when high
 * priority is quiet; while it is busy, until now + the delay (busy_deadline), or for a very
 * short delay until it turns quiet; never past `cap` (0: none). Returns 1 once open. */
static int wait_round(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop, uint64_t cap,
                      _Atomic uint32_t *mine)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    qs_count_in(mine, &cs->untimed_sleepers);
    uint32_t seq = atomic_load(&cs->wake_seq);
    uint64_t deadline = 0;
    enum release_result r = atomic_load(&cs->gate) == QS_GATE_OPEN
                                ? OPENED
                                : try_release(seg, card, &deadline);
    if (r == NOT_QUIET)
        deadline = busy_deadline(seg, card);
    int timed = r != OPENED && deadline;
    if (timed)
        qs_count_out(mine, &cs->untimed_sleepers);
    uint64_t until = timed ? deadline : 0;
    if (cap && (!until || cap < until))
        until = cap;
    if (r != OPENED && !(stop && atomic_load(stop)))
        qs_futex_wait(&cs->wake_seq, seq, until);
    if (!timed)
        qs_count_out(mine, &cs->untimed_sleepers);
    return r == OPENED;
}

/* A client's wait: each round is capped, so a wake lost to a corrupted count costs a
 * recheck after GATE_RECHECK_NS, never a hang. */
int qs_gate_wait(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop,
                 _Atomic uint32_t *mine)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    int blocked = 0;
    while (atomic_load(&cs->gate) != QS_GATE_OPEN && !(stop && atomic_load(stop))) {
        blocked = 1;
        if (wait_round(seg, card, stop, qs_now_ns() + GATE_RECHECK_NS, mine))
            break;
    }
    return blocked;
}

/* ---- auto release mode: the owner's view of high priority's gaps (rule: release_auto.c) */
struct auto_model {
    int on;
    uint64_t next_ns;
    uint64_t raw_count[QS_GAP_BUCKETS], raw_sum[QS_GAP_BUCKETS]; /* counters last folded in */
    uint64_t lp_dev, lp_launches; /* low priority's counters last folded in */
    qs_release_auto_history history;
};

/* Low priority's device time, launches and the kernels it may have in flight on `card`. */
static void lp_totals(struct qs_segment *seg, uint32_t card, uint64_t *dev, uint64_t *launches,
                      uint64_t *inflight)
{
    const struct qs_cfg_card *cc = &seg->cfg->cards[card];
    *dev = *launches = *inflight = 0;
    for (int i = qs_mask_next(cc->lp_vgpus, QS_MAX_VGPUS / 64, 0); i >= 0;
         i = qs_mask_next(cc->lp_vgpus, QS_MAX_VGPUS / 64, (uint32_t)i + 1)) {
        uint32_t s = (uint32_t)i;
        struct qs_vgpu_state *vs = &seg->state->vgpus[s];
        uint32_t max = seg->cfg->vgpus[s].lp_max_inflight;
        *dev += atomic_load(&vs->device_ns);
        *launches += qs_vgpu_launches(seg, s);
        *inflight += (uint64_t)atomic_load(&vs->contexts) * (max ? max : 1);
    }
}

/* Fold what the counters gained since the last period into the history; returns the penalty:
 * how long a high-priority launch on a released card waits for the low-priority work in flight. */
static uint64_t auto_observe(struct qs_segment *seg, uint32_t card, struct auto_model *m)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    qs_release_auto_period period = {0};
    for (uint32_t b = 0; b < QS_GAP_BUCKETS; b++) {
        uint64_t c = atomic_load(&cs->gap_count[b]), s = atomic_load(&cs->gap_sum_ns[b]);
        period.gap_count[b] = c - m->raw_count[b];
        period.gap_sum_ns[b] = s - m->raw_sum[b];
        m->raw_count[b] = c;
        m->raw_sum[b] = s;
    }
    uint64_t dev, launches, inflight;
    lp_totals(seg, card, &dev, &launches, &inflight);
    if (launches > m->lp_launches && dev >= m->lp_dev) {
        period.lp_device_ns = dev - m->lp_dev;
        period.lp_launches = launches - m->lp_launches;
    }
    m->lp_dev = dev;
    m->lp_launches = launches;
    qs_release_auto_fold(&m->history, &period);
    /* A launcher that queues by device time (the interposer) may hold its whole window, or
     * with the card's device gate on, one slice of it. */
    const struct qs_cfg_card *cc = &seg->cfg->cards[card];
    uint64_t held = atomic_load(&cc->lp_device_gate) ? QS_LP_DEVICE_GATE_SLICE_NS
                                                     : qs_card_lp_window(cc);
    return qs_release_auto_penalty(&m->history, inflight, held, atomic_load(&cc->auto_bound_ns));
}

/* Run by the release thread: revise the auto delay every QS_RELEASE_AUTO_PERIOD_NS. Returns
 * when to come back (0 while auto mode is off). */
static uint64_t auto_tick(struct qs_segment *seg, uint32_t card, struct auto_model *m)
{
    struct qs_cfg_card *cc = &seg->cfg->cards[card];
    if (!atomic_load(&cc->release_auto)) {
        m->on = 0;
        return 0;
    }
    uint64_t now = qs_now_ns();
    if (!m->on) {
        memset(m, 0, sizeof *m);
        m->on = 1;
        auto_observe(seg, card, m);
        qs_release_auto_restart(&m->history);
        m->next_ns = now + QS_RELEASE_AUTO_PERIOD_NS;
    }
    if (now < m->next_ns)
        return m->next_ns;
    uint64_t penalty = auto_observe(seg, card, m);
    uint64_t delay = qs_release_auto_choose(&m->history, atomic_load(&cc->auto_bound_ns),
                                            atomic_load(&cc->auto_max_delay_ns), penalty);
    atomic_store(&cc->auto_penalty_ns, penalty);
    if (atomic_exchange(&cc->auto_delay_ns, delay) != delay) {
        struct qs_card_state *cs = &seg->state->cards[card];
        atomic_fetch_add(&cs->wake_seq, 1); /* sleepers recompute their deadline */
        qs_futex_wake(&cs->wake_seq, INT_MAX);
    }
    m->next_ns = now + QS_RELEASE_AUTO_PERIOD_NS;
    return m->next_ns;
}

/* The rounds every releaser that waits for nothing else runs: it releases the card on time even
 * when no low-priority context is waiting at the gate; it sleeps on the same futex, and with an
 * auto model (the owner's) wakes every QS_RELEASE_AUTO_PERIOD_NS to revise the delay. It also
 * looks again every GATE_RECHECK_NS: a tenant may write the gate word (the state part is every
 * tenant's) without the wake that comes with every change the driver makes, and low priority's
 * work queued behind the word on the device (the interposer's device gate) has no host thread
 * waiting that would open it. */
static void release_rounds(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop,
                           _Atomic uint32_t *mine, struct auto_model *model)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    while (!atomic_load(stop)) {
        uint64_t tick = model ? auto_tick(seg, card, model) : 0;
        uint64_t recheck = qs_now_ns() + GATE_RECHECK_NS;
        tick = tick && tick < recheck ? tick : recheck;
        if (atomic_load(&cs->gate) != QS_GATE_OPEN) {
            wait_round(seg, card, stop, tick, mine);
            continue;
        }
        qs_count_in(mine, &cs->untimed_sleepers);
        uint32_t seq = atomic_load(&cs->wake_seq);
        if (atomic_load(&cs->gate) == QS_GATE_OPEN && !atomic_load(stop))
            qs_futex_wait(&cs->wake_seq, seq, tick);
        qs_count_out(mine, &cs->untimed_sleepers);
    }
}

/* The owner's thread per card, with the auto release model. */
void qs_gate_release_loop(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop)
{
    struct auto_model model = {0};
    /* the owner's part of untimed_sleepers: an adopter takes it back */
    release_rounds(seg, card, stop, &seg->owner->owner_untimed[card], &model);
}

/* A client standing in for a dead owner (keeper.c): the same rounds, at the delay in force
 * (in auto mode, the last one the owner chose). */
void qs_gate_keep_loop(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop,
                       _Atomic uint32_t *mine)
{
    release_rounds(seg, card, stop, mine, NULL);
}

/* Wake every releaser of the card and have it look at its stop flag. */
void qs_gate_wake_all(struct qs_segment *seg, uint32_t card)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    atomic_fetch_add(&cs->wake_seq, 1);
    qs_futex_wake(&cs->wake_seq, INT_MAX);
}

int qs_card_set_release_auto(qs_node *node, uint32_t index, int enable, uint64_t p99_bound_ns,
                             uint64_t max_delay_ns)
{
    int rc = qs_node_check_card(node, index);
    if (rc != QS_OK)
        return rc;
    max_delay_ns = max_delay_ns ? max_delay_ns : QS_DEFAULT_RELEASE_DELAY_NS;
    if (max_delay_ns > 60000000000ull || p99_bound_ns > 60000000000ull)
        return qs_fail(QS_EINVAL, "auto release: bound and maximum delay must be at most 60 s");
    struct qs_cfg_card *cc = &node->seg.cfg->cards[index];
    if (enable) {
        atomic_store(&cc->auto_bound_ns, p99_bound_ns);
        atomic_store(&cc->auto_max_delay_ns, max_delay_ns);
        atomic_store(&cc->auto_delay_ns, max_delay_ns);
        atomic_store(&cc->auto_penalty_ns, 0);
    }
    atomic_store(&cc->release_auto, enable ? 1u : 0u);
    struct qs_card_state *cs = &node->seg.state->cards[index];
    atomic_fetch_add(&cs->wake_seq, 1); /* the release thread and sleepers recompute */
    qs_futex_wake(&cs->wake_seq, INT_MAX);
    return QS_OK;
}

int qs_card_release_auto_get(qs_node *node, uint32_t index, qs_release_auto_stats *out)
{
    int rc = qs_node_check_card(node, index);
    if (rc != QS_OK)
        return rc;
    if (!out)
        return qs_fail(QS_EINVAL, "out pointer is NULL");
    const struct qs_cfg_card *cc = &node->seg.cfg->cards[index];
    const struct qs_card_state *cs = &node->seg.state->cards[index];
    memset(out, 0, sizeof *out);
    out->enabled = atomic_load(&cc->release_auto);
    out->delay_ns = out->enabled ? atomic_load(&cc->auto_delay_ns)
                                 : atomic_load(&cc->release_delay_ns);
    out->p99_bound_ns = atomic_load(&cc->auto_bound_ns);
    out->max_delay_ns = atomic_load(&cc->auto_max_delay_ns);
    out->penalty_ns = atomic_load(&cc->auto_penalty_ns);
    for (uint32_t b = 0; b < QS_GAP_BUCKETS; b++)
        out->gaps += atomic_load(&cs->gap_count[b]);
    return QS_OK;
}

/* A high-priority context goes away (detach or death): it no longer holds the card,
 * and the release delay counts from now. */
void qs_gate_forget_hp(struct qs_segment *seg, uint32_t card, uint32_t ctx)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    atomic_fetch_and(&cs->hp_mask[ctx / 64], ~(1ull << (ctx % 64)));
    if (atomic_exchange(&seg->state->ctxs[ctx].inflight, 0))
        qs_atomic_max(&cs->last_hp_ns, qs_now_ns());
    atomic_fetch_add(&cs->wake_seq, 1);
    qs_futex_wake(&cs->wake_seq, INT_MAX);
}

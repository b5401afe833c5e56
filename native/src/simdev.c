/* simdev.c — the simulated device: one execution resource per card shared by every
 * process, granted FIFO among contexts and never preempted. A kernel holds it for its
 * duration while its process sleeps, so contexts interleave kernel by kernel as GPU
 * time-slicing does. A holder or waiter that dies is removed by the owner's reaper. */
#include "internal.h"

struct sim_recovery {
    struct qs_segment *seg;
    uint32_t card;
};

static int ctx_alive(struct qs_state *st, uint32_t ctx)
{
    return atomic_load(&st->ctxs[ctx].state) == QS_SLOT_ACTIVE;
}

/* Hand the card to the first live waiter, to start at `start_ns` (0: now). Called with
 * sim_lock held. */
static void grant_next_at(struct qs_state *st, struct qs_card_state *cs, uint64_t start_ns)
{
    cs->sim_holder = 0;
    while (cs->sim_len) {
        uint32_t next = cs->sim_queue[cs->sim_head];
        cs->sim_head = (cs->sim_head + 1) % QS_MAX_CONTEXTS;
        cs->sim_len--;
        struct qs_ctx *c = &st->ctxs[next];
        if (next < QS_MAX_CONTEXTS && ctx_alive(st, next) && atomic_load(&c->sim_waiting)) {
            cs->sim_holder = next + 1;
            atomic_store(&c->sim_start_ns, start_ns);
            atomic_store(&c->sim_grant, 1);
            qs_futex_wake(&c->sim_grant, 1);
            return;
        }
    }
}

static void grant_next(struct qs_state *st, struct qs_card_state *cs)
{
    grant_next_at(st, cs, 0);
}

/* A holder died inside the lock: drop a dead holder and bound the queue. */
static void sim_recover(void *arg)
{
    struct sim_recovery *r = arg;
    struct qs_state *st = r->seg->state;
    struct qs_card_state *cs = &st->cards[r->card];
    if (cs->sim_len > QS_MAX_CONTEXTS || cs->sim_head >= QS_MAX_CONTEXTS) {
        cs->sim_len = 0;
        cs->sim_head = 0;
    }
    if (cs->sim_holder && (cs->sim_holder > QS_MAX_CONTEXTS || !ctx_alive(st, cs->sim_holder - 1)))
        grant_next(st, cs);
}

/* A waiter woken ahead of its start time spins the last stretch: the previous kernel
 * still holds the card and a sleep would overshoot. */
static void wait_start(uint64_t start_ns)
{
    while (start_ns && qs_now_ns() < start_ns)
        qs_cpu_relax();
}

static int lock_card(struct qs_segment *seg, uint32_t card, struct sim_recovery *rec)
{
    rec->seg = seg;
    rec->card = card;
    return qs_robust_lock(&seg->state->cards[card].sim_lock, sim_recover, rec);
}

int qs_sim_acquire(struct qs_segment *seg, uint32_t ctx)
{
    struct qs_ctx *c = &seg->state->ctxs[ctx];
    struct qs_card_state *cs = &seg->state->cards[c->card];
    struct sim_recovery rec;
    int rc = lock_card(seg, c->card, &rec);
    if (rc != QS_OK)
        return rc;
    if (!cs->sim_holder && !cs->sim_len) {
        cs->sim_holder = ctx + 1;
        qs_robust_unlock(&cs->sim_lock);
        return QS_OK;
    }
    atomic_store(&c->sim_grant, 0);
    atomic_store(&c->sim_waiting, 1);
    cs->sim_queue[(cs->sim_head + cs->sim_len) % QS_MAX_CONTEXTS] = ctx;
    cs->sim_len++;
    qs_robust_unlock(&cs->sim_lock);
    while (!atomic_load(&c->sim_grant))
        qs_futex_wait(&c->sim_grant, 0, 0);
    atomic_store(&c->sim_waiting, 0);
    wait_start(atomic_load(&c->sim_start_ns));
    return QS_OK;
}

/* The holder's kernel is about to end at `start_ns`: wake the next waiter now, so that
 * its wake-up latency overlaps the end of this kernel instead of idling the card. */
int qs_sim_hand_on(struct qs_segment *seg, uint32_t ctx, uint64_t start_ns)
{
    struct qs_ctx *c = &seg->state->ctxs[ctx];
    struct qs_card_state *cs = &seg->state->cards[c->card];
    struct sim_recovery rec;
    if (lock_card(seg, c->card, &rec) != QS_OK)
        return 0;
    int handed = cs->sim_holder == ctx + 1 && cs->sim_len;
    if (handed)
        grant_next_at(seg->state, cs, start_ns);
    qs_robust_unlock(&cs->sim_lock);
    return handed && cs->sim_holder != ctx + 1;
}

void qs_sim_release(struct qs_segment *seg, uint32_t ctx)
{
    struct qs_ctx *c = &seg->state->ctxs[ctx];
    struct qs_card_state *cs = &seg->state->cards[c->card];
    struct sim_recovery rec;
    if (lock_card(seg, c->card, &rec) != QS_OK)
        return;
    if (cs->sim_holder == ctx + 1)
        grant_next(seg->state, cs);
    qs_robust_unlock(&cs->sim_lock);
}

/* Owner side: a context went away; if it held the card, pass the card on. Queue
 * entries of dead contexts are skipped by grant_next. */
void qs_sim_reap(struct qs_segment *seg, uint32_t ctx)
{
    struct qs_ctx *c = &seg->state->ctxs[ctx];
    struct qs_card_state *cs = &seg->state->cards[c->card];
    struct sim_recovery rec;
    atomic_store(&c->sim_waiting, 0);
    if (lock_card(seg, c->card, &rec) != QS_OK)
        return;
    if (cs->sim_holder == ctx + 1)
        grant_next(seg->state, cs);
    qs_robust_unlock(&cs->sim_lock);
}

/* policy.c — sharing among the low-priority vGPUs of a card, by device time used.
 * best-effort: no throttle (the card's FIFO shares it kernel by kernel).
 * fixed-share: a budget that refills at the share's rate; a vGPU past it waits.
 * burst-share: weighted fairness on device time scaled by 100/share; a vGPU waits only
 * while it is ahead of another that has work, so idle compute goes to whoever wants it.
 * Waiting is a futex sleep with a computed deadline; the launch path takes no lock. */
#include "internal.h"

#include <limits.h>

#define FS_BUCKET_NS 5000000ull      /* fixed-share: budget a vGPU may bank */
#define BS_SLACK_NS 2000000ull       /* burst-share: lead (scaled) before yielding */
#define BS_LAG_NS 20000000ull        /* burst-share: credit a returning vGPU may bring */
#define ACTIVE_WINDOW_NS 5000000ull  /* a vGPU "has work" this long after its last activity */
#define RECHECK_NS 20000000ull       /* no policy sleep lasts longer without a recheck */

static struct qs_policy_state *pstate(struct qs_segment *seg, uint32_t vslot)
{
    return &seg->state->vgpus[vslot].policy;
}

static int has_work(struct qs_policy_state *ps, uint64_t now)
{
    return atomic_load(&ps->waiting) || now - atomic_load(&ps->last_active_ns) < ACTIVE_WINDOW_NS;
}

struct peers {
    uint64_t min_vtime; /* smallest scaled time among other vGPUs with work */
    uint64_t expires;   /* when the earliest of them stops counting as having work */
};

static struct peers scan_peers(struct qs_segment *seg, uint32_t card, uint32_t self, uint64_t now)
{
    struct peers p = {UINT64_MAX, UINT64_MAX};
    const struct qs_cfg_card *cc = &seg->cfg->cards[card];
    for (int i = qs_mask_next(cc->lp_vgpus, QS_MAX_VGPUS / 64, 0); i >= 0;
         i = qs_mask_next(cc->lp_vgpus, QS_MAX_VGPUS / 64, (uint32_t)i + 1)) {
        uint32_t s = (uint32_t)i;
        struct qs_policy_state *ps = pstate(seg, s);
        if (s == self || !has_work(ps, now))
            continue;
        uint64_t v = atomic_load(&ps->vtime_ns);
        p.min_vtime = v < p.min_vtime ? v : p.min_vtime;
        if (!atomic_load(&ps->waiting)) {
            uint64_t e = atomic_load(&ps->last_active_ns) + ACTIVE_WINDOW_NS;
            p.expires = e < p.expires ? e : p.expires;
        }
    }
    return p;
}

/* A vGPU coming back from idle brings at most BS_LAG_NS of credit. */
static void clamp_returning(struct qs_segment *seg, uint32_t card, uint32_t slot, uint64_t now)
{
    struct qs_policy_state *ps = pstate(seg, slot);
    if (has_work(ps, now))
        return;
    struct peers p = scan_peers(seg, card, slot, now);
    if (p.min_vtime != UINT64_MAX && p.min_vtime > BS_LAG_NS)
        qs_atomic_max(&ps->vtime_ns, p.min_vtime - BS_LAG_NS);
}

/* 0 when the vGPU may launch now, else the deadline to sleep until (UINT64_MAX: until woken). */
static uint64_t hold_until(struct qs_segment *seg, uint32_t card, uint32_t slot, uint64_t now)
{
    uint32_t policy = atomic_load(&seg->cfg->cards[card].policy);
    struct qs_policy_state *ps = pstate(seg, slot);
    if (policy == QS_POLICY_FIXED_SHARE) {
        uint64_t budget = atomic_load(&ps->budget_ns);
        return budget > now ? budget : 0;
    }
    if (policy != QS_POLICY_BURST_SHARE)
        return 0;
    struct peers p = scan_peers(seg, card, slot, now);
    if (p.min_vtime == UINT64_MAX || atomic_load(&ps->vtime_ns) <= p.min_vtime + BS_SLACK_NS)
        return 0;
    return p.expires;
}

/* A burst-share sleeper is released once a peer's scaled time reaches its own less the slack:
 * it publishes that, keeping the least of every sleeper's. */
static void wake_me_at(struct qs_card_state *cs, uint64_t vtime)
{
    uint64_t cur = atomic_load(&cs->policy_wake_vtime);
    while ((cur == 0 || vtime < cur) &&
           !atomic_compare_exchange_weak(&cs->policy_wake_vtime, &cur, vtime)) {
    }
}

/* Every sleep has a deadline: a peer's count leaked or corrupted costs a recheck, not a hang.
 * A burst-share sleeper publishes when to wake it and then looks again, so that accounting
 * which raced with it either reads what it published or is seen by the second look. */
static void sleep_on_policy(struct qs_segment *seg, uint32_t card, uint32_t slot,
                            struct qs_ctx *c, uint64_t deadline)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    uint64_t now = qs_now_ns(), cap = now + RECHECK_NS;
    uint32_t seq = atomic_load(&cs->policy_seq);
    if (atomic_load(&seg->cfg->cards[card].policy) == QS_POLICY_BURST_SHARE) {
        uint64_t mine = atomic_load(&pstate(seg, slot)->vtime_ns);
        wake_me_at(cs, mine > BS_SLACK_NS ? mine - BS_SLACK_NS : 1);
        if ((deadline = hold_until(seg, card, slot, now)) == 0)
            return;
    }
    qs_count_in(&c->policy_sleepers, &cs->policy_waiters);
    qs_futex_wait(&cs->policy_seq, seq, deadline < cap ? deadline : cap);
    qs_count_out(&c->policy_sleepers, &cs->policy_waiters);
}

/* Waiters count per context (and are given back when it is reaped): a process killed here
 * leaves nothing raised. */
int qs_policy_begin(struct qs_segment *seg, uint32_t ctx, uint32_t card, uint32_t slot)
{
    struct qs_ctx *c = &seg->state->ctxs[ctx];
    struct qs_policy_state *ps = pstate(seg, slot);
    uint64_t now = qs_now_ns();
    if (atomic_load(&seg->cfg->cards[card].policy) == QS_POLICY_BURST_SHARE)
        clamp_returning(seg, card, slot, now);
    qs_count_in(&c->policy_waiting, &ps->waiting);
    uint64_t deadline;
    while ((deadline = hold_until(seg, card, slot, now)) != 0) {
        sleep_on_policy(seg, card, slot, c, deadline);
        now = qs_now_ns();
        if (atomic_load(&seg->cfg->vgpus[slot].state) != QS_SLOT_ACTIVE)
            break;
    }
    atomic_store(&ps->last_active_ns, now);
    qs_count_out(&c->policy_waiting, &ps->waiting);
    return QS_OK;
}

static uint64_t scaled(uint64_t ns, uint32_t share)
{
    return ns * 100u / (share ? share : 1u);
}

/* Every sleeper wakes and recomputes; those still held publish when to wake them again. */
static void wake_policy_sleepers(struct qs_card_state *cs, int counted)
{
    atomic_store(&cs->policy_wake_vtime, 0);
    atomic_fetch_add(&cs->policy_seq, 1);
    qs_futex_wake(&cs->policy_seq, INT_MAX);
    if (counted)
        atomic_fetch_add_explicit(&cs->policy_wakes, 1, memory_order_relaxed);
}

/* Fixed-share sleepers wait for their own budget, which another vGPU's accounting never
 * moves: only burst-share sleepers are woken, and only by a peer that may release one. */
void qs_policy_account(struct qs_segment *seg, uint32_t vslot, uint64_t ns)
{
    const struct qs_cfg_vgpu *vc = &seg->cfg->vgpus[vslot];
    if (vc->priority != QS_PRIO_LOW)
        return;
    struct qs_policy_state *ps = pstate(seg, vslot);
    uint64_t now = qs_now_ns(), add = scaled(ns, atomic_load(&vc->core_share));
    uint64_t cur = atomic_load(&ps->budget_ns), next;
    do {
        uint64_t base = cur + FS_BUCKET_NS < now ? now - FS_BUCKET_NS : cur;
        next = base + add;
    } while (!atomic_compare_exchange_weak(&ps->budget_ns, &cur, next));
    uint64_t vtime = atomic_fetch_add(&ps->vtime_ns, add) + add;
    atomic_store(&ps->last_active_ns, now);
    struct qs_card_state *cs = &seg->state->cards[vc->card];
    uint64_t wake_at = atomic_load(&cs->policy_wake_vtime);
    if (wake_at != 0 && vtime >= wake_at)
        wake_policy_sleepers(cs, 1);
}

/* A new epoch of sharing on the card (policy or membership changed): fairness starts level
 * and no fixed-share debt run up under another policy is carried over. */
static void policy_epoch(struct qs_segment *seg, uint32_t card)
{
    const struct qs_cfg_card *cc = &seg->cfg->cards[card];
    uint64_t now = qs_now_ns();
    for (int i = qs_mask_next(cc->lp_vgpus, QS_MAX_VGPUS / 64, 0); i >= 0;
         i = qs_mask_next(cc->lp_vgpus, QS_MAX_VGPUS / 64, (uint32_t)i + 1)) {
        uint32_t s = (uint32_t)i;
        struct qs_policy_state *ps = pstate(seg, s);
        atomic_store(&ps->vtime_ns, 0);
        if (atomic_load(&ps->budget_ns) > now)
            atomic_store(&ps->budget_ns, now);
    }
}

void qs_policy_changed(struct qs_segment *seg, uint32_t card)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    policy_epoch(seg, card);
    wake_policy_sleepers(cs, 0);
}

void qs_policy_membership(struct qs_segment *seg, uint32_t vslot, int member)
{
    const struct qs_cfg_vgpu *vc = &seg->cfg->vgpus[vslot];
    _Atomic uint64_t *word = &seg->cfg->cards[vc->card].lp_vgpus[vslot / 64];
    uint64_t bit = 1ull << (vslot % 64);
    if (member && vc->priority == QS_PRIO_LOW)
        atomic_fetch_or(word, bit);
    else
        atomic_fetch_and(word, ~bit);
    qs_policy_changed(seg, vc->card);
}

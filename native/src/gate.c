/* gate.c — the priority gate of one card. High priority closes it with one atomic
 * exchange and never waits; low priority passes only while it is open, and sleeps on
 * a futex otherwise. Whoever waits (low-priority contexts, the owner's release thread)
 * reopens it once every high-priority context has been quiet for the release delay. */
#include "internal.h"

#include <limits.h>

enum release_result { OPENED, NOT_QUIET, QUIET_UNTIL };

static void push(struct qs_segment *seg, uint32_t kind, uint32_t card, uint64_t value)
{
    qs_ring_push(&seg->state->ring, kind, card, UINT32_MAX, 0, value);
}

void qs_gate_hp_begin(struct qs_segment *seg, uint32_t card)
{
    struct qs_card_state *cs = &seg->state->cards[card];
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
    for (uint32_t w = 0; w < QS_MASK_WORDS; w++) {
        uint64_t bits = atomic_load(&cs->hp_mask[w]);
        while (bits) {
            uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            if (atomic_load(&seg->state->ctxs[i].inflight))
                return 0;
        }
    }
    return 1;
}

static uint64_t release_deadline(struct qs_segment *seg, uint32_t card)
{
    uint64_t delay = atomic_load(&seg->cfg->cards[card].release_delay_ns);
    return atomic_load(&seg->state->cards[card].last_hp_ns) + delay;
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
 * priority is quiet, or until high priority turns quiet. Returns 1 once open. */
static int wait_round(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    atomic_fetch_add(&cs->untimed_sleepers, 1);
    uint32_t seq = atomic_load(&cs->wake_seq);
    uint64_t deadline = 0;
    enum release_result r = atomic_load(&cs->gate) == QS_GATE_OPEN
                                ? OPENED
                                : try_release(seg, card, &deadline);
    if (r == QUIET_UNTIL)
        atomic_fetch_sub(&cs->untimed_sleepers, 1);
    if (r != OPENED && !(stop && atomic_load(stop)))
        qs_futex_wait(&cs->wake_seq, seq, r == QUIET_UNTIL ? deadline : 0);
    if (r != QUIET_UNTIL)
        atomic_fetch_sub(&cs->untimed_sleepers, 1);
    return r == OPENED;
}

int qs_gate_wait(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    int blocked = 0;
    while (atomic_load(&cs->gate) != QS_GATE_OPEN && !(stop && atomic_load(stop))) {
        blocked = 1;
        if (wait_round(seg, card, stop))
            break;
    }
    return blocked;
}

/* The owner's thread per card: it releases the card on time even when no low-priority
 * context is waiting, so that idle events are exact; it sleeps on the same futex. */
void qs_gate_release_loop(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop)
{
    struct qs_card_state *cs = &seg->state->cards[card];
    while (!atomic_load(stop)) {
        if (atomic_load(&cs->gate) != QS_GATE_OPEN) {
            wait_round(seg, card, stop);
            continue;
        }
        atomic_fetch_add(&cs->untimed_sleepers, 1);
        uint32_t seq = atomic_load(&cs->wake_seq);
        if (atomic_load(&cs->gate) == QS_GATE_OPEN && !atomic_load(stop))
            qs_futex_wait(&cs->wake_seq, seq, 0);
        atomic_fetch_sub(&cs->untimed_sleepers, 1);
    }
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

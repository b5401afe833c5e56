/* ring.c — the event ring: lock-free pushes from any process, one consumer (the owner)
 * that waits on a futex. A full ring overwrites the oldest events; the consumer counts
 * what it missed. */
#include "internal.h"

#include <string.h>

/* A slot half-written this long, from when the consumer first found it so, was left by a writer
 * killed mid-push: skip it. Long enough that a writer merely descheduled mid-push on a loaded
 * machine finishes first; a dead writer delays the events behind it this much, once. */
#define TORN_WAIT_NS 250000000ull

/* A writer of an earlier lap still at this slot this long after we first found it there was
 * killed mid-push (or is descheduled: the slot's digest catches its late stores): take the
 * slot over. Writing an event takes nanoseconds. The clock is read every TAKEOVER_CHECK
 * spins, a few microseconds. */
#define TAKEOVER_NS 1000000ull
#define TAKEOVER_CHECK 64u

/* Whether the earlier writer found at this slot has had its time (`since` 0: not timed yet). */
static int writer_overdue(uint64_t *since, uint32_t spins)
{
    if (spins % TAKEOVER_CHECK != 0)
        return 0;
    uint64_t now = qs_now_ns();
    if (*since == 0)
        *since = now;
    return now - *since > TAKEOVER_NS;
}

/* Make ticket `t` the slot's writer: 1 when it is, 0 when a later lap already holds the slot
 * (this event is overwritten before it is written, and the consumer counts it dropped). A
 * writer of an earlier lap that is still writing is waited for, so two writers never mix
 * their events in one slot. */
static int claim_slot(struct qs_ring_slot *slot, uint64_t t)
{
    uint64_t mine = 2 * t + 1, s = atomic_load(&slot->seq), since = 0;
    for (uint32_t spins = 0; s < mine;) {
        if ((s & 1) && !writer_overdue(&since, spins++)) {
            qs_cpu_relax();
            s = atomic_load(&slot->seq);
        } else if (atomic_compare_exchange_weak(&slot->seq, &s, mine)) {
            atomic_thread_fence(memory_order_release); /* seq odd before any payload word */
            return 1;
        }
    }
    return 0;
}

/* A digest of ticket `t` and its event's words: a stray store into the slot changes it. */
static uint64_t digest(uint64_t t, const uint64_t *words)
{
    uint64_t h = t ^ 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < QS_EVENT_WORDS; i++) {
        h = (h ^ words[i]) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    return h * 0x94d049bb133111ebull;
}

void qs_ring_slot_store(struct qs_ring_slot *slot, uint64_t t, const qs_event *ev)
{
    uint64_t words[QS_EVENT_WORDS];
    memcpy(words, ev, sizeof words);
    for (size_t i = 0; i < QS_EVENT_WORDS; i++)
        atomic_store_explicit(&slot->words[i], words[i], memory_order_relaxed);
    atomic_store_explicit(&slot->check, digest(t, words), memory_order_relaxed);
}

void qs_ring_push(struct qs_ring *ring, uint32_t kind, uint32_t card, uint32_t vgpu, int32_t pid,
                  uint64_t value)
{
    uint64_t t = atomic_fetch_add(&ring->head, 1);
    struct qs_ring_slot *slot = &ring->slots[t % QS_EVENT_RING_SIZE];
    if (claim_slot(slot, t)) {
        qs_event ev = {.seq = t, .time_ns = qs_now_ns(), .kind = kind, .card = card,
                       .vgpu = vgpu, .pid = pid, .value = value};
        qs_ring_slot_store(slot, t, &ev);
        uint64_t writing = 2 * t + 1; /* a later lap that took the slot over keeps it */
        atomic_compare_exchange_strong(&slot->seq, &writing, 2 * t + 2);
    }
    if (atomic_load(&ring->consumer_waiting)) {
        atomic_fetch_add(&ring->notify, 1);
        qs_futex_wake(&ring->notify, 1);
    }
}

/* Copy ticket `t` out of its slot: 1 when read whole, 0 while a writer is at it,
 * -1 when a later lap has overwritten it, or a writer taken over for being slow has stored
 * into it since (the digest no longer matches). */
static int read_slot(struct qs_ring *ring, uint64_t t, qs_event *out)
{
    struct qs_ring_slot *slot = &ring->slots[t % QS_EVENT_RING_SIZE];
    uint64_t s = atomic_load_explicit(&slot->seq, memory_order_acquire);
    if (s < 2 * t + 2)
        return 0;
    if (s > 2 * t + 2)
        return -1;
    uint64_t words[QS_EVENT_WORDS];
    for (size_t i = 0; i < QS_EVENT_WORDS; i++)
        words[i] = atomic_load_explicit(&slot->words[i], memory_order_relaxed);
    uint64_t check = atomic_load_explicit(&slot->check, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire); /* the payload before seq's second reading */
    if (atomic_load_explicit(&slot->seq, memory_order_relaxed) != s || check != digest(t, words))
        return -1;
    memcpy(out, words, sizeof *out);
    return 1;
}

static void skip(struct qs_ring *ring, struct qs_ring_cursor *cur, uint64_t n)
{
    cur->tail += n;
    cur->torn_since_ns = 0;
    atomic_fetch_add(&ring->dropped, n);
}

/* Ticket `cur->tail` is half-written: 1 once it has been so for TORN_WAIT_NS, across calls. */
static int torn_too_long(struct qs_ring_cursor *cur)
{
    uint64_t now = qs_now_ns();
    if (cur->torn_since_ns == 0)
        cur->torn_since_ns = now;
    return now - cur->torn_since_ns > TORN_WAIT_NS;
}

static int wait_for_push(struct qs_ring *ring, uint64_t tail, uint64_t deadline)
{
    atomic_store(&ring->consumer_waiting, 1);
    uint32_t n = atomic_load(&ring->notify);
    int rc = 0;
    if (atomic_load(&ring->head) <= tail ||
        read_slot(ring, tail, &(qs_event){0}) == 0)
        rc = qs_futex_wait(&ring->notify, n, deadline);
    atomic_store(&ring->consumer_waiting, 0);
    return rc;
}

int qs_ring_pop(struct qs_ring *ring, struct qs_ring_cursor *cur, qs_event *out, int timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? 0 : qs_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint64_t head = atomic_load(&ring->head);
        if (head - cur->tail > QS_EVENT_RING_SIZE)
            skip(ring, cur, head - cur->tail - QS_EVENT_RING_SIZE);
        if (cur->tail < head) {
            int r = read_slot(ring, cur->tail, out);
            if (r == 1) {
                cur->tail++;
                cur->torn_since_ns = 0;
                return QS_OK;
            }
            if (r < 0 || torn_too_long(cur)) {
                skip(ring, cur, 1);
                continue;
            }
        }
        uint64_t now = qs_now_ns();
        if (deadline && now >= deadline)
            return QS_ETIMEDOUT;
        uint64_t wake = cur->tail < head ? now + 1000000ull : deadline;
        if (deadline && wake > deadline)
            wake = deadline;
        wait_for_push(ring, cur->tail, wake);
    }
}

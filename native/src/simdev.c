/* simdev.c — the simulated device: per card one timeline of kernels shared by every process.
 * A launch books the card from the end of the last kernel booked (or from now), first come
 * first served, the way a GPU queues work; its process then sleeps until the kernel ends.
 * A queued kernel runs on time whether or not its process is awake, as on a real card, so
 * host scheduling delays only when work is submitted, never when it runs. Booking is one
 * compare-and-swap: there is no holder to hand on and nothing a dead process leaves held. */
#include "internal.h"

uint64_t qs_sim_book(struct qs_segment *seg, uint32_t card, uint64_t duration_ns)
{
    _Atomic uint64_t *until = &seg->state->cards[card].sim_busy_until_ns;
    uint64_t now = qs_now_ns(), cur = atomic_load(until), start;
    do {
        start = cur > now ? cur : now;
    } while (!atomic_compare_exchange_weak(until, &cur, start + duration_ns));
    return start;
}

/* memory.c — per-vGPU memory accounting: an exact check-and-add under the robust lock of the
 * vGPU's memory part (vmem.c), with each process's share recorded so that a dead process's
 * reservations return. Every write of a count is one atomic step, so the owner can return a
 * dead process's share without the lock when a tenant of the vGPU keeps it. */
#include "internal.h"

/* How long the owner's reap waits for a vGPU's memory lock (critical sections last
 * microseconds) before it returns the share without it: its service thread serves every vGPU. */
#define QS_REAP_LOCK_WAIT_NS 5000000ull

/* Take up to `bytes` off `*count` (clamped at zero) in one atomic step; what it took. */
static uint64_t count_sub(uint64_t *count, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(count, __ATOMIC_RELAXED), next;
    do
        next = cur > bytes ? cur - bytes : 0;
    while (!__atomic_compare_exchange_n(count, &cur, next, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return cur - next;
}

/* After a holder died inside the lock, the vGPU's total is rebuilt from the reservations
 * (only this vGPU's contexts write its part; a reaped one's entry is zero). */
void qs_mem_recover(void *arg)
{
    struct qs_mem_recovery *r = arg;
    struct qs_vmem *vm = r->seg->vmem[r->vslot];
    uint64_t sum = 0;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        uint64_t r = __atomic_load_n(&vm->reserved[i], __ATOMIC_RELAXED);
        sum = r > UINT64_MAX - sum ? UINT64_MAX : sum + r;
    }
    __atomic_store_n(&vm->used, sum, __ATOMIC_RELAXED);
}

/* Lock vGPU slot `vslot`'s memory part into `*out`. */
static int lock_vgpu(struct qs_segment *seg, uint32_t vslot, struct qs_mem_recovery *rec,
                     struct qs_vmem **out)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    if (!vm)
        return qs_fail(QS_ESTATE, "vGPU slot %u's memory part is not mapped here", vslot);
    rec->seg = seg;
    rec->vslot = vslot;
    int rc = qs_robust_lock(&vm->lock, qs_mem_recover, rec);
    if (rc == QS_OK)
        *out = vm;
    return rc;
}

/* The handle still owns its context: the slot was not reaped (nor reused) since it attached.
 * Checked under the vGPU's lock, which the owner's reap takes too. */
static int check_ref(struct qs_segment *seg, struct qs_ctx_ref ref)
{
    struct qs_ctx *c = &seg->state->ctxs[ref.ctx];
    if (atomic_load(&c->state) != QS_SLOT_ACTIVE || atomic_load(&c->generation) != ref.generation)
        return qs_fail(QS_ESTATE, "this handle's context %u was detached (by this process or a "
                                  "fork of it); attach again", ref.ctx);
    return QS_OK;
}

/* Lock the memory part for a handle that still owns its context. */
static int lock_for(struct qs_segment *seg, struct qs_ctx_ref ref, struct qs_mem_recovery *rec,
                    struct qs_vmem **out)
{
    int rc = lock_vgpu(seg, ref.vslot, rec, out);
    if (rc == QS_OK && (rc = check_ref(seg, ref)) != QS_OK)
        qs_robust_unlock(&(*out)->lock);
    return rc;
}

static int refuse(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes, uint64_t used)
{
    const struct qs_cfg_vgpu *vc = &seg->cfg->vgpus[ref.vslot];
    qs_ring_push(&seg->state->ring, QS_EV_OOM, vc->card, vc->id, seg->state->ctxs[ref.ctx].pid,
                 bytes);
    return qs_fail(QS_ENOMEM, "vGPU %u: %llu bytes asked, %llu of %llu in use", vc->id,
                   (unsigned long long)bytes, (unsigned long long)used,
                   (unsigned long long)atomic_load(&vc->mem_limit));
}

/* Reserve from a client: refused (and an oom event) when it would pass the limit. */
int qs_mem_reserve_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes)
{
    struct qs_mem_recovery rec;
    struct qs_vmem *vm = NULL;
    int rc = lock_for(seg, ref, &rec, &vm);
    if (rc != QS_OK)
        return rc;
    uint64_t limit = atomic_load(&seg->cfg->vgpus[ref.vslot].mem_limit);
    uint64_t used = __atomic_load_n(&vm->used, __ATOMIC_RELAXED); /* only the owner lowers it */
    if (bytes > limit || used > limit - bytes) {
        qs_robust_unlock(&vm->lock);
        return refuse(seg, ref, bytes, used);
    }
    __atomic_fetch_add(&vm->used, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&vm->reserved[ref.ctx], bytes, __ATOMIC_RELAXED);
    qs_robust_unlock(&vm->lock);
    return QS_OK;
}

int qs_mem_release_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes)
{
    struct qs_mem_recovery rec;
    struct qs_vmem *vm = NULL;
    int rc = lock_for(seg, ref, &rec, &vm);
    if (rc != QS_OK)
        return rc;
    uint64_t have = __atomic_load_n(&vm->reserved[ref.ctx], __ATOMIC_RELAXED);
    if (bytes > have) {
        qs_robust_unlock(&vm->lock);
        return qs_fail(QS_ERELEASE, "releasing %llu bytes but this process reserved %llu",
                       (unsigned long long)bytes, (unsigned long long)have);
    }
    count_sub(&vm->reserved[ref.ctx], bytes);
    count_sub(&vm->used, bytes);
    qs_robust_unlock(&vm->lock);
    return QS_OK;
}

/* Owner side, when a context goes away: return all it reserved, from the memory part of the
 * owner's record's vGPU (never the slot a client could have written). Under the lock when it
 * comes within QS_REAP_LOCK_WAIT_NS, else without it (a tenant keeps it, or it is broken):
 * the counts take atomic steps either way, and a tenant keeping its vGPU's lock so holds up
 * the owner (and every other vGPU's attaches and reaps) 5 ms a reap, not 1 s. */
uint64_t qs_mem_reap(struct qs_segment *seg, uint32_t ctx, uint32_t vslot)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    if (ctx >= QS_MAX_CONTEXTS || !vm)
        return 0;
    struct qs_mem_recovery rec = {.seg = seg, .vslot = vslot};
    int locked =
        qs_robust_lock_within(&vm->lock, QS_REAP_LOCK_WAIT_NS, qs_mem_recover, &rec) == QS_OK;
    uint64_t had = count_sub(&vm->used, __atomic_exchange_n(&vm->reserved[ctx], 0,
                                                             __ATOMIC_RELAXED));
    if (locked)
        qs_robust_unlock(&vm->lock);
    return had;
}

/* A vGPU's memory in use, as its memory part counts it (0 where not mapped). */
uint64_t qs_mem_used(struct qs_segment *seg, uint32_t vslot)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    return vm ? __atomic_load_n(&vm->used, __ATOMIC_RELAXED) : 0;
}

/* What context `ctx` of vGPU slot `vslot` has reserved (0 where not mapped). */
uint64_t qs_mem_reserved(struct qs_segment *seg, uint32_t vslot, uint32_t ctx)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    return vm && ctx < QS_MAX_CONTEXTS ? __atomic_load_n(&vm->reserved[ctx], __ATOMIC_RELAXED)
                                       : 0;
}

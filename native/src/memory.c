/* memory.c — per-vGPU memory accounting: an exact check-and-add under the robust lock of the
 * vGPU's memory part (vmem.c), taken by that vGPU's processes only, with each context's share
 * recorded so that a gone process's reservations return. The owner never takes that lock: a
 * tenant of the vGPU can write it (its robust-list links too, which glibc follows on unlock),
 * so the owner takes a gone context's share out in one atomic exchange and flags the vGPU's
 * total, which the next holder of the lock (or a reader) sums again from the shares. */
#include "internal.h"

/* Take up to `bytes` off `*count` (clamped at zero) in one atomic step; what it took. */
static uint64_t count_sub(uint64_t *count, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(count, __ATOMIC_SEQ_CST), next;
    do
        next = cur > bytes ? cur - bytes : 0;
    while (!__atomic_compare_exchange_n(count, &cur, next, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return cur - next;
}

/* What every context of the part has reserved (saturating). */
static uint64_t sum_reserved(const struct qs_vmem *vm)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        uint64_t r = __atomic_load_n(&vm->reserved[i], __ATOMIC_SEQ_CST);
        sum = r > UINT64_MAX - sum ? UINT64_MAX : sum + r;
    }
    return sum;
}

/* Under the lock: the total summed again from the shares, the owner's flag cleared first (a
 * reap flagging after the sum leaves it set for the next holder). */
static void recount(struct qs_vmem *vm)
{
    __atomic_store_n(&vm->recount, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&vm->used, sum_reserved(vm), __ATOMIC_RELAXED);
}

/* After a holder died inside the lock (between its two additions, say), the total is summed
 * again from the shares (only this vGPU's contexts add to its part; a reaped one's is zero). */
void qs_mem_recover(void *arg)
{
    struct qs_mem_recovery *r = arg;
    recount(r->seg->vmem[r->vslot]);
}

/* Lock vGPU slot `vslot`'s memory part into `*out`, its total brought up to date. */
static int lock_vgpu(struct qs_segment *seg, uint32_t vslot, struct qs_mem_recovery *rec,
                     struct qs_vmem **out)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    if (!vm)
        return qs_fail(QS_ESTATE, "vGPU slot %u's memory part is not mapped here", vslot);
    rec->seg = seg;
    rec->vslot = vslot;
    int rc = qs_robust_lock(&vm->lock, qs_mem_recover, rec);
    if (rc == QS_OK && __atomic_load_n(&vm->recount, __ATOMIC_SEQ_CST))
        recount(vm);
    if (rc == QS_OK)
        *out = vm;
    return rc;
}

/* The handle still owns its context: the slot was not reaped (nor reused) since it attached.
 * The owner's reap marks the context before it takes its share out. */
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

/* Add `bytes` to the context's share and the total. The share goes in before the context is
 * checked again: a reap that marked it since either took the share with its own, or left it
 * to be taken back here. */
static int add_share(struct qs_segment *seg, struct qs_ctx_ref ref, struct qs_vmem *vm,
                     uint64_t bytes)
{
    __atomic_store_n(&vm->used, __atomic_load_n(&vm->used, __ATOMIC_RELAXED) + bytes,
                     __ATOMIC_RELAXED);
    __atomic_fetch_add(&vm->reserved[ref.ctx], bytes, __ATOMIC_SEQ_CST);
    if (check_ref(seg, ref) == QS_OK)
        return QS_OK;
    count_sub(&vm->reserved[ref.ctx], bytes);
    recount(vm);
    return qs_fail(QS_ESTATE, "this handle's context %u was detached while it reserved; "
                              "attach again", ref.ctx);
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
    uint64_t used = __atomic_load_n(&vm->used, __ATOMIC_RELAXED);
    if (bytes > limit || used > limit - bytes) {
        qs_robust_unlock(&vm->lock);
        return refuse(seg, ref, bytes, used);
    }
    rc = add_share(seg, ref, vm, bytes);
    qs_robust_unlock(&vm->lock);
    return rc;
}

int qs_mem_release_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes)
{
    struct qs_mem_recovery rec;
    struct qs_vmem *vm = NULL;
    int rc = lock_for(seg, ref, &rec, &vm);
    if (rc != QS_OK)
        return rc;
    uint64_t have = __atomic_load_n(&vm->reserved[ref.ctx], __ATOMIC_SEQ_CST);
    if (bytes > have) {
        qs_robust_unlock(&vm->lock);
        return qs_fail(QS_ERELEASE, "releasing %llu bytes but this process reserved %llu",
                       (unsigned long long)bytes, (unsigned long long)have);
    }
    uint64_t took = count_sub(&vm->reserved[ref.ctx], bytes); /* less if reaped meanwhile */
    uint64_t used = __atomic_load_n(&vm->used, __ATOMIC_RELAXED);
    __atomic_store_n(&vm->used, used > took ? used - took : 0, __ATOMIC_RELAXED);
    qs_robust_unlock(&vm->lock);
    return QS_OK;
}

/* Owner side, when a context goes away (the caller marked it first): take out all it
 * reserved, from the memory part of the owner's record's vGPU (never the slot a client could
 * have written), without the vGPU's lock; the total is summed again by its next holder. */
uint64_t qs_mem_reap(struct qs_segment *seg, uint32_t ctx, uint32_t vslot)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    if (ctx >= QS_MAX_CONTEXTS || !vm)
        return 0;
    uint64_t had = __atomic_exchange_n(&vm->reserved[ctx], 0, __ATOMIC_SEQ_CST);
    if (had)
        __atomic_store_n(&vm->recount, 1, __ATOMIC_SEQ_CST);
    return had;
}

/* A vGPU's memory in use, as its memory part counts it (0 where not mapped): summed from the
 * shares while a reap has left the total to be summed again. */
uint64_t qs_mem_used(struct qs_segment *seg, uint32_t vslot)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    if (!vm)
        return 0;
    if (__atomic_load_n(&vm->recount, __ATOMIC_SEQ_CST))
        return sum_reserved(vm);
    return __atomic_load_n(&vm->used, __ATOMIC_RELAXED);
}

/* What context `ctx` of vGPU slot `vslot` has reserved (0 where not mapped). */
uint64_t qs_mem_reserved(struct qs_segment *seg, uint32_t vslot, uint32_t ctx)
{
    struct qs_vmem *vm = vslot < QS_MAX_VGPUS ? seg->vmem[vslot] : NULL;
    return vm && ctx < QS_MAX_CONTEXTS ? __atomic_load_n(&vm->reserved[ctx], __ATOMIC_RELAXED)
                                       : 0;
}

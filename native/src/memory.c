/* memory.c — per-vGPU memory accounting: an exact check-and-add under the robust lock of the
 * vGPU's memory part (vmem.c), with each process's share recorded so that a dead process's
 * reservations return. */
#include "internal.h"

/* After a holder died inside the lock, the vGPU's total is rebuilt from the reservations
 * (only this vGPU's contexts write its part; a reaped one's entry is zero). */
void qs_mem_recover(void *arg)
{
    struct qs_mem_recovery *r = arg;
    struct qs_vmem *vm = r->seg->vmem[r->vslot];
    uint64_t sum = 0;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        sum = vm->reserved[i] > UINT64_MAX - sum ? UINT64_MAX : sum + vm->reserved[i];
    vm->used = sum;
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
    uint64_t used = vm->used;
    if (bytes > limit || used > limit - bytes) {
        qs_robust_unlock(&vm->lock);
        return refuse(seg, ref, bytes, used);
    }
    vm->used = used + bytes;
    vm->reserved[ref.ctx] += bytes;
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
    uint64_t have = vm->reserved[ref.ctx];
    if (bytes > have) {
        qs_robust_unlock(&vm->lock);
        return qs_fail(QS_ERELEASE, "releasing %llu bytes but this process reserved %llu",
                       (unsigned long long)bytes, (unsigned long long)have);
    }
    vm->reserved[ref.ctx] = have - bytes;
    vm->used = vm->used > bytes ? vm->used - bytes : 0;
    qs_robust_unlock(&vm->lock);
    return QS_OK;
}

/* Owner side, when a context goes away: return all it reserved, from the memory part of the
 * owner's record's vGPU (never the slot a client could have written). */
uint64_t qs_mem_reap(struct qs_segment *seg, uint32_t ctx, uint32_t vslot)
{
    struct qs_mem_recovery rec;
    struct qs_vmem *vm = NULL;
    if (ctx >= QS_MAX_CONTEXTS || lock_vgpu(seg, vslot, &rec, &vm) != QS_OK)
        return 0;
    uint64_t had = vm->reserved[ctx] < vm->used ? vm->reserved[ctx] : vm->used;
    vm->used -= had;
    vm->reserved[ctx] = 0;
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

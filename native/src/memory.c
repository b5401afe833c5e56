/* memory.c — per-vGPU memory accounting: an exact check-and-add under the vGPU's robust
 * lock, with each process's share recorded so that a dead process's reservations return. */
#include "internal.h"

/* After a holder died inside the lock, the vGPU total is rebuilt from the contexts. */
void qs_mem_recover(void *arg)
{
    struct qs_mem_recovery *r = arg;
    struct qs_state *st = r->seg->state;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        struct qs_ctx *c = &st->ctxs[i];
        if (atomic_load(&c->state) == QS_SLOT_ACTIVE && c->vgpu_slot == r->vslot)
            sum += c->mem_reserved;
    }
    st->vgpus[r->vslot].mem_used = sum;
}

static int lock_vgpu(struct qs_segment *seg, uint32_t vslot, struct qs_mem_recovery *rec)
{
    rec->seg = seg;
    rec->vslot = vslot;
    return qs_robust_lock(&seg->state->vgpus[vslot].mem_lock, qs_mem_recover, rec);
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

/* Reserve from a client: refused (and an oom event) when it would pass the limit. */
int qs_mem_reserve_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes)
{
    struct qs_ctx *c = &seg->state->ctxs[ref.ctx];
    struct qs_vgpu_state *vs = &seg->state->vgpus[ref.vslot];
    const struct qs_cfg_vgpu *vc = &seg->cfg->vgpus[ref.vslot];
    struct qs_mem_recovery rec;
    int rc = lock_vgpu(seg, ref.vslot, &rec);
    if (rc != QS_OK)
        return rc;
    if ((rc = check_ref(seg, ref)) != QS_OK) {
        qs_robust_unlock(&vs->mem_lock);
        return rc;
    }
    uint64_t limit = atomic_load(&vc->mem_limit);
    uint64_t used = vs->mem_used;
    if (bytes > limit || used > limit - bytes) {
        qs_robust_unlock(&vs->mem_lock);
        qs_ring_push(&seg->state->ring, QS_EV_OOM, vc->card, vc->id, c->pid, bytes);
        return qs_fail(QS_ENOMEM, "vGPU %u: %llu bytes asked, %llu of %llu in use", vc->id,
                       (unsigned long long)bytes, (unsigned long long)used,
                       (unsigned long long)limit);
    }
    vs->mem_used = used + bytes;
    c->mem_reserved += bytes;
    qs_robust_unlock(&vs->mem_lock);
    return QS_OK;
}

int qs_mem_release_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes)
{
    struct qs_ctx *c = &seg->state->ctxs[ref.ctx];
    struct qs_vgpu_state *vs = &seg->state->vgpus[ref.vslot];
    struct qs_mem_recovery rec;
    int rc = lock_vgpu(seg, ref.vslot, &rec);
    if (rc != QS_OK)
        return rc;
    if ((rc = check_ref(seg, ref)) != QS_OK) {
        qs_robust_unlock(&vs->mem_lock);
        return rc;
    }
    if (bytes > c->mem_reserved) {
        uint64_t have = c->mem_reserved;
        qs_robust_unlock(&vs->mem_lock);
        return qs_fail(QS_ERELEASE, "releasing %llu bytes but this process reserved %llu",
                       (unsigned long long)bytes, (unsigned long long)have);
    }
    c->mem_reserved -= bytes;
    vs->mem_used -= bytes;
    qs_robust_unlock(&vs->mem_lock);
    return QS_OK;
}

/* Owner side, when a context goes away: return all it reserved, from the vGPU of the owner's
 * record (never the slot a client could have written). */
uint64_t qs_mem_reap(struct qs_segment *seg, uint32_t ctx, uint32_t vslot)
{
    struct qs_ctx *c = &seg->state->ctxs[ctx];
    struct qs_vgpu_state *vs = &seg->state->vgpus[vslot];
    struct qs_mem_recovery rec;
    if (lock_vgpu(seg, vslot, &rec) != QS_OK)
        return 0;
    uint64_t had = c->mem_reserved < vs->mem_used ? c->mem_reserved : vs->mem_used;
    vs->mem_used -= had;
    c->mem_reserved = 0;
    qs_robust_unlock(&vs->mem_lock);
    return had;
}

/* vgpu.c — the owner's vGPU inventory: create, update, destroy, suspend, resume, stats.
 * Every argument is checked before anything is written. */
#include "node.h"

#include <limits.h>
#include <string.h>

static int find(qs_node *node, uint32_t id, struct qs_cfg_vgpu **out)
{
    int slot = qs_find_vgpu(node->seg.cfg, id);
    if (slot < 0)
        return qs_fail(QS_ENOENT, "no vGPU with id %u", id);
    *out = &node->seg.cfg->vgpus[slot];
    return slot;
}

static int check_limits(qs_node *node, uint32_t card, uint32_t share, uint64_t mem_limit)
{
    if (share < 1 || share > 100)
        return qs_fail(QS_ESHARE, "core share %u is outside 1..100", share);
    uint64_t total = node->seg.cfg->cards[card].total_mem;
    if (mem_limit == 0 || mem_limit > total)
        return qs_fail(QS_EMEMLIMIT, "memory limit %llu is outside 1..%llu (card %u's memory)",
                       (unsigned long long)mem_limit, (unsigned long long)total, card);
    return QS_OK;
}

/* Sum of core shares of active vGPUs with this card and priority, `except` left out. */
static uint32_t share_sum(qs_node *node, uint32_t card, uint32_t prio, int except)
{
    uint32_t sum = 0;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[s];
        if ((int)s != except && atomic_load(&v->state) == QS_SLOT_ACTIVE && v->card == card &&
            v->priority == prio)
            sum += atomic_load(&v->core_share);
    }
    return sum;
}

static int check_sum(qs_node *node, uint32_t card, uint32_t prio, uint32_t share, int except)
{
    uint32_t sum = share_sum(node, card, prio, except);
    if (sum + share > 100)
        return qs_fail(QS_ESHARESUM, "card %u: %s-priority core shares would sum to %u (> 100)",
                       card, prio == QS_PRIO_HIGH ? "high" : "low", sum + share);
    return QS_OK;
}

static int validate_spec(qs_node *node, const qs_vgpu_spec *spec)
{
    if (!spec)
        return qs_fail(QS_EINVAL, "vGPU spec is NULL");
    if (spec->card >= QS_MAX_CARDS || !atomic_load(&node->seg.cfg->cards[spec->card].present))
        return qs_fail(QS_ENOENT, "vGPU %u: no card with index %u", spec->id, spec->card);
    if (spec->priority > QS_PRIO_HIGH)
        return qs_fail(QS_EPRIORITY, "vGPU %u: priority %u is neither low (0) nor high (1)",
                       spec->id, spec->priority);
    if (qs_find_vgpu(node->seg.cfg, spec->id) >= 0)
        return qs_fail(QS_EEXIST, "vGPU id %u already exists", spec->id);
    int rc = check_limits(node, spec->card, spec->core_share, spec->mem_limit);
    return rc == QS_OK ? check_sum(node, spec->card, spec->priority, spec->core_share, -1) : rc;
}

static int free_slot(qs_node *node, uint32_t card, uint32_t *slot)
{
    uint32_t on_card = 0;
    int found = -1;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[s];
        uint32_t st = atomic_load(&v->state);
        on_card += st != QS_SLOT_FREE && v->card == card;
        if (st == QS_SLOT_FREE && found < 0)
            found = (int)s;
    }
    if (on_card >= QS_MAX_VGPUS_PER_CARD || found < 0)
        return qs_fail(QS_EFULL, "card %u already has %u vGPUs", card, on_card);
    *slot = (uint32_t)found;
    return QS_OK;
}

static int create_locked(qs_node *node, const qs_vgpu_spec *spec, uint32_t suspended)
{
    uint32_t slot = 0;
    int rc = validate_spec(node, spec);
    if (rc == QS_OK)
        rc = free_slot(node, spec->card, &slot);
    if (rc != QS_OK)
        return rc;
    struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[slot];
    struct qs_vgpu_state *vs = &node->seg.state->vgpus[slot];
    v->id = spec->id;
    v->card = spec->card;
    v->priority = spec->priority;
    v->lp_max_inflight = 1;
    atomic_store(&v->core_share, spec->core_share);
    atomic_store(&v->mem_limit, spec->mem_limit);
    atomic_store(&v->suspended, suspended); /* before the slot is published below */
    atomic_store(&vs->device_ns, 0);
    atomic_store(&vs->launches, 0);
    memset(&vs->policy, 0, sizeof vs->policy);
    pthread_mutex_lock(&node->slot_lock);
    rc = qs_vmem_new(&node->seg, node->name, slot);
    pthread_mutex_unlock(&node->slot_lock);
    if (rc == QS_OK)
        rc = qs_service_vgpu_added(node, slot);
    if (rc != QS_OK)
        return rc; /* the slot stays FREE */
    atomic_store(&v->state, QS_SLOT_ACTIVE); /* publish last */
    qs_policy_membership(&node->seg, slot, 1);
    if (suspended)
        qs_ring_push(&node->seg.state->ring, QS_EV_SUSPENDED, spec->card, spec->id, 0, 0);
    return QS_OK;
}

int qs_vgpu_create_flags(qs_node *node, const qs_vgpu_spec *spec, uint32_t flags)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    if (flags & ~QS_VGPU_CREATE_SUSPENDED)
        return qs_fail(QS_EINVAL, "vGPU create: unknown flags 0x%x (known: 0x%x)",
                       flags & ~QS_VGPU_CREATE_SUSPENDED, QS_VGPU_CREATE_SUSPENDED);
    int rc = qs_node_lock(node);
    if (rc != QS_OK)
        return rc;
    rc = create_locked(node, spec, flags & QS_VGPU_CREATE_SUSPENDED);
    qs_node_unlock(node);
    return rc;
}

int qs_vgpu_create(qs_node *node, const qs_vgpu_spec *spec)
{
    return qs_vgpu_create_flags(node, spec, 0);
}

static int update_locked(qs_node *node, uint32_t id, uint32_t share, uint64_t mem_limit)
{
    struct qs_cfg_vgpu *v = NULL;
    int slot = find(node, id, &v);
    if (slot < 0)
        return slot;
    int rc = check_limits(node, v->card, share, mem_limit);
    if (rc == QS_OK)
        rc = check_sum(node, v->card, v->priority, share, slot);
    if (rc != QS_OK)
        return rc;
    atomic_store(&v->core_share, share);
    atomic_store(&v->mem_limit, mem_limit);
    return QS_OK;
}

int qs_vgpu_update(qs_node *node, uint32_t id, uint32_t core_share, uint64_t mem_limit)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    int rc = qs_node_lock(node);
    if (rc != QS_OK)
        return rc;
    rc = update_locked(node, id, core_share, mem_limit);
    qs_node_unlock(node);
    return rc;
}

/* Destroyed vGPUs keep their slot until the last context leaves; waiters are woken so
 * they see it and return QS_EDESTROYED. */
int qs_vgpu_destroy(qs_node *node, uint32_t id)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    int rc = qs_node_lock(node);
    if (rc != QS_OK)
        return rc;
    struct qs_cfg_vgpu *v = NULL;
    int slot = find(node, id, &v);
    if (slot >= 0) {
        qs_service_vgpu_removed(node, (uint32_t)slot);
        pthread_mutex_lock(&node->slot_lock); /* no attach binds between count and state */
        uint32_t contexts = qs_service_contexts_of(node, (uint32_t)slot);
        atomic_store(&v->state, contexts ? QS_SLOT_DESTROYED : QS_SLOT_FREE);
        pthread_mutex_unlock(&node->slot_lock);
        qs_policy_membership(&node->seg, (uint32_t)slot, 0);
        qs_futex_wake(&v->suspended, INT_MAX);
        struct qs_card_state *cs = &node->seg.state->cards[v->card];
        atomic_fetch_add(&cs->wake_seq, 1);
        qs_futex_wake(&cs->wake_seq, INT_MAX);
        rc = QS_OK;
    } else {
        rc = slot;
    }
    qs_node_unlock(node);
    return rc;
}

static int set_suspended(qs_node *node, uint32_t id, uint32_t value)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    struct qs_cfg_vgpu *v = NULL;
    int slot = find(node, id, &v);
    if (slot < 0)
        return slot;
    if (atomic_exchange(&v->suspended, value) != value) {
        if (!value)
            qs_futex_wake(&v->suspended, INT_MAX);
        qs_ring_push(&node->seg.state->ring, value ? QS_EV_SUSPENDED : QS_EV_RESUMED, v->card,
                     id, 0, 0);
    }
    return QS_OK;
}

int qs_vgpu_suspend(qs_node *node, uint32_t id)
{
    return set_suspended(node, id, 1);
}

int qs_vgpu_resume(qs_node *node, uint32_t id)
{
    return set_suspended(node, id, 0);
}

uint64_t qs_vgpu_launches(struct qs_segment *seg, uint32_t slot)
{
    uint64_t sum = atomic_load(&seg->state->vgpus[slot].launches);
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        struct qs_ctx *c = &seg->state->ctxs[i];
        if (atomic_load(&c->state) == QS_SLOT_ACTIVE && c->vgpu_slot == slot)
            sum += atomic_load_explicit(&c->launches, memory_order_relaxed);
    }
    return sum;
}

/* Under the slot lock: the slot keeps this vGPU (and its memory part) while it is read. */
static int stats_locked(qs_node *node, uint32_t id, qs_vgpu_stats *out)
{
    struct qs_cfg_vgpu *v = NULL;
    int slot = find(node, id, &v);
    if (slot < 0)
        return slot;
    struct qs_vgpu_state *vs = &node->seg.state->vgpus[slot];
    *out = (qs_vgpu_stats){.id = id, .card = v->card, .priority = v->priority,
                           .core_share = atomic_load(&v->core_share),
                           .mem_limit = atomic_load(&v->mem_limit),
                           .mem_used = qs_mem_used(&node->seg, (uint32_t)slot),
                           .device_ns = atomic_load(&vs->device_ns),
                           .launches = qs_vgpu_launches(&node->seg, (uint32_t)slot),
                           .contexts = qs_service_contexts_of(node, (uint32_t)slot),
                           .suspended = atomic_load(&v->suspended)};
    return QS_OK;
}

int qs_vgpu_stats_get(qs_node *node, uint32_t id, qs_vgpu_stats *out)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    QS_REQUIRE(out, "out pointer");
    pthread_mutex_lock(&node->slot_lock);
    int rc = stats_locked(node, id, out);
    pthread_mutex_unlock(&node->slot_lock);
    return rc;
}

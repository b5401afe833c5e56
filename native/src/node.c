/* node.c — the owner's side: create the segment, manage cards and vGPUs (validated
 * before anything is written), read statistics and events. */
#include "node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A holder of the segment lock died: configuration writes publish their slot state
 * last, so the only repair is to free slots a create left half-made. */
static void seg_recover(void *arg)
{
    struct qs_cfg *cfg = arg;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        struct qs_cfg_vgpu *v = &cfg->vgpus[s];
        if (atomic_load(&v->state) == QS_SLOT_FREE)
            memset((char *)v + sizeof v->state, 0, sizeof *v - sizeof v->state);
    }
}

int qs_node_lock(qs_node *node)
{
    return qs_robust_lock(&node->seg.state->seg_lock, seg_recover, node->seg.cfg);
}

void qs_node_unlock(qs_node *node)
{
    qs_robust_unlock(&node->seg.state->seg_lock);
}

int qs_node_create(const char *name, const char *dir, int replace, qs_node **out)
{
    qs_clear_error();
    if (!out)
        return qs_fail(QS_EINVAL, "out pointer is NULL");
    qs_node *node = calloc(1, sizeof *node);
    if (!node)
        return qs_fail(QS_ESYS, "out of memory");
    snprintf(node->dir, sizeof node->dir, "%s", qs_default_dir(dir));
    int rc = qs_segment_create(node->dir, name, replace, &node->seg);
    if (rc == QS_OK) {
        snprintf(node->name, sizeof node->name, "%s", name);
        rc = qs_service_start(node);
        if (rc != QS_OK) {
            qs_segment_unmap(&node->seg);
            qs_segment_unlink(node->dir, name);
        }
    }
    if (rc != QS_OK) {
        free(node);
        return rc;
    }
    *out = node;
    return QS_OK;
}

void qs_node_close(qs_node *node)
{
    if (!node)
        return;
    qs_service_stop(node);
    qs_segment_unmap(&node->seg);
    qs_segment_unlink(node->dir, node->name);
    free(node);
}

static int check_card(qs_node *node, uint32_t index)
{
    if (index >= QS_MAX_CARDS || !atomic_load(&node->seg.cfg->cards[index].present))
        return qs_fail(QS_ENOENT, "no card with index %u", index);
    return QS_OK;
}

static int card_add_locked(qs_node *node, uint32_t index, const char *uuid, uint64_t total_mem)
{
    if (index >= QS_MAX_CARDS)
        return qs_fail(QS_EINVAL, "card index %u is out of range 0..%u", index, QS_MAX_CARDS - 1);
    if (!uuid || !*uuid || strlen(uuid) >= QS_UUID_MAX)
        return qs_fail(QS_EINVAL, "card uuid must be 1..%u characters", QS_UUID_MAX - 1);
    if (total_mem == 0)
        return qs_fail(QS_EINVAL, "card %u: total memory must be positive", index);
    struct qs_cfg_card *c = &node->seg.cfg->cards[index];
    if (atomic_load(&c->present))
        return qs_fail(QS_EEXIST, "card %u already exists", index);
    for (uint32_t i = 0; i < QS_MAX_CARDS; i++)
        if (atomic_load(&node->seg.cfg->cards[i].present) &&
            !strcmp(node->seg.cfg->cards[i].uuid, uuid))
            return qs_fail(QS_EEXIST, "card uuid %s already exists (index %u)", uuid, i);
    c->index = index;
    c->total_mem = total_mem;
    snprintf(c->uuid, sizeof c->uuid, "%s", uuid);
    atomic_store(&c->release_delay_ns, QS_DEFAULT_RELEASE_DELAY_NS);
    atomic_store(&c->policy, QS_POLICY_BEST_EFFORT);
    atomic_store(&c->present, 1);
    return qs_service_card_added(node, index);
}

int qs_card_add(qs_node *node, uint32_t index, const char *uuid, uint64_t total_mem)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    int rc = qs_node_lock(node);
    if (rc != QS_OK)
        return rc;
    rc = card_add_locked(node, index, uuid, total_mem);
    qs_node_unlock(node);
    return rc;
}

int qs_card_set_release_delay(qs_node *node, uint32_t index, uint64_t delay_ns)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    int rc = check_card(node, index);
    if (rc != QS_OK)
        return rc;
    if (delay_ns > 60000000000ull)
        return qs_fail(QS_EINVAL, "release delay %llu ns is above 60 s",
                       (unsigned long long)delay_ns);
    struct qs_card_state *cs = &node->seg.state->cards[index];
    atomic_store(&node->seg.cfg->cards[index].release_delay_ns, delay_ns);
    atomic_store(&node->seg.cfg->cards[index].release_auto, 0); /* a fixed delay ends auto mode */
    atomic_fetch_add(&cs->wake_seq, 1); /* sleepers recompute their deadline */
    qs_futex_wake(&cs->wake_seq, 1 << 30);
    return QS_OK;
}

int qs_card_set_policy(qs_node *node, uint32_t index, uint32_t policy)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    int rc = check_card(node, index);
    if (rc != QS_OK)
        return rc;
    if (policy > QS_POLICY_BURST_SHARE)
        return qs_fail(QS_EPOLICY, "policy %u is not best-effort (0), fixed-share (1) or "
                                   "burst-share (2)", policy);
    atomic_store(&node->seg.cfg->cards[index].policy, policy);
    qs_policy_changed(&node->seg, index);
    return QS_OK;
}

int qs_card_stats_get(qs_node *node, uint32_t index, qs_card_stats *out)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    QS_REQUIRE(out, "out pointer");
    int rc = check_card(node, index);
    if (rc != QS_OK)
        return rc;
    const struct qs_cfg_card *c = &node->seg.cfg->cards[index];
    struct qs_card_state *cs = &node->seg.state->cards[index];
    memset(out, 0, sizeof *out);
    out->index = index;
    out->busy = atomic_load(&cs->gate) != QS_GATE_OPEN;
    out->total_mem = c->total_mem;
    out->release_delay_ns = atomic_load(&c->release_delay_ns);
    out->policy = atomic_load(&c->policy);
    out->episodes = atomic_load(&cs->episodes);
    out->device_ns = atomic_load(&cs->device_ns);
    out->lp_window_ns = qs_card_lp_window(c);
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        out->vgpus += atomic_load(&node->seg.cfg->vgpus[s].state) == QS_SLOT_ACTIVE &&
                      node->seg.cfg->vgpus[s].card == index;
    snprintf(out->uuid, sizeof out->uuid, "%s", c->uuid);
    return QS_OK;
}

uint64_t qs_node_dropped_events(qs_node *node)
{
    return node == NULL ? 0 : atomic_load(&node->seg.state->ring.dropped);
}

int qs_node_next_event(qs_node *node, qs_event *out, int timeout_ms)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    if (!out)
        return qs_fail(QS_EINVAL, "out pointer is NULL");
    int rc = qs_ring_pop(&node->seg.state->ring, &node->ring_tail, out, timeout_ms);
    return rc == QS_ETIMEDOUT ? qs_fail(rc, "no event within %d ms", timeout_ms) : rc;
}

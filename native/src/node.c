/* node.c — the owner's side: create the segment, manage cards and vGPUs (validated
 * before anything is written), read statistics and events. */
#include "node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

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
    return qs_robust_lock(&node->seg.owner->seg_lock, seg_recover, node->seg.cfg);
}

void qs_node_unlock(qs_node *node)
{
    qs_robust_unlock(&node->seg.owner->seg_lock);
}

/* Descriptors: one per attached process and per vGPU socket; the soft limit goes up to the
 * hard one so that QS_MAX_CONTEXTS is reachable with the default limits of most systems. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static qs_node *new_node(const char *name, const char *dir)
{
    qs_node *node = calloc(1, sizeof *node);
    if (!node) {
        qs_fail(QS_ESYS, "out of memory");
        return NULL;
    }
    snprintf(node->dir, sizeof node->dir, "%s", qs_default_dir(dir));
    snprintf(node->name, sizeof node->name, "%s", name ? name : "");
    pthread_mutex_init(&node->slot_lock, NULL);
    raise_fd_limit();
    return node;
}

static void free_node(qs_node *node)
{
    pthread_mutex_destroy(&node->slot_lock);
    free(node);
}

/* Record this process as the segment's owner. */
static void claim(qs_node *node)
{
    node->seg.owner->owner_pid = (int32_t)getpid();
    node->seg.owner->owner_start = qs_proc_start_time((int)getpid());
}

/* Adopting from an owner that still runs would make two owners of one segment. */
static int check_owner_dead(qs_node *node)
{
    const struct qs_owner *own = node->seg.owner;
    int pid = own->owner_pid;
    if (pid <= 0 || pid == (int)getpid() || kill(pid, 0) != 0 ||
        qs_proc_start_time(pid) != own->owner_start)
        return QS_OK;
    return qs_fail(QS_EEXIST, "segment '%s' is owned by process %d, which is alive", node->name,
                   pid);
}

int qs_node_create(const char *name, const char *dir, int replace, qs_node **out)
{
    qs_clear_error();
    if (!out)
        return qs_fail(QS_EINVAL, "out pointer is NULL");
    qs_node *node = new_node(name, dir);
    if (!node)
        return QS_ESYS;
    int rc = qs_segment_create(node->dir, name, replace, &node->seg);
    if (rc == QS_OK) {
        claim(node);
        rc = qs_service_start(node);
        if (rc != QS_OK) {
            qs_segment_unmap(&node->seg);
            qs_segment_unlink(node->dir, name);
        }
    }
    if (rc != QS_OK) {
        free_node(node);
        return rc;
    }
    *out = node;
    return QS_OK;
}

/* The owner that died may have been counted asleep on a gate (that part goes back) or
 * killed mid-release (the gate goes back to CLOSED; its release thread reopens it). */
static void forget_dead_owner(qs_node *node)
{
    for (uint32_t c = 0; c < QS_MAX_CARDS; c++) {
        struct qs_card_state *cs = &node->seg.state->cards[c];
        qs_count_return(&node->seg.owner->owner_untimed[c], &cs->untimed_sleepers);
        uint32_t releasing = QS_GATE_RELEASING;
        atomic_compare_exchange_strong(&cs->gate, &releasing, QS_GATE_CLOSED);
    }
}

/* The state part: the memfd still held by a live attached process, or a new one when no
 * process holds it (then nothing is attached and there is nothing to carry over). */
static int adopt_state(qs_node *node)
{
    int fd = qs_service_find_state(node);
    if (fd >= 0) {
        int rc = qs_segment_map_state(fd, &node->seg);
        if (rc != QS_OK)
            close(fd);
        return rc;
    }
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        atomic_store(&node->seg.owner->recs[i].state, QS_SLOT_FREE);
    int rc = qs_segment_new_state(node->name, &node->seg);
    for (uint32_t s = 0; rc == QS_OK && s < QS_MAX_VGPUS; s++)
        if (atomic_load(&node->seg.cfg->vgpus[s].state) == QS_SLOT_DESTROYED)
            atomic_store(&node->seg.cfg->vgpus[s].state, QS_SLOT_FREE);
    return rc;
}

/* Service threads and sockets for every card and vGPU the segment holds. */
static int restart_services(qs_node *node)
{
    int rc = qs_service_start(node);
    if (rc == QS_OK) /* before any socket opens: no attach races the records */
        rc = qs_service_adopt_contexts(node);
    for (uint32_t c = 0; rc == QS_OK && c < QS_MAX_CARDS; c++)
        if (atomic_load(&node->seg.cfg->cards[c].present))
            rc = qs_service_card_added(node, c);
    for (uint32_t s = 0; rc == QS_OK && s < QS_MAX_VGPUS; s++)
        if (atomic_load(&node->seg.cfg->vgpus[s].state) == QS_SLOT_ACTIVE)
            rc = qs_service_vgpu_added(node, s);
    return rc;
}

int qs_node_adopt(const char *name, const char *dir, qs_node **out)
{
    qs_clear_error();
    if (!out)
        return qs_fail(QS_EINVAL, "out pointer is NULL");
    qs_node *node = new_node(name, dir);
    if (!node)
        return QS_ESYS;
    int rc = qs_segment_open_owner(node->dir, name, &node->seg);
    if (rc == QS_OK)
        rc = check_owner_dead(node);
    if (rc == QS_OK && (rc = adopt_state(node)) == QS_OK &&
        (rc = qs_service_adopt_vmems(node)) == QS_OK) {
        claim(node);
        forget_dead_owner(node);
        node->ring_cursor = (struct qs_ring_cursor){.tail = atomic_load(&node->seg.state->ring.head)};
        rc = restart_services(node);
        if (rc != QS_OK)
            qs_service_stop(node);
    }
    if (rc != QS_OK) {
        qs_segment_unmap(&node->seg);
        free_node(node);
        return rc;
    }
    *out = node;
    return QS_OK;
}

void qs_node_leave(qs_node *node)
{
    if (!node)
        return;
    node->seg.owner->owner_pid = 0; /* nobody owns it now: the next agent adopts at once */
    qs_service_stop(node);
    qs_segment_unmap(&node->seg);
    free_node(node);
}

void qs_node_close(qs_node *node)
{
    if (!node)
        return;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        qs_service_vgpu_removed(node, s);
    qs_service_stop(node);
    qs_segment_unmap(&node->seg);
    qs_segment_unlink(node->dir, node->name);
    free_node(node);
}

int qs_node_list_vgpus(qs_node *node, uint32_t *ids, uint32_t cap, uint32_t *count)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    QS_REQUIRE(count, "count pointer");
    uint32_t n = 0;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        const struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[s];
        if (atomic_load(&v->state) != QS_SLOT_ACTIVE)
            continue;
        if (ids && n < cap)
            ids[n] = v->id;
        n++;
    }
    *count = n;
    return QS_OK;
}

int qs_node_list_cards(qs_node *node, uint32_t *indices, uint32_t cap, uint32_t *count)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    QS_REQUIRE(count, "count pointer");
    uint32_t n = 0;
    for (uint32_t c = 0; c < QS_MAX_CARDS; c++) {
        if (!atomic_load(&node->seg.cfg->cards[c].present))
            continue;
        if (indices && n < cap)
            indices[n] = c;
        n++;
    }
    *count = n;
    return QS_OK;
}

int qs_vgpu_attach_dir(qs_node *node, uint32_t id, char *buf, uint32_t len)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    QS_REQUIRE(buf, "buffer");
    if (qs_find_vgpu(node->seg.cfg, id) < 0)
        return qs_fail(QS_ENOENT, "no vGPU with id %u", id);
    return qs_vgpu_dir_path(buf, len, node->dir, node->name, id);
}

int qs_node_check_card(qs_node *node, uint32_t index)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
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
    int rc = qs_node_check_card(node, index);
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
    int rc = qs_node_check_card(node, index);
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
    int rc = qs_node_check_card(node, index);
    if (rc != QS_OK)
        return rc;
    QS_REQUIRE(out, "out pointer");
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
    out->lp_device_gate = atomic_load(&c->lp_device_gate);
    out->policy_wakes = atomic_load(&cs->policy_wakes);
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
    int rc = qs_ring_pop(&node->seg.state->ring, &node->ring_cursor, out, timeout_ms);
    return rc == QS_ETIMEDOUT ? qs_fail(rc, "no event within %d ms", timeout_ms) : rc;
}

int qs_card_sleepers_get(qs_node *node, uint32_t index, qs_card_sleepers *out)
{
    int rc = qs_node_check_card(node, index);
    if (rc != QS_OK)
        return rc;
    QS_REQUIRE(out, "out pointer");
    struct qs_card_state *cs = &node->seg.state->cards[index];
    uint32_t gate = atomic_load(&cs->untimed_sleepers);
    uint32_t own = atomic_load(&node->seg.owner->owner_untimed[index]);
    *out = (qs_card_sleepers){.gate_sleepers = gate > own ? gate - own : 0,
                              .policy_waiters = atomic_load(&cs->policy_waiters)};
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        if (atomic_load(&node->seg.cfg->vgpus[s].state) != QS_SLOT_FREE &&
            node->seg.cfg->vgpus[s].card == index)
            out->policy_waiting += atomic_load(&node->seg.state->vgpus[s].policy.waiting);
    return QS_OK;
}

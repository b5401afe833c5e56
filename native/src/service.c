/* service.c — the owner's threads: the attach server (a unix socket beside the segment;
 * a closed connection means the process left or died, in any PID namespace, and its
 * resources are reclaimed at once) and one release thread per card. */
#include "node.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_TAG UINT64_MAX
#define STOP_TAG (UINT64_MAX - 1)

static uint64_t conn_tag(int fd, uint32_t ctx_plus_one)
{
    return ((uint64_t)(uint32_t)fd << 32) | ctx_plus_one;
}

static int alloc_ctx(qs_node *node, uint32_t *out)
{
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        if (atomic_load(&node->seg.state->ctxs[i].state) == QS_SLOT_FREE) {
            *out = i;
            return QS_OK;
        }
    return qs_fail(QS_EFULL, "all %u context slots are in use", QS_MAX_CONTEXTS);
}

static int peer_pid(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) ? 0 : cred.pid;
}

static int attach_ctx(qs_node *node, int fd, uint32_t vgpu_id, struct qs_proto_reply *rep)
{
    int slot = qs_find_vgpu(node->seg.cfg, vgpu_id);
    if (slot < 0)
        return qs_fail(QS_ENOENT, "no vGPU with id %u on this node", vgpu_id);
    uint32_t i = 0;
    int rc = alloc_ctx(node, &i);
    if (rc != QS_OK)
        return rc;
    struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[slot];
    struct qs_ctx *c = &node->seg.state->ctxs[i];
    c->pid = peer_pid(fd);
    c->vgpu_slot = (uint32_t)slot;
    c->card = v->card;
    c->priority = v->priority;
    c->generation = ++node->generation;
    c->mem_reserved = 0;
    atomic_store(&c->inflight, 0);
    atomic_store(&c->launches, 0);
    atomic_fetch_add(&node->seg.state->vgpus[slot].contexts, 1);
    atomic_store(&c->state, QS_SLOT_ACTIVE);
    if (v->priority == QS_PRIO_HIGH)
        atomic_fetch_or(&node->seg.state->cards[v->card].hp_mask[i / 64], 1ull << (i % 64));
    node->conn_fd_of_ctx[i] = fd;
    *rep = (struct qs_proto_reply){.status = QS_OK, .ctx = i, .vgpu_slot = (uint32_t)slot,
                                   .generation = c->generation};
    qs_ring_push(&node->seg.state->ring, QS_EV_ATTACH, v->card, vgpu_id, c->pid, i);
    return QS_OK;
}

/* Return everything the context held and free its slot. */
static void reap(qs_node *node, uint32_t i, uint32_t kind)
{
    struct qs_state *st = node->seg.state;
    struct qs_ctx *c = &st->ctxs[i];
    struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[c->vgpu_slot];
    uint64_t returned = c->mem_reserved;
    /* first, while still counted as live: its launches move to the vGPU's tally */
    atomic_fetch_add(&st->vgpus[c->vgpu_slot].launches, atomic_exchange(&c->launches, 0));
    qs_mem_reap(&node->seg, i);
    atomic_store(&c->state, QS_SLOT_DESTROYED);
    if (c->priority == QS_PRIO_HIGH)
        qs_gate_forget_hp(&node->seg, c->card, i);
    atomic_store(&c->inflight, 0);
    qs_ring_push(&st->ring, kind, c->card, v->id, c->pid, returned);
    if (atomic_fetch_sub(&st->vgpus[c->vgpu_slot].contexts, 1) == 1 &&
        atomic_load(&v->state) == QS_SLOT_DESTROYED && !qs_node_lock(node)) {
        if (!atomic_load(&st->vgpus[c->vgpu_slot].contexts))
            atomic_store(&v->state, QS_SLOT_FREE);
        qs_node_unlock(node);
    }
    node->conn_fd_of_ctx[i] = -1;
    atomic_store(&c->state, QS_SLOT_FREE);
}

static void close_conn(qs_node *node, int fd, uint32_t ctx_plus_one, uint32_t kind)
{
    if (ctx_plus_one)
        reap(node, ctx_plus_one - 1, kind);
    epoll_ctl(node->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
}

static void handle_request(qs_node *node, int fd, uint32_t ctx_plus_one)
{
    struct qs_proto_request req;
    ssize_t n = recv(fd, &req, sizeof req, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n != (ssize_t)sizeof req || req.magic != QS_PROTO_MAGIC) {
        close_conn(node, fd, ctx_plus_one, n == 0 ? QS_EV_CLIENT_DIED : QS_EV_DETACH);
        return;
    }
    struct qs_proto_reply rep = {0};
    if (req.op == QS_OP_ATTACH && !ctx_plus_one) {
        rep.status = attach_ctx(node, fd, req.vgpu_id, &rep);
        if (rep.status != QS_OK)
            snprintf(rep.message, sizeof rep.message, "%s", qs_last_error());
        else
            epoll_ctl(node->epoll_fd, EPOLL_CTL_MOD, fd,
                      &(struct epoll_event){.events = EPOLLIN | EPOLLRDHUP,
                                            .data.u64 = conn_tag(fd, rep.ctx + 1)});
    } else if (req.op == QS_OP_DETACH && ctx_plus_one) {
        reap(node, ctx_plus_one - 1, QS_EV_DETACH);
        epoll_ctl(node->epoll_fd, EPOLL_CTL_MOD, fd,
                  &(struct epoll_event){.events = EPOLLIN | EPOLLRDHUP,
                                        .data.u64 = conn_tag(fd, 0)});
    } else {
        rep.status = QS_EINVAL;
        snprintf(rep.message, sizeof rep.message, "request op %u is not valid now", req.op);
    }
    send(fd, &rep, sizeof rep, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void accept_conn(qs_node *node)
{
    int fd = accept4(node->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = conn_tag(fd, 0)};
    if (epoll_ctl(node->epoll_fd, EPOLL_CTL_ADD, fd, &ev))
        close(fd);
}

static void *service_main(void *arg)
{
    qs_node *node = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&node->stop)) {
        int n = epoll_wait(node->epoll_fd, evs, 64, -1);
        for (int k = 0; k < n; k++) {
            uint64_t tag = evs[k].data.u64;
            if (tag == STOP_TAG)
                return NULL;
            if (tag == LISTEN_TAG) {
                accept_conn(node);
                continue;
            }
            int fd = (int)(tag >> 32);
            uint32_t ctx1 = (uint32_t)tag;
            if (evs[k].events & EPOLLIN)
                handle_request(node, fd, ctx1);
            else if (evs[k].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))
                close_conn(node, fd, ctx1, QS_EV_CLIENT_DIED);
        }
    }
    return NULL;
}

static int listen_socket(qs_node *node)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char path[512];
    int rc = qs_segment_path(path, sizeof path, node->dir, node->name, "sock");
    if (rc != QS_OK)
        return rc;
    if (strlen(path) >= sizeof addr.sun_path)
        return qs_fail(QS_EINVAL, "socket path %s is too long", path);
    strcpy(addr.sun_path, path);
    unlink(path);
    node->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (node->listen_fd < 0)
        return qs_fail_errno("socket");
    if (bind(node->listen_fd, (struct sockaddr *)&addr, sizeof addr) || chmod(path, 0660) ||
        listen(node->listen_fd, 128))
        return qs_fail_errno(path);
    return QS_OK;
}

static int start_epoll(qs_node *node)
{
    node->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    node->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (node->epoll_fd < 0 || node->stop_fd < 0)
        return qs_fail_errno("epoll/eventfd");
    struct epoll_event l = {.events = EPOLLIN, .data.u64 = LISTEN_TAG};
    struct epoll_event s = {.events = EPOLLIN, .data.u64 = STOP_TAG};
    if (epoll_ctl(node->epoll_fd, EPOLL_CTL_ADD, node->listen_fd, &l) ||
        epoll_ctl(node->epoll_fd, EPOLL_CTL_ADD, node->stop_fd, &s))
        return qs_fail_errno("epoll_ctl");
    if (pthread_create(&node->service_thread, NULL, service_main, node))
        return qs_fail(QS_ESYS, "cannot start the service thread");
    node->service_running = 1;
    return QS_OK;
}

static void close_fds(qs_node *node)
{
    int *fds[] = {&node->listen_fd, &node->epoll_fd, &node->stop_fd};
    for (size_t i = 0; i < 3; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
}

int qs_service_start(qs_node *node)
{
    node->listen_fd = node->epoll_fd = node->stop_fd = -1;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        node->conn_fd_of_ctx[i] = -1;
    int rc = listen_socket(node);
    if (rc == QS_OK)
        rc = start_epoll(node);
    if (rc != QS_OK)
        close_fds(node);
    return rc;
}

static void *release_main(void *arg)
{
    qs_node *node = ((struct qs_release_arg *)arg)->node;
    uint32_t card = ((struct qs_release_arg *)arg)->card;
    qs_gate_release_loop(&node->seg, card, &node->stop);
    return NULL;
}

int qs_service_card_added(qs_node *node, uint32_t card)
{
    struct qs_release_arg *a = &node->release_args[card];
    a->node = node;
    a->card = card;
    if (pthread_create(&node->release_threads[card], NULL, release_main, a))
        return qs_fail(QS_ESYS, "cannot start the release thread of card %u", card);
    node->release_running[card] = 1;
    return QS_OK;
}

void qs_service_stop(qs_node *node)
{
    atomic_store(&node->stop, 1);
    uint64_t one = 1;
    if (node->service_running && write(node->stop_fd, &one, sizeof one) == sizeof one)
        pthread_join(node->service_thread, NULL);
    for (uint32_t c = 0; c < QS_MAX_CARDS; c++) {
        if (!node->release_running[c])
            continue;
        struct qs_card_state *cs = &node->seg.state->cards[c];
        atomic_fetch_add(&cs->wake_seq, 1);
        qs_futex_wake(&cs->wake_seq, 1 << 30);
        pthread_join(node->release_threads[c], NULL);
    }
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        if (node->conn_fd_of_ctx[i] >= 0)
            close(node->conn_fd_of_ctx[i]);
    close_fds(node);
}

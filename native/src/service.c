/* service.c — the owner's threads: the attach server (one unix socket per vGPU, in a directory
 * of its own that is mounted into that vGPU's container alone; a closed connection, or for
 * adopted contexts an exited pidfd, means the process left or died, and its resources are
 * reclaimed at once from the owner's private record) and one release thread per card. */
#include "node.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* epoll tags: kind in the top bits, the descriptor, and a value (vGPU slot or context) */
enum tag_kind { TAG_CONN = 0, TAG_LISTEN = 1, TAG_CTL = 2, TAG_PIDFD = 3 };
enum ctl_value { CTL_STOP = 1, CTL_KICK = 2 };

static uint64_t tag(enum tag_kind kind, int fd, uint32_t value)
{
    return ((uint64_t)kind << 62) | ((uint64_t)(uint32_t)fd << 32) | value;
}

static enum tag_kind tag_kind(uint64_t t) { return (enum tag_kind)(t >> 62); }
static int tag_fd(uint64_t t) { return (int)((t >> 32) & 0x3fffffffu); }
static uint32_t tag_value(uint64_t t) { return (uint32_t)t; }

/* A connection's value: the listening vGPU slot + 1 before it attached, else CONN_CTX | ctx;
 * CONN_REFUSE when the owner is near its descriptor limit: its request gets QS_EFULL. */
#define CONN_CTX 0x80000000u
#define CONN_REFUSE 0x40000000u
#define FD_HEADROOM 16 /* descriptors kept free for the owner's own needs */

static int watch(qs_node *node, int fd, uint64_t t)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = t};
    return epoll_ctl(node->epoll_fd, EPOLL_CTL_ADD, fd, &ev) ? qs_fail_errno("epoll_ctl") : QS_OK;
}

static int alloc_ctx(qs_node *node, uint32_t *out)
{
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        if (atomic_load(&node->seg.owner->recs[i].state) == QS_SLOT_FREE) {
            *out = i;
            return QS_OK;
        }
    return qs_fail(QS_EFULL, "node is at capacity: all %u context slots are in use",
                   QS_MAX_CONTEXTS);
}

/* Contexts vGPU slot `slot` holds, from the owner's private records (the shared count is
 * every tenant's to rewrite, so it neither grants nor refuses an attach). */
uint32_t qs_service_contexts_of(qs_node *node, uint32_t slot)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        const struct qs_owner_rec *r = &node->seg.owner->recs[i];
        n += atomic_load(&r->state) == QS_SLOT_ACTIVE && r->vslot == slot;
    }
    return n;
}

static int peer_pid(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) ? 0 : cred.pid;
}

uint64_t qs_proc_start_time(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Fill the shared slot and the private record; the record is what reaping trusts. */
static void bind_ctx(qs_node *node, uint32_t i, int pid, uint32_t slot)
{
    struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[slot];
    struct qs_owner_rec *r = &node->seg.owner->recs[i];
    struct qs_ctx *c = &node->seg.state->ctxs[i];
    *r = (struct qs_owner_rec){.pid = pid, .start_time = qs_proc_start_time(pid), .vslot = slot,
                               .card = v->card, .priority = v->priority,
                               .generation = ++node->seg.owner->generation, .vgpu_id = v->id};
    c->pid = pid;
    c->vgpu_slot = slot;
    c->card = v->card;
    c->priority = v->priority;
    atomic_store(&c->generation, r->generation);
    /* a share left at this index goes, and the vGPU's total is flagged to be summed again, as
     * at a reap (zeroing it alone left the total charged for it) */
    qs_mem_reap(&node->seg, i, slot);
    atomic_store(&c->inflight, 0);
    atomic_store(&c->inflight_waiters, 0);
    atomic_store(&c->launches, 0);
    atomic_store(&c->gate_sleepers, 0);
    atomic_store(&c->policy_sleepers, 0);
    atomic_store(&c->policy_waiting, 0);
    atomic_store(&r->state, QS_SLOT_ACTIVE);
}

static int attach_locked(qs_node *node, int fd, uint32_t slot, uint32_t vgpu_id,
                         struct qs_proto_reply *rep)
{
    struct qs_cfg_vgpu *v = &node->seg.cfg->vgpus[slot];
    if (atomic_load(&v->state) != QS_SLOT_ACTIVE)
        return qs_fail(QS_ENOENT, "vGPU %u was destroyed", v->id);
    if (v->id != vgpu_id)
        return qs_fail(QS_ENOENT, "no vGPU with id %u behind this socket (it serves vGPU %u)",
                       vgpu_id, v->id);
    if (!node->seg.vmem[slot])
        return qs_fail(QS_ESTATE, "vGPU %u has no memory part (the owner could not make one, "
                                  "or at its adopt could not check the one the vGPU's processes "
                                  "hold)", v->id);
    if (qs_service_contexts_of(node, slot) >= QS_MAX_CONTEXTS_PER_VGPU)
        return qs_fail(QS_EFULL, "vGPU %u has %u contexts, its most (QS_MAX_CONTEXTS_PER_VGPU)",
                       v->id, QS_MAX_CONTEXTS_PER_VGPU);
    uint32_t i = 0;
    int rc = alloc_ctx(node, &i);
    if (rc != QS_OK)
        return rc;
    bind_ctx(node, i, peer_pid(fd), slot);
    struct qs_ctx *c = &node->seg.state->ctxs[i];
    atomic_fetch_add(&node->seg.state->vgpus[slot].contexts, 1);
    atomic_store(&c->state, QS_SLOT_ACTIVE);
    if (v->priority == QS_PRIO_HIGH)
        atomic_fetch_or(&node->seg.state->cards[v->card].hp_mask[i / 64], 1ull << (i % 64));
    node->conn_fd_of_ctx[i] = fd;
    *rep = (struct qs_proto_reply){.status = QS_OK, .ctx = i, .vgpu_slot = slot,
                                   .generation = node->seg.owner->recs[i].generation};
    qs_ring_push(&node->seg.state->ring, QS_EV_ATTACH, v->card, vgpu_id, c->pid, i);
    return QS_OK;
}

/* Under the slot lock: a destroy counting the slot's contexts sees this one or refuses it. */
static int attach_ctx(qs_node *node, int fd, uint32_t slot, uint32_t vgpu_id,
                      struct qs_proto_reply *rep)
{
    pthread_mutex_lock(&node->slot_lock);
    int rc = attach_locked(node, fd, slot, vgpu_id, rep);
    pthread_mutex_unlock(&node->slot_lock);
    return rc;
}

/* Every count a dead context held in shared words goes back; waiters recompute. */
static void return_counts(struct qs_segment *seg, struct qs_ctx *c, const struct qs_owner_rec *r)
{
    struct qs_card_state *cs = &seg->state->cards[r->card];
    qs_count_return(&c->gate_sleepers, &cs->untimed_sleepers);
    qs_count_return(&c->policy_sleepers, &cs->policy_waiters);
    qs_count_return(&c->policy_waiting, &seg->state->vgpus[r->vslot].policy.waiting);
    atomic_store(&c->inflight, 0);
    atomic_store(&c->inflight_waiters, 0);
    uint32_t releasing = QS_GATE_RELEASING; /* a releaser killed mid-way left it so */
    atomic_compare_exchange_strong(&cs->gate, &releasing, QS_GATE_CLOSED);
    atomic_fetch_add(&cs->policy_seq, 1);
    qs_futex_wake(&cs->policy_seq, INT_MAX);
    atomic_fetch_add(&cs->wake_seq, 1);
    qs_futex_wake(&cs->wake_seq, INT_MAX);
}

/* The vGPU of a destroyed slot is freed with its last context, as the owner's records count
 * them (after the reaped one's record is freed): the shared count is only shown. */
static void drop_context_count(qs_node *node, uint32_t vslot)
{
    _Atomic uint32_t *shared = &node->seg.state->vgpus[vslot].contexts;
    uint32_t cur = atomic_load(shared);
    while (cur && !atomic_compare_exchange_weak(shared, &cur, cur - 1)) {
    }
    _Atomic uint32_t *state = &node->seg.cfg->vgpus[vslot].state;
    if (atomic_load(state) != QS_SLOT_DESTROYED)
        return;
    pthread_mutex_lock(&node->slot_lock);
    uint32_t destroyed = QS_SLOT_DESTROYED;
    if (!qs_service_contexts_of(node, vslot))
        atomic_compare_exchange_strong(state, &destroyed, QS_SLOT_FREE);
    pthread_mutex_unlock(&node->slot_lock);
}

/* Return everything context `i` held and free its slot, from the owner's private record. */
static void reap(qs_node *node, uint32_t i, uint32_t kind)
{
    struct qs_state *st = node->seg.state;
    if (i >= QS_MAX_CONTEXTS)
        return;
    struct qs_owner_rec *r = &node->seg.owner->recs[i];
    if (atomic_load(&r->state) != QS_SLOT_ACTIVE)
        return;
    struct qs_ctx *c = &st->ctxs[i];
    /* first, while still counted as live: its launches move to the vGPU's tally */
    atomic_fetch_add(&st->vgpus[r->vslot].launches, atomic_exchange(&c->launches, 0));
    atomic_store(&c->state, QS_SLOT_DESTROYED); /* before its memory: a handle adding to its */
    atomic_store(&c->generation, 0);            /* share then sees it and takes it back */
    uint64_t returned = qs_mem_reap(&node->seg, i, r->vslot);
    if (r->priority == QS_PRIO_HIGH)
        qs_gate_forget_hp(&node->seg, r->card, i);
    return_counts(&node->seg, c, r);
    node->conn_fd_of_ctx[i] = -1;
    if (node->pidfd_of_ctx[i] >= 0) {
        epoll_ctl(node->epoll_fd, EPOLL_CTL_DEL, node->pidfd_of_ctx[i], NULL);
        close(node->pidfd_of_ctx[i]);
        node->pidfd_of_ctx[i] = -1;
    }
    atomic_store(&r->state, QS_SLOT_FREE);
    atomic_store(&c->state, QS_SLOT_FREE);
    drop_context_count(node, r->vslot);
    qs_ring_push(&st->ring, kind, r->card, r->vgpu_id, r->pid, returned); /* last: all done */
}

static void close_conn(qs_node *node, int fd, uint32_t value, uint32_t kind)
{
    if (value & CONN_CTX)
        reap(node, value & ~CONN_CTX, kind);
    epoll_ctl(node->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
}

/* Send a reply; an attach that succeeded passes the cfg (read-only), the state and the vGPU's
 * memory part descriptors. */
static void send_reply(qs_node *node, int fd, const struct qs_proto_reply *rep, int with_fds)
{
    struct iovec iov = {.iov_base = (void *)rep, .iov_len = sizeof *rep};
    union {
        char buf[CMSG_SPACE(QS_ATTACH_FDS * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (with_fds) {
        memset(&u, 0, sizeof u);
        msg.msg_control = u.buf;
        msg.msg_controllen = sizeof u.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(QS_ATTACH_FDS * sizeof(int));
        int fds[QS_ATTACH_FDS] = {node->seg.cfg_ro_fd, node->seg.state_fd,
                                  node->seg.vmem_fd[rep->vgpu_slot]};
        memcpy(CMSG_DATA(cm), fds, sizeof fds);
    }
    sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* DETACH over a fresh connection (the attach connection is gone, e.g. after an adopt): only
 * the recorded process of that context and generation may detach it. */
static int detach_by_ref(qs_node *node, int fd, const struct qs_proto_request *req)
{
    if (req->ctx >= QS_MAX_CONTEXTS)
        return qs_fail(QS_EINVAL, "context %u is out of range", req->ctx);
    struct qs_owner_rec *r = &node->seg.owner->recs[req->ctx];
    if (atomic_load(&r->state) != QS_SLOT_ACTIVE || r->generation != req->generation ||
        r->pid != peer_pid(fd))
        return qs_fail(QS_ESTATE, "context %u is not this process's", req->ctx);
    if (node->conn_fd_of_ctx[req->ctx] >= 0)
        return qs_fail(QS_ESTATE, "context %u detaches over its own connection", req->ctx);
    reap(node, req->ctx, QS_EV_DETACH);
    return QS_OK;
}

static void answer(qs_node *node, int fd, uint32_t value, const struct qs_proto_request *req)
{
    struct qs_proto_reply rep = {0};
    if (value == CONN_REFUSE) {
        rep.status = qs_fail(QS_EFULL, "node owner is at capacity: %d descriptors open of %d; "
                                       "attach refused", fd, node->fd_limit);
    } else if (req->op == QS_OP_ATTACH && value && !(value & CONN_CTX)) {
        rep.status = attach_ctx(node, fd, value - 1, req->vgpu_id, &rep);
        if (rep.status == QS_OK)
            epoll_ctl(node->epoll_fd, EPOLL_CTL_MOD, fd,
                      &(struct epoll_event){.events = EPOLLIN | EPOLLRDHUP,
                                            .data.u64 = tag(TAG_CONN, fd, CONN_CTX | rep.ctx)});
    } else if (req->op == QS_OP_DETACH && (value & CONN_CTX)) {
        reap(node, value & ~CONN_CTX, QS_EV_DETACH);
        epoll_ctl(node->epoll_fd, EPOLL_CTL_MOD, fd,
                  &(struct epoll_event){.events = EPOLLIN | EPOLLRDHUP,
                                        .data.u64 = tag(TAG_CONN, fd, 0)});
    } else if (req->op == QS_OP_DETACH) {
        rep.status = detach_by_ref(node, fd, req);
    } else {
        rep.status = qs_fail(QS_EINVAL, "request op %u is not valid now", req->op);
    }
    if (rep.status != QS_OK)
        snprintf(rep.message, sizeof rep.message, "%s", qs_last_error());
    send_reply(node, fd, &rep, rep.status == QS_OK && req->op == QS_OP_ATTACH);
    if (value == CONN_REFUSE)
        close_conn(node, fd, 0, 0);
}

static void handle_request(qs_node *node, int fd, uint32_t value)
{
    struct qs_proto_request req;
    ssize_t n = recv(fd, &req, sizeof req, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n != (ssize_t)sizeof req || req.magic != QS_PROTO_MAGIC) {
        close_conn(node, fd, value, n == 0 ? QS_EV_CLIENT_DIED : QS_EV_DETACH);
        return;
    }
    answer(node, fd, value, &req);
}

/* Out of descriptors: give up the spare one to accept and refuse the waiting client, so that
 * the listening socket never stays readable (the service thread would spin on it). */
static void refuse_one(qs_node *node, int lfd)
{
    if (node->spare_fd >= 0)
        close(node->spare_fd);
    node->spare_fd = -1;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
        struct qs_proto_reply rep = {.status = QS_EFULL};
        snprintf(rep.message, sizeof rep.message,
                 "node owner is at capacity: out of descriptors; attach refused");
        send_reply(node, fd, &rep, 0);
        close(fd);
    }
    node->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void accept_conn(qs_node *node, int lfd, uint32_t slot)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE)
            refuse_one(node, lfd);
        return;
    }
    uint32_t value = fd >= node->fd_limit - FD_HEADROOM ? CONN_REFUSE : slot + 1;
    if (watch(node, fd, tag(TAG_CONN, fd, value)) != QS_OK)
        close(fd);
}

static void close_dead_listeners(qs_node *node)
{
    uint64_t v;
    if (read(node->kick_fd, &v, sizeof v) < 0 && errno != EAGAIN)
        return;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        int fd = atomic_exchange(&node->dead_listen_fd[s], -1);
        if (fd >= 0)
            close(fd);
    }
}

/* One epoll event; 1 when the service must stop. */
static int dispatch(qs_node *node, const struct epoll_event *ev)
{
    uint64_t t = ev->data.u64;
    int fd = tag_fd(t);
    switch (tag_kind(t)) {
    case TAG_CTL:
        return tag_value(t) == CTL_STOP;
    case TAG_LISTEN:
        if (atomic_load(&node->listen_fd_of_slot[tag_value(t)]) == fd)
            accept_conn(node, fd, tag_value(t));
        return 0;
    case TAG_PIDFD:
        reap(node, tag_value(t), QS_EV_CLIENT_DIED);
        return 0;
    case TAG_CONN:
        if (ev->events & EPOLLIN)
            handle_request(node, fd, tag_value(t));
        else if (ev->events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))
            close_conn(node, fd, tag_value(t), QS_EV_CLIENT_DIED);
        return 0;
    }
    return 0;
}

static void *service_main(void *arg)
{
    qs_node *node = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&node->stop)) {
        int n = epoll_wait(node->epoll_fd, evs, 64, -1);
        int kicked = 0;
        for (int k = 0; k < n; k++) {
            if (dispatch(node, &evs[k]))
                return NULL;
            kicked |= tag_kind(evs[k].data.u64) == TAG_CTL;
        }
        if (kicked)
            close_dead_listeners(node); /* after the batch: no event refers to them any more */
    }
    return NULL;
}

static int listen_at(const char *path, int *out)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return qs_fail(QS_EINVAL, "socket path %s is too long", path);
    strcpy(addr.sun_path, path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return qs_fail_errno("socket");
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) || chmod(path, 0666) || listen(fd, 512)) {
        int rc = qs_fail_errno(path);
        close(fd);
        return rc;
    }
    *out = fd;
    return QS_OK;
}

int qs_service_vgpu_added(qs_node *node, uint32_t slot)
{
    char dir[512], path[512];
    uint32_t id = node->seg.cfg->vgpus[slot].id;
    int rc = qs_vgpu_dir_path(dir, sizeof dir, node->dir, node->name, id);
    if (rc == QS_OK)
        rc = qs_vgpu_sock_path(path, sizeof path, node->dir, node->name, id);
    if (rc != QS_OK)
        return rc;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return qs_fail_errno(dir);
    struct stat sb; /* in a shared directory (/dev/shm), another user may have planted it */
    if (lstat(dir, &sb) || !S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() ||
        (sb.st_mode & 022))
        return qs_fail(QS_EEXIST, "%s exists and is not a directory of the owner's alone; "
                                  "remove it", dir);
    int fd = -1;
    rc = listen_at(path, &fd);
    if (rc == QS_OK && (rc = watch(node, fd, tag(TAG_LISTEN, fd, slot))) != QS_OK)
        close(fd);
    if (rc == QS_OK)
        atomic_store(&node->listen_fd_of_slot[slot], fd);
    return rc;
}

void qs_service_vgpu_removed(qs_node *node, uint32_t slot)
{
    char dir[512], path[512];
    uint32_t id = node->seg.cfg->vgpus[slot].id;
    int fd = atomic_exchange(&node->listen_fd_of_slot[slot], -1);
    if (fd < 0)
        return;
    epoll_ctl(node->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
    if (qs_vgpu_sock_path(path, sizeof path, node->dir, node->name, id) == QS_OK)
        unlink(path);
    if (qs_vgpu_dir_path(dir, sizeof dir, node->dir, node->name, id) == QS_OK)
        rmdir(dir);
    atomic_store(&node->dead_listen_fd[slot], fd);
    uint64_t one = 1;
    if (write(node->kick_fd, &one, sizeof one) != sizeof one)
        return;
}

static int start_epoll(qs_node *node)
{
    node->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    node->stop_fd = eventfd(0, EFD_CLOEXEC);
    node->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    node->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (node->epoll_fd < 0 || node->stop_fd < 0 || node->kick_fd < 0)
        return qs_fail_errno("epoll/eventfd");
    int rc = watch(node, node->stop_fd, tag(TAG_CTL, node->stop_fd, CTL_STOP));
    return rc == QS_OK ? watch(node, node->kick_fd, tag(TAG_CTL, node->kick_fd, CTL_KICK)) : rc;
}

static void close_fds(qs_node *node)
{
    int *fds[] = {&node->epoll_fd, &node->stop_fd, &node->kick_fd, &node->spare_fd};
    for (size_t i = 0; i < 4; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
}

int qs_service_start(qs_node *node)
{
    struct rlimit rl;
    node->fd_limit = getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur > INT_MAX ? INT_MAX
                                                                           : (int)rl.rlim_cur;
    node->epoll_fd = node->stop_fd = node->kick_fd = node->spare_fd = -1;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        node->conn_fd_of_ctx[i] = node->pidfd_of_ctx[i] = -1;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        node->listen_fd_of_slot[s] = node->dead_listen_fd[s] = -1;
    int rc = start_epoll(node);
    if (rc == QS_OK && pthread_create(&node->service_thread, NULL, service_main, node))
        rc = qs_fail(QS_ESYS, "cannot start the service thread");
    if (rc != QS_OK) {
        close_fds(node);
        return rc;
    }
    node->service_running = 1;
    return QS_OK;
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

/* ---- adopt: a restarted owner takes over the contexts of live processes ---- */

static int pidfd_open_live(const struct qs_owner_rec *r)
{
    if (r->pid <= 0)
        return -1;
    int fd = (int)syscall(SYS_pidfd_open, r->pid, 0);
    if (fd < 0)
        return -1;
    if (qs_proc_start_time(r->pid) != r->start_time) { /* the pid now names another process */
        close(fd);
        return -1;
    }
    return fd;
}

/* `fd` is the file of inode `ino` on device `dev`. */
static int is_file(int fd, uint64_t ino, uint64_t dev)
{
    struct stat sb;
    return !fstat(fd, &sb) && (uint64_t)sb.st_ino == ino && (uint64_t)sb.st_dev == dev;
}

/* A descriptor in /proc/<pid>/fd that is the memfd of inode `ino` on device `dev`, reopened.
 * The reopened descriptor is checked itself: the process may have put another file behind
 * that number since the path was checked (its own memfd, unsealed, with a valid header). */
static int fd_of(int pid, uint64_t ino, uint64_t dev)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        char link[320];
        struct stat sb;
        snprintf(link, sizeof link, "%s/%s", path, e->d_name);
        if (e->d_name[0] == '.' || stat(link, &sb) || (uint64_t)sb.st_ino != ino ||
            (uint64_t)sb.st_dev != dev)
            continue;
        found = open(link, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); /* a FIFO, a tty */
        if (found >= 0 && !is_file(found, ino, dev)) {
            close(found);
            found = -1;
        }
    }
    closedir(d);
    return found;
}

/* The memfd of inode `ino` on `dev` held by a live recorded process of vGPU slot `vslot`
 * (any slot: QS_MAX_VGPUS), or -1. */
static int find_held(qs_node *node, uint32_t vslot, uint64_t ino, uint64_t dev)
{
    const struct qs_owner *own = node->seg.owner;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        const struct qs_owner_rec *r = &own->recs[i];
        if (atomic_load(&r->state) != QS_SLOT_ACTIVE || (vslot < QS_MAX_VGPUS && r->vslot != vslot))
            continue;
        int pfd = pidfd_open_live(r);
        if (pfd < 0)
            continue;
        int fd = fd_of(r->pid, ino, dev);
        close(pfd);
        if (fd >= 0)
            return fd;
    }
    return -1;
}

int qs_service_find_state(qs_node *node)
{
    return find_held(node, QS_MAX_VGPUS, node->seg.owner->state_ino, node->seg.owner->state_dev);
}

/* Slot `s`'s memory part as a live process of it holds it, else a new one: with no process of
 * that vGPU alive, nothing of its memory is held. A part a live process holds (the inode the
 * owner recorded) whose header fails its check is still the vGPU's: a tenant rewrote it. Its
 * header is written again; a new part beside it would split the vGPU's count between its live
 * processes and new ones (up to twice its limit). Should it fail its check again (the tenant
 * rewrites it meanwhile), the vGPU is left without a part: its processes keep theirs, and new
 * attaches are refused until they are gone and the vGPU is made again. */
static int adopt_vmem(qs_node *node, uint32_t s)
{
    int fd = find_held(node, s, node->seg.owner->vmem_ino[s], node->seg.owner->vmem_dev[s]);
    if (fd < 0)
        return qs_vmem_new(&node->seg, node->name, s);
    if (qs_vmem_map(&node->seg, s, fd) == QS_OK ||
        (qs_vmem_restore_header(fd, s) == QS_OK && qs_vmem_map(&node->seg, s, fd) == QS_OK))
        return QS_OK;
    close(fd);
    return QS_OK;
}

int qs_service_adopt_vmems(qs_node *node)
{
    int rc = QS_OK;
    for (uint32_t s = 0; rc == QS_OK && s < QS_MAX_VGPUS; s++)
        if (atomic_load(&node->seg.cfg->vgpus[s].state) != QS_SLOT_FREE)
            rc = adopt_vmem(node, s);
    return rc;
}

/* Each vGPU's context count, from the records: exact even if the dead owner was killed
 * half-way through a reap. */
static void recount_contexts(qs_node *node)
{
    uint32_t count[QS_MAX_VGPUS] = {0};
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        if (atomic_load(&node->seg.owner->recs[i].state) == QS_SLOT_ACTIVE)
            count[node->seg.owner->recs[i].vslot]++;
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        atomic_store(&node->seg.state->vgpus[s].contexts, count[s]);
        uint32_t destroyed = QS_SLOT_DESTROYED; /* freed with its last context */
        if (!count[s])
            atomic_compare_exchange_strong(&node->seg.cfg->vgpus[s].state, &destroyed,
                                           QS_SLOT_FREE);
    }
}

int qs_service_adopt_contexts(qs_node *node)
{
    int pidfd[QS_MAX_CONTEXTS];
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        struct qs_owner_rec *r = &node->seg.owner->recs[i];
        pidfd[i] = -1;
        if (atomic_load(&r->state) != QS_SLOT_ACTIVE)
            continue;
        if (r->vslot >= QS_MAX_VGPUS || r->card >= QS_MAX_CARDS) { /* never written so */
            atomic_store(&r->state, QS_SLOT_FREE);
            continue;
        }
        if ((pidfd[i] = pidfd_open_live(r)) < 0)
            reap(node, i, QS_EV_CLIENT_DIED);
    }
    recount_contexts(node);
    int rc = QS_OK;
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        if (pidfd[i] < 0)
            continue;
        node->pidfd_of_ctx[i] = pidfd[i];
        if (rc == QS_OK)
            rc = watch(node, pidfd[i], tag(TAG_PIDFD, pidfd[i], i));
    }
    return rc;
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
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++) {
        if (node->conn_fd_of_ctx[i] >= 0)
            close(node->conn_fd_of_ctx[i]);
        if (node->pidfd_of_ctx[i] >= 0)
            close(node->pidfd_of_ctx[i]);
    }
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        int fd = atomic_exchange(&node->listen_fd_of_slot[s], -1);
        if (fd >= 0)
            close(fd);
        fd = atomic_exchange(&node->dead_listen_fd[s], -1);
        if (fd >= 0)
            close(fd);
    }
    close_fds(node);
}

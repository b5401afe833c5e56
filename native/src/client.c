/* client.c — the workload side: attach to a vGPU through the owner's socket, then
 * launch and reserve memory through the shared segment with no system call on an
 * uncontended path. */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct qs_client {
    struct qs_segment seg;
    int sock;
    int pid; /* the process that attached: a fork's copy detaches only itself */
    uint32_t ctx, vslot, card, priority, vgpu_id, generation;
    struct qs_ctx *c;
    struct qs_cfg_vgpu *vc;
    struct qs_card_state *cs;
    uint64_t last_unblock_ns;
    char name[QS_NAME_MAX];
    char dir[256];
    uint32_t inflight_cap; /* qs_client_set_inflight_cap; 0: the vGPU's bound */
    /* Low priority's launches in flight and the threads waiting for a slot, counted here, not
     * in the state part, which every tenant can write: a count another tenant raised (or a
     * waiter count it cleared) would hold this process's launches for good. `inflight_pid` is
     * the process they count for: a forked child's copy holds its parent's launches. */
    _Atomic uint32_t inflight, inflight_waiters;
    _Atomic int inflight_pid;
    struct qs_keeper *keeper; /* qs_client_keep_gate; NULL until asked for */
};

/* QS_EXCHANGE_TIMEOUT_MS, or $QSHARE_EXCHANGE_TIMEOUT_MS when set to a positive number (of
 * milliseconds, digits only: "2s" is not 2 ms). */
static int exchange_timeout_ms(void)
{
    const char *env = getenv("QSHARE_EXCHANGE_TIMEOUT_MS");
    char *end = NULL;
    long v = env && *env >= '0' && *env <= '9' ? strtol(env, &end, 10) : 0;
    return v > 0 && v < 600000 && *end == '\0' ? (int)v : QS_EXCHANGE_TIMEOUT_MS;
}

/* No socket: name what is missing, the whole segment or this vGPU. */
static int missing(const char *dir, const char *name, uint32_t id, const char *sock)
{
    char cfg[512];
    struct stat sb;
    if (qs_segment_path(cfg, sizeof cfg, dir, name, "cfg") == QS_OK && stat(cfg, &sb))
        return qs_fail(QS_ENOENT, "no segment at %s", cfg);
    return qs_fail(QS_ENOENT, "no vGPU with id %u in segment '%s' (no socket at %s)", id, name,
                   sock);
}

/* Connect to vGPU `id`'s socket, with a deadline on every exchange that follows. */
static int connect_owner(const char *dir, const char *name, uint32_t id, int *out)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char path[512];
    int rc = qs_check_name(name);
    if (rc == QS_OK)
        rc = qs_vgpu_sock_path(path, sizeof path, dir, name, id);
    if (rc != QS_OK)
        return rc;
    if (strlen(path) >= sizeof addr.sun_path)
        return qs_fail(QS_EINVAL, "socket path %s is too long", path);
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return qs_fail_errno("socket");
    int ms = exchange_timeout_ms();
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr)) {
        int e = errno;
        close(fd);
        if (e == ENOENT)
            return missing(dir, name, id, path);
        return qs_fail(QS_EAGENT, "node owner of segment '%s' does not answer at %s: %s", name,
                       path, strerror(e));
    }
    *out = fd;
    return QS_OK;
}

/* The descriptors an ATTACH reply carries, or -1: the first `want` of the first SCM_RIGHTS
 * message. Any other descriptor a reply carries is closed, so an owner that passes more (or
 * passes some with a refusal or a detach's answer) leaves none open here. */
static void take_fds(struct msghdr *msg, int *fds, size_t want)
{
    for (size_t i = 0; i < want; i++)
        fds[i] = -1;
    size_t kept = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (kept < want)
                fds[kept++] = fd;
            else
                close(fd);
        }
        want = kept; /* a second message adds nothing */
    }
}

/* One request and its reply; an ATTACH takes the reply's descriptors into `fds` (NULL: none
 * is wanted, any passed is closed). */
static int exchange(int fd, const struct qs_proto_request *req, struct qs_proto_reply *rep,
                    int *fds)
{
    int flags = 0; /* an owner that refused at once has closed, its reply still queued */
    if (send(fd, req, sizeof *req, MSG_NOSIGNAL) != (ssize_t)sizeof *req)
        flags = MSG_DONTWAIT;
    union {
        char buf[CMSG_SPACE(QS_ATTACH_FDS * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = rep, .iov_len = sizeof *rep};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | flags);
    if (n < 0)
        msg.msg_controllen = 0; /* a failed recvmsg leaves it as given: no descriptor came */
    take_fds(&msg, fds, fds ? QS_ATTACH_FDS : 0);
    if (n != (ssize_t)sizeof *rep && flags)
        return qs_fail(QS_EAGENT, "node owner hung up");
    if (n != (ssize_t)sizeof *rep)
        return qs_fail(QS_EAGENT, "node owner sent no reply within %d ms",
                       exchange_timeout_ms());
    rep->message[sizeof rep->message - 1] = '\0';
    return rep->status == QS_OK ? QS_OK : qs_fail(rep->status, "%s", rep->message);
}

static int bind_ctx(qs_client *cl, const struct qs_proto_reply *rep, uint32_t vgpu_id)
{
    if (rep->ctx >= QS_MAX_CONTEXTS || rep->vgpu_slot >= QS_MAX_VGPUS)
        return qs_fail(QS_ECORRUPT, "node owner replied context %u, vGPU slot %u", rep->ctx,
                       rep->vgpu_slot);
    cl->ctx = rep->ctx;
    cl->vslot = rep->vgpu_slot;
    cl->generation = rep->generation;
    cl->c = &cl->seg.state->ctxs[rep->ctx];
    cl->vc = &cl->seg.cfg->vgpus[rep->vgpu_slot];
    cl->card = cl->vc->card < QS_MAX_CARDS ? cl->vc->card : 0;
    cl->priority = cl->vc->priority;
    cl->cs = &cl->seg.state->cards[cl->card];
    cl->vgpu_id = vgpu_id;
    cl->pid = (int)getpid();
    atomic_store(&cl->inflight_pid, cl->pid);
    return QS_OK;
}

static int attach(qs_client *cl, const char *name, const char *dir, uint32_t vgpu_id)
{
    int rc = connect_owner(dir, name, vgpu_id, &cl->sock);
    struct qs_proto_reply rep;
    int fds[QS_ATTACH_FDS] = {-1, -1, -1};
    if (rc == QS_OK)
        rc = exchange(cl->sock,
                      &(struct qs_proto_request){QS_PROTO_MAGIC, QS_OP_ATTACH, vgpu_id, 0, 0, 0},
                      &rep, fds);
    if (rc == QS_OK && (fds[0] < 0 || fds[1] < 0 || fds[2] < 0))
        rc = qs_fail(QS_EAGENT, "node owner passed %s segment descriptors",
                     fds[0] < 0 && fds[1] < 0 && fds[2] < 0 ? "no" : "too few");
    if (rc == QS_OK && rep.vgpu_slot >= QS_MAX_VGPUS)
        rc = qs_fail(QS_ECORRUPT, "node owner replied vGPU slot %u", rep.vgpu_slot);
    if (rc == QS_OK && (rc = qs_segment_map_client(fds, rep.vgpu_slot, &cl->seg)) == QS_OK)
        return bind_ctx(cl, &rep, vgpu_id);
    for (int i = 0; i < QS_ATTACH_FDS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

int qs_client_attach(const char *name, const char *dir, uint32_t vgpu_id, qs_client **out)
{
    qs_clear_error();
    if (!out)
        return qs_fail(QS_EINVAL, "out pointer is NULL");
    qs_client *cl = calloc(1, sizeof *cl);
    if (!cl)
        return qs_fail(QS_ESYS, "out of memory");
    cl->sock = -1;
    qs_segment_init(&cl->seg);
    snprintf(cl->name, sizeof cl->name, "%s", name ? name : "");
    snprintf(cl->dir, sizeof cl->dir, "%s", qs_default_dir(dir));
    int rc = attach(cl, name, dir, vgpu_id);
    if (rc != QS_OK) {
        if (cl->sock >= 0)
            close(cl->sock);
        qs_segment_unmap(&cl->seg);
        free(cl);
        return rc;
    }
    *out = cl;
    return QS_OK;
}

/* The attach connection is gone (the owner restarted and adopted this context): detach over
 * a new one, naming the context and its generation. */
static int detach_again(qs_client *cl, const struct qs_proto_request *req)
{
    int fd = -1;
    struct qs_proto_reply rep;
    int rc = connect_owner(cl->dir, cl->name, cl->vgpu_id, &fd);
    if (rc == QS_OK) {
        rc = exchange(fd, req, &rep, NULL);
        close(fd);
    }
    return rc;
}

int qs_client_detach(qs_client *cl)
{
    qs_clear_error();
    if (!cl)
        return qs_fail(QS_EINVAL, "client is NULL");
    int rc = QS_OK;
    qs_keeper_stop(cl->keeper); /* before the segment goes, and before the detach's exchange */
    if (cl->pid == (int)getpid()) { /* a fork's copy only drops itself */
        struct qs_proto_request req = {QS_PROTO_MAGIC, QS_OP_DETACH, cl->vgpu_id, cl->ctx,
                                       cl->generation, 0};
        struct qs_proto_reply rep;
        rc = exchange(cl->sock, &req, &rep, NULL);
        if (rc == QS_EAGENT)
            rc = detach_again(cl, &req);
    }
    close(cl->sock);
    qs_segment_unmap(&cl->seg);
    free(cl);
    return rc;
}

static int check_live(qs_client *cl)
{
    if (atomic_load_explicit(&cl->vc->state, memory_order_relaxed) != QS_SLOT_ACTIVE)
        return qs_fail(QS_EDESTROYED, "vGPU %u was destroyed", cl->vgpu_id);
    return QS_OK;
}

/* Block while an explicit suspension holds; 1 if it blocked. */
static int wait_resumed(qs_client *cl)
{
    int blocked = 0;
    while (atomic_load(&cl->vc->suspended) && check_live(cl) == QS_OK) {
        blocked = 1;
        qs_futex_wait(&cl->vc->suspended, 1, 0);
    }
    return blocked;
}

/* In a child forked from the process that counted the launches in flight (a slot is wanted
 * and none is free: no system call on the fast path): the count is its parent's, whose
 * launches it never ends, so it starts from none. 1 when it did. */
static int forked_copy(qs_client *cl)
{
    int counted = atomic_load(&cl->inflight_pid), me = (int)getpid();
    if (counted == me || !atomic_compare_exchange_strong(&cl->inflight_pid, &counted, me))
        return 0;
    atomic_store(&cl->inflight, 0);
    return 1;
}

/* Take one of the context's in-flight slots: the check against the bound and the increment
 * are one compare-and-swap, so threads sharing the context never pass the bound together.
 * The state part's waiter count mirrors this process's, for the owner to read. */
static void claim_inflight_slot(qs_client *cl)
{
    uint32_t max = cl->inflight_cap ? cl->inflight_cap
                   : cl->vc->lp_max_inflight ? cl->vc->lp_max_inflight : 1;
    uint32_t n = atomic_load(&cl->inflight);
    for (;;) {
        if (n < max) {
            if (atomic_compare_exchange_weak(&cl->inflight, &n, n + 1))
                return;
            continue;
        }
        if (!forked_copy(cl)) {
            atomic_fetch_add(&cl->inflight_waiters, 1);
            atomic_fetch_add(&cl->c->inflight_waiters, 1);
            qs_futex_wait(&cl->inflight, n, 0);
            atomic_fetch_sub(&cl->c->inflight_waiters, 1);
            atomic_fetch_sub(&cl->inflight_waiters, 1);
        }
        n = atomic_load(&cl->inflight);
    }
}

/* The uncontended path is a few loads and one increment; everything else is a wait. */
static int lp_may_pass(qs_client *cl)
{
    return atomic_load(&cl->cs->gate) == QS_GATE_OPEN &&
           !atomic_load_explicit(&cl->vc->suspended, memory_order_relaxed) &&
           atomic_load_explicit(&cl->vc->state, memory_order_relaxed) == QS_SLOT_ACTIVE;
}

static int lp_wait_gate(qs_client *cl)
{
    int blocked = 0;
    while (!lp_may_pass(cl)) {
        if (check_live(cl) != QS_OK)
            return QS_EDESTROYED;
        blocked |= wait_resumed(cl);
        if (atomic_load(&cl->cs->gate) != QS_GATE_OPEN)
            blocked |= qs_gate_wait(&cl->seg, cl->card, NULL, &cl->c->gate_sleepers);
    }
    if (blocked)
        cl->last_unblock_ns = qs_now_ns();
    return QS_OK;
}

static int lp_begin(qs_client *cl)
{
    int rc = lp_wait_gate(cl);
    if (rc != QS_OK)
        return rc;
    claim_inflight_slot(cl);
    if (atomic_load_explicit(&cl->seg.cfg->cards[cl->card].policy, memory_order_relaxed) !=
        QS_POLICY_BEST_EFFORT)
        rc = qs_policy_begin(&cl->seg, cl->ctx, cl->card, cl->vslot);
    return rc;
}

static int hp_begin(qs_client *cl)
{
    if (atomic_load_explicit(&cl->vc->suspended, memory_order_relaxed) && wait_resumed(cl))
        cl->last_unblock_ns = qs_now_ns();
    if (check_live(cl) != QS_OK)
        return QS_EDESTROYED;
    atomic_fetch_add(&cl->c->inflight, 1);
    qs_gate_hp_begin(&cl->seg, cl->card);
    return QS_OK;
}

int qs_launch_begin(qs_client *cl)
{
    QS_REQUIRE(cl, "client");
    int rc = cl->priority == QS_PRIO_HIGH ? hp_begin(cl) : lp_begin(cl);
    if (rc == QS_OK) /* exact with any number of threads */
        atomic_fetch_add_explicit(&cl->c->launches, 1, memory_order_relaxed);
    return rc;
}

/* High priority's count is in the state part (the owner reads it to release the card); low
 * priority's is the process's own (claim_inflight_slot). */
int qs_launch_end(qs_client *cl)
{
    QS_REQUIRE(cl, "client");
    int hp = cl->priority == QS_PRIO_HIGH;
    if (hp) {
        /* A store, not a CAS loop: racing HP ends differ by nanoseconds. */
        uint64_t now = qs_now_ns();
        if (now > atomic_load_explicit(&cl->cs->last_hp_ns, memory_order_relaxed))
            atomic_store_explicit(&cl->cs->last_hp_ns, now, memory_order_release);
    }
    _Atomic uint32_t *count = hp ? &cl->c->inflight : &cl->inflight;
    uint32_t before = atomic_fetch_sub(count, 1);
    if (before == 0) {
        atomic_fetch_add(count, 1);
        return qs_fail(QS_ESTATE, "launch_end without a matching launch_begin");
    }
    if (hp && before == 1)
        qs_gate_hp_end(cl->cs);
    if (!hp && atomic_load(&cl->inflight_waiters))
        qs_futex_wake(&cl->inflight, INT_MAX);
    return QS_OK;
}

int qs_mem_reserve(qs_client *cl, uint64_t bytes)
{
    qs_clear_error();
    QS_REQUIRE(cl, "client");
    if (check_live(cl) != QS_OK)
        return QS_EDESTROYED;
    return qs_mem_reserve_ctx(&cl->seg, (struct qs_ctx_ref){cl->ctx, cl->vslot, cl->generation},
                              bytes);
}

int qs_mem_release(qs_client *cl, uint64_t bytes)
{
    qs_clear_error();
    QS_REQUIRE(cl, "client");
    return qs_mem_release_ctx(&cl->seg, (struct qs_ctx_ref){cl->ctx, cl->vslot, cl->generation},
                              bytes);
}

int qs_client_info_get(qs_client *cl, qs_client_info *out)
{
    qs_clear_error();
    QS_REQUIRE(cl, "client");
    QS_REQUIRE(out, "out pointer");
    const struct qs_cfg_card *card = &cl->seg.cfg->cards[cl->card];
    *out = (qs_client_info){.vgpu = cl->vgpu_id, .card = cl->card, .priority = cl->priority,
                            .core_share = atomic_load(&cl->vc->core_share),
                            .mem_limit = atomic_load(&cl->vc->mem_limit),
                            .mem_used = qs_mem_used(&cl->seg, cl->vslot),
                            .mem_reserved = qs_mem_reserved(&cl->seg, cl->vslot, cl->ctx),
                            .card_total_mem = card->total_mem};
    snprintf(out->card_uuid, sizeof out->card_uuid, "%s", card->uuid);
    return check_live(cl);
}

int qs_account_device_time(qs_client *cl, uint64_t ns)
{
    QS_REQUIRE(cl, "client");
    atomic_fetch_add_explicit(&cl->seg.state->vgpus[cl->vslot].device_ns, ns,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&cl->cs->device_ns, ns, memory_order_relaxed);
    qs_policy_account(&cl->seg, cl->vslot, ns);
    return QS_OK;
}

static void sleep_until(uint64_t deadline)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                          .tv_nsec = (long)(deadline % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* One kernel on the simulated card: gated, booked on the card's timeline, waited for. */
int qs_sim_kernel(qs_client *cl, uint64_t duration_ns)
{
    QS_REQUIRE(cl, "client");
    static _Thread_local int slack_set;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* simulated kernels want µs accuracy */
        slack_set = 1;
    }
    int rc = qs_launch_begin(cl);
    if (rc != QS_OK)
        return rc;
    uint64_t start = qs_sim_book(&cl->seg, cl->card, duration_ns);
    sleep_until(start + duration_ns);
    qs_account_device_time(cl, duration_ns);
    qs_launch_end(cl);
    return QS_OK;
}

int qs_sim_kernels(qs_client *cl, uint32_t count, uint64_t duration_ns)
{
    QS_REQUIRE(cl, "client");
    int rc = QS_OK;
    for (uint32_t i = 0; i < count && rc == QS_OK; i++)
        rc = qs_sim_kernel(cl, duration_ns);
    return rc;
}

uint64_t qs_client_last_unblock_ns(qs_client *cl)
{
    return cl ? cl->last_unblock_ns : 0;
}

int qs_bench_launch_overhead(qs_client *cl, uint64_t iterations, double *ns_per_pair)
{
    QS_REQUIRE(cl, "client");
    if (!iterations || !ns_per_pair)
        return qs_fail(QS_EINVAL, "iterations must be positive and ns_per_pair non-NULL");
    uint64_t start = qs_now_ns();
    for (uint64_t i = 0; i < iterations; i++) {
        int rc = qs_launch_begin(cl);
        if (rc != QS_OK)
            return rc;
        qs_launch_end(cl);
    }
    *ns_per_pair = (double)(qs_now_ns() - start) / (double)iterations;
    return QS_OK;
}

int qs_bench_timed_begin(qs_client *cl, uint64_t *begin_ns, uint64_t *done_ns)
{
    QS_REQUIRE(cl, "client");
    if (!begin_ns || !done_ns)
        return qs_fail(QS_EINVAL, "begin_ns and done_ns must be non-NULL");
    *begin_ns = qs_now_ns();
    int rc = qs_launch_begin(cl);
    *done_ns = qs_now_ns();
    return rc;
}

uint64_t qs_client_lp_window_ns(qs_client *cl)
{
    if (!cl)
        return QS_DEFAULT_LP_WINDOW_NS;
    uint64_t window = qs_card_lp_window(&cl->seg.cfg->cards[cl->card]);
    for (uint32_t w = 0; w < QS_MASK_WORDS; w++)
        if (atomic_load_explicit(&cl->cs->hp_mask[w], memory_order_relaxed))
            return window;
    return window > QS_LP_WINDOW_ALONE_NS ? window : QS_LP_WINDOW_ALONE_NS;
}

const void *qs_client_gate_word(qs_client *cl)
{
    return cl ? (const void *)&cl->cs->gate : NULL;
}

int qs_client_keep_gate(qs_client *cl)
{
    qs_clear_error();
    QS_REQUIRE(cl, "client");
    if (cl->keeper)
        return QS_OK;
    return qs_keeper_start(&cl->seg, cl->card, cl->sock, &cl->c->gate_sleepers, &cl->keeper);
}

int qs_client_lp_device_gate(qs_client *cl)
{
    return cl ? (int)atomic_load(&cl->seg.cfg->cards[cl->card].lp_device_gate) : 0;
}

uint64_t qs_client_hp_episodes(qs_client *cl)
{
    return cl ? atomic_load(&cl->cs->episodes) : 0;
}

struct qs_segment *qs_client_segment(qs_client *cl, uint32_t *card)
{
    *card = cl->card;
    return &cl->seg;
}

int qs_client_set_inflight_cap(qs_client *cl, uint32_t max_launches)
{
    QS_REQUIRE(cl, "client");
    cl->inflight_cap = max_launches;
    return QS_OK;
}

/* test_hardening.c — specifications from the driver audit: a corrupted or killed client never
 * crashes the owner nor leaves a count raised, handles are checked against the context's
 * generation, the owner refuses attaches past its capacity without spinning, a segment part
 * that is not a regular file is refused without blocking, and the event ring loses no event to
 * a slow writer nor stalls behind a dead one. */
#include "harness.h"
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#define GiB (1ull << 30)
#define MiB (1ull << 20)

static qs_node *make_node(const char *tag)
{
    qs_node *node = NULL;
    if (qs_node_create(test_segment(tag), NULL, 1, &node) != QS_OK)
        return NULL;
    if (qs_card_add(node, 0, "GPU-test-0", 16 * GiB) != QS_OK) {
        qs_node_close(node);
        return NULL;
    }
    return node;
}

static int vgpu(qs_node *node, uint32_t id, uint32_t prio, uint32_t share, uint64_t mem)
{
    qs_vgpu_spec spec = {.id = id, .card = 0, .priority = prio, .core_share = share,
                         .mem_limit = mem};
    return qs_vgpu_create(node, &spec);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll (in the test only) until `cond` holds or ~2 s pass. */
#define EVENTUALLY(cond)                                     \
    do {                                                     \
        for (int tries_ = 0; !(cond) && tries_ < 2000; tries_++) \
            sleep_ms(5);                                     \
    } while (0)

/* fork() whose child dies with this process: a test that fails half-way leaves no child
 * behind holding the runner's output pipe open. */
static pid_t fork_child(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(3);
    }
    return pid;
}

static int wait_event(qs_node *node, uint32_t kind)
{
    qs_event ev;
    for (int i = 0; i < 100; i++)
        if (qs_node_next_event(node, &ev, 50) == QS_OK && ev.kind == kind)
            return 1;
    return 0;
}

/* The context slot a process holds, from the shared state (as any client could read it). */
static int ctx_of(qs_node *node, int pid)
{
    for (uint32_t i = 0; i < QS_MAX_CONTEXTS; i++)
        if (atomic_load(&node->seg.state->ctxs[i].state) == QS_SLOT_ACTIVE &&
            node->seg.state->ctxs[i].pid == pid)
            return (int)i;
    return -1;
}

static void kill_and_wait(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int test_corrupted_context_entry_does_not_crash_the_owner(void)
{
    qs_node *node = make_node("corrupt");
    EXPECT(node && vgpu(node, 1, QS_PRIO_HIGH, 50, GiB) == QS_OK);
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        if (qs_client_attach(test_segment("corrupt"), NULL, 1, &cl) || qs_mem_reserve(cl, MiB))
            _exit(2);
        struct qs_ctx *c = &node->seg.state->ctxs[ctx_of(node, (int)getpid())];
        c->vgpu_slot = 0x7fffffffu; /* a stray write from a buggy application */
        c->card = 0x7fffffffu;
        c->priority = 9;
        atomic_store(&c->gate_sleepers, 0xffffffffu);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT(wait_event(node, QS_EV_CLIENT_DIED));
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.contexts == 0 && st.mem_used == 0);
    qs_node_close(node);
    return 0;
}

/* Burst-share: vGPU 1 is ahead of vGPU 2, which has work; a process of vGPU 1 then waits in
 * the policy. Returns its pid once it is counted as waiting. */
static pid_t policy_waiter(qs_node *node, const char *tag, int *s1, int *s2)
{
    *s1 = qs_find_vgpu(node->seg.cfg, 1);
    *s2 = qs_find_vgpu(node->seg.cfg, 2);
    qs_card_set_policy(node, 0, QS_POLICY_BURST_SHARE);
    struct qs_policy_state *p1 = &node->seg.state->vgpus[*s1].policy;
    struct qs_policy_state *p2 = &node->seg.state->vgpus[*s2].policy;
    atomic_store(&p1->vtime_ns, 10000000ull);
    atomic_store(&p2->waiting, 1); /* vGPU 2 has work: one of its processes waits */
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        if (qs_client_attach(test_segment(tag), NULL, 1, &cl) == QS_OK)
            qs_launch_begin(cl);
        _exit(2);
    }
    EVENTUALLY(atomic_load(&p1->waiting) == 1);
    return pid;
}

static int test_killed_policy_waiter_leaves_no_waiting_count(void)
{
    qs_node *node = make_node("polwait");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int s1, s2;
    pid_t pid = policy_waiter(node, "polwait", &s1, &s2);
    EXPECT(atomic_load(&node->seg.state->vgpus[s1].policy.waiting) == 1);
    kill_and_wait(pid);
    EXPECT(wait_event(node, QS_EV_CLIENT_DIED));
    EXPECT(atomic_load(&node->seg.state->vgpus[s1].policy.waiting) == 0);
    EXPECT(atomic_load(&node->seg.state->cards[0].policy_waiters) == 0);
    qs_node_close(node);
    return 0;
}

static int test_burst_share_peer_keeps_launching_after_a_policy_waiter_is_killed(void)
{
    qs_node *node = make_node("poldead");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int s1, s2;
    pid_t pid = policy_waiter(node, "poldead", &s1, &s2);
    kill_and_wait(pid);
    EXPECT(wait_event(node, QS_EV_CLIENT_DIED));
    atomic_store(&node->seg.state->vgpus[s2].policy.waiting, 0);
    pid = fork_child();
    if (pid == 0) { /* 40 ms of scaled device time: well past vGPU 1's lead */
        alarm(5);
        qs_client *cl = NULL;
        int ok = qs_client_attach(test_segment("poldead"), NULL, 2, &cl) == QS_OK &&
                 qs_sim_kernels(cl, 100, 200000) == QS_OK;
        _exit(ok ? 0 : 2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    qs_node_close(node);
    return 0;
}

static int test_killed_gate_sleeper_leaves_no_sleeper_count(void)
{
    qs_node *node = make_node("gatewait");
    EXPECT(node && vgpu(node, 1, QS_PRIO_HIGH, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    /* a delay too short to sleep through: waiters ask to be woken when HP turns quiet */
    EXPECT(qs_card_set_release_delay(node, 0, 0) == QS_OK);
    qs_client *hp = NULL;
    EXPECT(qs_client_attach(test_segment("gatewait"), NULL, 1, &hp) == QS_OK);
    EXPECT(qs_launch_begin(hp) == QS_OK);
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        if (qs_client_attach(test_segment("gatewait"), NULL, 2, &cl) == QS_OK)
            qs_launch_begin(cl);
        _exit(2);
    }
    struct qs_card_state *cs = &node->seg.state->cards[0];
    EVENTUALLY(atomic_load(&cs->untimed_sleepers) == 2); /* the release thread and the child */
    EXPECT(atomic_load(&cs->untimed_sleepers) == 2);
    kill_and_wait(pid);
    EXPECT(wait_event(node, QS_EV_CLIENT_DIED));
    EVENTUALLY(atomic_load(&cs->untimed_sleepers) <= 1);
    EXPECT(atomic_load(&cs->untimed_sleepers) <= 1);
    EXPECT(qs_launch_end(hp) == QS_OK && qs_client_detach(hp) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_gate_left_releasing_by_a_killed_process_opens_again(void)
{
    qs_node *node = make_node("releasing");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(qs_card_set_release_delay(node, 0, 1000000) == QS_OK);
    pid_t pid = fork_child();
    if (pid == 0) { /* killed between CLOSED -> RELEASING and RELEASING -> OPEN */
        qs_client *cl = NULL;
        if (qs_client_attach(test_segment("releasing"), NULL, 1, &cl) == QS_OK)
            atomic_store(&node->seg.state->cards[0].gate, QS_GATE_RELEASING);
        raise(SIGKILL);
    }
    waitpid(pid, NULL, 0);
    EXPECT(wait_event(node, QS_EV_CLIENT_DIED));
    EVENTUALLY(atomic_load(&node->seg.state->cards[0].gate) == QS_GATE_OPEN);
    EXPECT(atomic_load(&node->seg.state->cards[0].gate) == QS_GATE_OPEN);
    qs_node_close(node);
    return 0;
}

/* The child's side: hold the context's only in-flight slot, tell the parent which context it
 * is, then begin again: that launch waits for the slot, which nobody will give back. */
static void wait_for_own_inflight_slot(qs_node *node, int report_fd)
{
    qs_client *cl = NULL;
    int slot = -1;
    if (qs_client_attach(test_segment("reuse"), NULL, 1, &cl) == QS_OK &&
        qs_client_set_inflight_cap(cl, 1) == QS_OK && qs_launch_begin(cl) == QS_OK)
        slot = ctx_of(node, (int)getpid());
    if (write(report_fd, &slot, sizeof slot) == (ssize_t)sizeof slot && slot >= 0)
        qs_launch_begin(cl);
    _exit(2);
}

static int test_reused_context_slot_starts_with_no_inflight_waiters(void)
{
    qs_node *node = make_node("reuse");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int report[2];
    EXPECT(pipe(report) == 0);
    pid_t pid = fork_child();
    if (pid == 0) /* one thread: a thread started in a fork of this threaded runner can block
                   * in the sanitizer's allocator, whose lock another thread held at fork */
        wait_for_own_inflight_slot(node, report[1]);
    close(report[1]);
    int slot = -1;
    EXPECT(read(report[0], &slot, sizeof slot) == (ssize_t)sizeof slot && slot >= 0);
    close(report[0]);
    _Atomic uint32_t *waiters = &node->seg.state->ctxs[slot].inflight_waiters;
    uint32_t waiting = 0; /* raised just before the child's futex wait; read once */
    EVENTUALLY((waiting = atomic_load(waiters)) == 1);
    EXPECT(waiting == 1);
    kill_and_wait(pid);
    EXPECT(wait_event(node, QS_EV_CLIENT_DIED));
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("reuse"), NULL, 1, &cl) == QS_OK);
    EXPECT(ctx_of(node, (int)getpid()) == slot);
    EXPECT(atomic_load(&node->seg.state->ctxs[slot].inflight_waiters) == 0);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_detach_from_a_fork_leaves_the_parent_attached(void)
{
    qs_node *node = make_node("forkdet");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("forkdet"), NULL, 1, &cl) == QS_OK);
    EXPECT(qs_mem_reserve(cl, 512 * MiB) == QS_OK);
    pid_t pid = fork_child();
    if (pid == 0)
        _exit(qs_client_detach(cl) == QS_OK ? 0 : 2);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.contexts == 1);
    EXPECT(st.mem_used == 512 * MiB);
    EXPECT(qs_mem_reserve(cl, 600 * MiB) == QS_ENOMEM);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_reservation_through_a_reaped_handle_is_refused(void)
{
    qs_node *node = make_node("stale");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("stale"), NULL, 1, &cl) == QS_OK);
    int fds[2];
    EXPECT(pipe(fds) == 0);
    pid_t pid = fork_child();
    if (pid == 0) { /* the fork keeps a copy of the handle; the parent detaches */
        char go;
        if (read(fds[0], &go, 1) != 1)
            _exit(3);
        _exit(qs_mem_reserve(cl, 100 * MiB) == QS_ESTATE ? 0 : 2);
    }
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_client *other = NULL; /* another tenant's process takes the slot */
    EXPECT(qs_client_attach(test_segment("stale"), NULL, 2, &other) == QS_OK);
    EXPECT(write(fds[1], "g", 1) == 1);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.mem_used == 0);
    EXPECT(qs_vgpu_stats_get(node, 2, &st) == QS_OK && st.mem_used == 0);
    EXPECT(qs_client_detach(other) == QS_OK);
    close(fds[0]);
    close(fds[1]);
    qs_node_close(node);
    return 0;
}

/* ---- capacity ---- */

static long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 14; field++)
        p = strchr(p + 1, ' ');
    long utime = 0, stime = 0;
    return p && sscanf(p + 1, "%ld %ld", &utime, &stime) == 2 ? utime + stime : -1;
}

static pid_t owner_with_fd_limit(const char *tag, rlim_t limit, int ready_fd)
{
    pid_t pid = fork_child();
    if (pid == 0) {
        struct rlimit rl = {limit, limit};
        qs_node *node = NULL;
        if (setrlimit(RLIMIT_NOFILE, &rl) || !(node = make_node(tag)) ||
            vgpu(node, 1, QS_PRIO_LOW, 50, GiB) != QS_OK)
            _exit(2);
        if (write(ready_fd, "r", 1) != 1)
            _exit(2);
        for (;;)
            pause();
    }
    return pid;
}

static int test_attach_past_the_owners_descriptors_is_refused_without_spinning(void)
{
    enum { MAX = 120 };
    int fds[2];
    char r;
    EXPECT(pipe(fds) == 0);
    pid_t owner = owner_with_fd_limit("fdcap", 64, fds[1]);
    EXPECT(read(fds[0], &r, 1) == 1);
    qs_client *cls[MAX] = {0};
    int n = 0, rc = QS_OK;
    while (n < MAX && (rc = qs_client_attach(test_segment("fdcap"), NULL, 1, &cls[n])) == QS_OK)
        n++;
    int named = strstr(qs_last_error(), "capacity") != NULL;
    if (rc != QS_EFULL || !named)
        fprintf(stderr, "  attach %d: %d %s\n", n, rc, qs_last_error());
    long before = cpu_ticks(owner);
    sleep_ms(500);
    long used = cpu_ticks(owner) - before; /* a spinning owner uses ~50 ticks */
    int freed = n > 0 && qs_client_detach(cls[0]) == QS_OK;
    int again = freed && qs_client_attach(test_segment("fdcap"), NULL, 1, &cls[0]) == QS_OK;
    for (int i = again ? 0 : 1; i < n; i++)
        qs_client_detach(cls[i]);
    kill_and_wait(owner);
    close(fds[0]);
    close(fds[1]);
    qs_segment_unlink(NULL, test_segment("fdcap"));
    EXPECT(rc == QS_EFULL && named);
    EXPECT(before >= 0 && used < 15);
    EXPECT(again);
    return 0;
}

/* An attach to an owner that accepts and never answers, with QSHARE_EXCHANGE_TIMEOUT_MS set to
 * `timeout_ms`: its status, and how long it took in *took. */
static int mute_owner_attach(const char *timeout_ms, uint64_t *took)
{
    char dir[512], path[512];
    const char *name = test_segment("mute");
    qs_vgpu_dir_path(dir, sizeof dir, NULL, name, 1);
    qs_vgpu_sock_path(path, sizeof path, NULL, name, 1);
    mkdir(dir, 0755);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return QS_EINVAL;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 4))
        return QS_ESYS;
    setenv("QSHARE_EXCHANGE_TIMEOUT_MS", timeout_ms, 1);
    qs_client *cl = NULL;
    uint64_t t0 = qs_now_ns();
    int rc = qs_client_attach(name, NULL, 1, &cl);
    *took = qs_now_ns() - t0;
    unsetenv("QSHARE_EXCHANGE_TIMEOUT_MS");
    close(lfd);
    unlink(path);
    rmdir(dir);
    return rc;
}

/* "2s" is not a number of milliseconds: the 5 s default holds (before, strtol read it as 2 ms
 * and an owner busy for a moment failed the attach). */
static int test_an_exchange_timeout_with_a_unit_is_refused_for_the_default(void)
{
    uint64_t took = 0;
    EXPECT(mute_owner_attach("2s", &took) == QS_EAGENT);
    EXPECT(took >= 4000000000ull);
    return 0;
}

/* One tenant cannot take the node's context table: its vGPU's attaches past
 * QS_MAX_CONTEXTS_PER_VGPU are refused, and another vGPU still attaches. */
static int test_attaches_past_the_per_vgpu_cap_are_refused_and_others_attach(void)
{
    qs_node *node = make_node("ctxcap");
    EXPECT(node != NULL);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    static qs_client *cls[QS_MAX_CONTEXTS_PER_VGPU + 1];
    uint32_t n = 0;
    while (n < QS_MAX_CONTEXTS_PER_VGPU &&
           qs_client_attach(test_segment("ctxcap"), NULL, 1, &cls[n]) == QS_OK)
        n++;
    qs_client *over = NULL, *other = NULL;
    int rc = qs_client_attach(test_segment("ctxcap"), NULL, 1, &over);
    int named = strstr(qs_last_error(), "vGPU 1 has") != NULL;
    int other_rc = qs_client_attach(test_segment("ctxcap"), NULL, 2, &other);
    int freed = n > 0 && qs_client_detach(cls[--n]) == QS_OK;
    int again = freed && qs_client_attach(test_segment("ctxcap"), NULL, 1, &cls[n++]) == QS_OK;
    for (uint32_t i = 0; i < n; i++)
        qs_client_detach(cls[i]);
    if (over)
        qs_client_detach(over);
    if (other)
        qs_client_detach(other);
    qs_node_close(node);
    EXPECT(n == QS_MAX_CONTEXTS_PER_VGPU);
    EXPECT(rc == QS_EFULL && named);
    EXPECT(other_rc == QS_OK);
    EXPECT(again);
    return 0;
}

static int test_owner_that_never_answers_fails_the_attach_by_its_deadline(void)
{
    uint64_t took = 0;
    EXPECT(mute_owner_attach("200", &took) == QS_EAGENT);
    EXPECT(took < 3000000000ull);
    return 0;
}

/* ---- segment parts that are not what they claim ---- */

static int adopt_in_child(const char *name)
{
    pid_t pid = fork_child();
    if (pid == 0) {
        alarm(5); /* a blocking open() would hang here */
        qs_node *node = NULL;
        int rc = qs_node_adopt(name, NULL, &node);
        _exit(rc == QS_EMAGIC && strstr(qs_last_error(), "regular file") ? 0 : 2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int test_fifo_in_place_of_a_segment_part_is_refused_without_blocking(void)
{
    const char *name = test_segment("fifo");
    char path[512];
    qs_segment_path(path, sizeof path, NULL, name, "cfg");
    unlink(path);
    EXPECT(mkfifo(path, 0600) == 0);
    int ok = adopt_in_child(name);
    unlink(path);
    EXPECT(ok);
    return 0;
}

static int test_symlink_in_place_of_a_segment_part_is_refused(void)
{
    qs_node *node = make_node("link");
    EXPECT(node);
    char target[512], path[512];
    const char *name = "ct-link-alias";
    qs_segment_path(target, sizeof target, NULL, test_segment("link"), "cfg");
    qs_segment_path(path, sizeof path, NULL, name, "cfg");
    unlink(path);
    EXPECT(symlink(target, path) == 0);
    qs_node *adopted = NULL;
    int rc = qs_node_adopt(name, NULL, &adopted);
    unlink(path);
    EXPECT(rc == QS_EMAGIC && strstr(qs_last_error(), "symbolic link") != NULL);
    qs_node_close(node);
    return 0;
}

static int test_vgpu_socket_refuses_another_vgpus_id(void)
{
    qs_node *node = make_node("ids");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    char sock1[512], link[512];
    qs_vgpu_sock_path(sock1, sizeof sock1, NULL, test_segment("ids"), 1);
    qs_vgpu_sock_path(link, sizeof link, NULL, test_segment("ids"), 2);
    EXPECT(unlink(link) == 0 && symlink(sock1, link) == 0); /* vGPU 2's path leads to vGPU 1 */
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("ids"), NULL, 2, &cl) == QS_ENOENT);
    EXPECT(strstr(qs_last_error(), "serves vGPU 1") != NULL);
    qs_node_close(node);
    return 0;
}

/* Over a connection of its own, ask the owner to detach context `ctx` of `generation`. */
static int forged_detach(const char *name, uint32_t vgpu_id, uint32_t ctx, uint32_t generation)
{
    char path[512];
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    qs_vgpu_sock_path(path, sizeof path, NULL, name, vgpu_id);
    if (strlen(path) >= sizeof addr.sun_path)
        return QS_EINVAL;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct qs_proto_request req = {QS_PROTO_MAGIC, QS_OP_DETACH, vgpu_id, ctx, generation, 0};
    struct qs_proto_reply rep = {.status = QS_EAGENT};
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) ||
        send(fd, &req, sizeof req, 0) != sizeof req || recv(fd, &rep, sizeof rep, 0) <= 0)
        rep.status = QS_EAGENT;
    close(fd);
    return rep.status;
}

static int test_another_process_cannot_detach_a_context(void)
{
    qs_node *node = make_node("forge");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("forge"), NULL, 1, &cl) == QS_OK);
    EXPECT(qs_mem_reserve(cl, MiB) == QS_OK);
    int ctx = ctx_of(node, (int)getpid());
    uint32_t gen = atomic_load(&node->seg.state->ctxs[ctx].generation);
    pid_t pid = fork_child();
    if (pid == 0)
        _exit(forged_detach(test_segment("forge"), 1, (uint32_t)ctx, gen) == QS_ESTATE ? 0 : 2);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.contexts == 1 && st.mem_used == MiB);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_planted_vgpu_directory_is_refused(void)
{
    qs_node *node = make_node("plant");
    EXPECT(node);
    char dir[512];
    qs_vgpu_dir_path(dir, sizeof dir, NULL, test_segment("plant"), 1);
    EXPECT(symlink("/tmp", dir) == 0); /* someone else's directory, by a link */
    int rc = vgpu(node, 1, QS_PRIO_LOW, 50, GiB);
    const char *msg = qs_last_error();
    int named = strstr(msg, "remove it") != NULL;
    unlink(dir);
    EXPECT(rc == QS_EEXIST && named);
    uint32_t count = 9;
    EXPECT(qs_node_list_vgpus(node, NULL, 0, &count) == QS_OK && count == 0);
    qs_node_close(node);
    return 0;
}

/* ---- trust: what a client receives ---- */

/* The descriptor of this process whose link target starts with `prefix`, or -1. */
static int fd_linking_to(const char *prefix)
{
    for (int fd = 3; fd < 1024; fd++) {
        char path[64], target[512];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (strncmp(target, prefix, strlen(prefix)) == 0)
            return fd;
    }
    return -1;
}

static int test_client_cannot_resize_the_state_part(void)
{
    qs_node *node = make_node("seal");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("seal"), NULL, 1, &cl) == QS_OK);
    char prefix[128];
    snprintf(prefix, sizeof prefix, "/memfd:qshare.%s.state", test_segment("seal"));
    int fd = fd_linking_to(prefix);
    EXPECT(fd >= 0);
    EXPECT(ftruncate(fd, 4096) != 0 && errno == EPERM);
    EXPECT(ftruncate(fd, (off_t)(sizeof(struct qs_state) * 2)) != 0 && errno == EPERM);
    EXPECT(qs_mem_reserve(cl, MiB) == QS_OK); /* the node works on */
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

/* The start of a shared read-only mapping of `file`, or NULL. */
static void *read_only_mapping_of(const char *file, size_t *len)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    void *found = NULL;
    while (f && !found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (strstr(line, file) && sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 &&
            !strcmp(perms, "r--s")) {
            found = (void *)lo;
            *len = hi - lo;
        }
    }
    if (f)
        fclose(f);
    return found;
}

static int test_client_cannot_make_the_configuration_writable(void)
{
    qs_node *node = make_node("rocfg");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("rocfg"), NULL, 1, &cl) == QS_OK);
    char file[128];
    snprintf(file, sizeof file, "qshare.%s.cfg", test_segment("rocfg"));
    size_t len = 0;
    void *map = read_only_mapping_of(file, &len);
    EXPECT(map != NULL);
    EXPECT(mprotect(map, len, PROT_READ | PROT_WRITE) != 0 && errno == EACCES);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_segment_files_are_the_owners_alone(void)
{
    qs_node *node = make_node("modes");
    EXPECT(node);
    char path[512];
    struct stat sb;
    const char *parts[] = {"cfg", "owner"};
    for (int i = 0; i < 2; i++) {
        qs_segment_path(path, sizeof path, NULL, test_segment("modes"), parts[i]);
        EXPECT(stat(path, &sb) == 0 && (sb.st_mode & 077) == 0);
    }
    qs_segment_path(path, sizeof path, NULL, test_segment("modes"), "state");
    EXPECT(stat(path, &sb) != 0); /* the state part has no path at all */
    qs_node_close(node);
    return 0;
}

static int test_adopt_recounts_contexts_from_the_owners_records(void)
{
    int fds[2];
    char r;
    EXPECT(pipe(fds) == 0);
    pid_t owner = owner_with_fd_limit("recount", 256, fds[1]);
    EXPECT(read(fds[0], &r, 1) == 1);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("recount"), NULL, 1, &cl) == QS_OK);
    char prefix[128];
    snprintf(prefix, sizeof prefix, "/memfd:qshare.%s.state", test_segment("recount"));
    int sfd = fd_linking_to(prefix);
    struct qs_state *st = sfd < 0 ? MAP_FAILED
                                  : mmap(NULL, sizeof *st, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    EXPECT(st != MAP_FAILED);
    atomic_store(&st->vgpus[0].contexts, 5); /* as a reap cut short by the owner's death */
    kill_and_wait(owner);
    qs_node *node = NULL;
    EXPECT(qs_node_adopt(test_segment("recount"), NULL, &node) == QS_OK);
    qs_vgpu_stats vs;
    EXPECT(qs_vgpu_stats_get(node, 1, &vs) == QS_OK && vs.contexts == 1);
    EXPECT(qs_mem_reserve(cl, MiB) == QS_OK);
    EXPECT(qs_client_detach(cl) == QS_OK); /* over a new connection, to the new owner */
    EXPECT(qs_vgpu_stats_get(node, 1, &vs) == QS_OK && vs.contexts == 0 && vs.mem_used == 0);
    munmap(st, sizeof *st);
    qs_node_close(node);
    close(fds[0]);
    close(fds[1]);
    return 0;
}

/* A push stopped between taking its ticket and finishing its slot (descheduled, or killed). */
static uint64_t begin_push(struct qs_ring *ring)
{
    uint64_t t = atomic_fetch_add(&ring->head, 1);
    atomic_store(&ring->slots[t % QS_EVENT_RING_SIZE].seq, 2 * t + 1);
    return t;
}

static void finish_push(struct qs_ring *ring, uint64_t t, uint64_t value)
{
    struct qs_ring_slot *slot = &ring->slots[t % QS_EVENT_RING_SIZE];
    qs_event ev = {.seq = t, .kind = QS_EV_OOM, .vgpu = 1, .value = value};
    qs_ring_slot_store(slot, t, &ev);
    atomic_store(&slot->seq, 2 * t + 2);
    atomic_fetch_add(&ring->notify, 1);
    qs_futex_wake(&ring->notify, 1);
}

struct slow_writer {
    struct qs_ring *ring;
    uint64_t ticket;
};

static void *finish_late(void *arg)
{
    struct slow_writer *w = arg;
    sleep_ms(10);
    w->ticket = begin_push(w->ring);
    sleep_ms(80); /* across the consumer's 50 ms deadline */
    finish_push(w->ring, w->ticket, 42);
    return NULL;
}

static int test_event_of_a_writer_descheduled_mid_push_is_not_dropped(void)
{
    qs_node *node = make_node("slowpush");
    EXPECT(node);
    struct slow_writer w = {.ring = &node->seg.state->ring};
    pthread_t thread;
    EXPECT(pthread_create(&thread, NULL, finish_late, &w) == 0);
    qs_event ev = {0};
    int first = qs_node_next_event(node, &ev, 50); /* times out while the slot is half-written */
    int second = qs_node_next_event(node, &ev, 1000);
    pthread_join(thread, NULL);
    EXPECT(first == QS_ETIMEDOUT);
    EXPECT(second == QS_OK && ev.value == 42);
    EXPECT(qs_node_dropped_events(node) == 0);
    qs_node_close(node);
    return 0;
}

static int test_slot_left_by_a_writer_killed_mid_push_is_skipped_across_short_polls(void)
{
    qs_node *node = make_node("deadpush");
    EXPECT(node);
    struct qs_ring *ring = &node->seg.state->ring;
    begin_push(ring); /* never finished */
    qs_ring_push(ring, QS_EV_OOM, 0, 1, 0, 7);
    qs_event ev = {0};
    int rc = QS_ETIMEDOUT;
    for (int polls = 0; polls < 200 && rc == QS_ETIMEDOUT; polls++)
        rc = qs_node_next_event(node, &ev, 10);
    EXPECT(rc == QS_OK && ev.value == 7);
    EXPECT(qs_node_dropped_events(node) == 1);
    qs_node_close(node);
    return 0;
}

/* The ring laps a slot whose writer was killed mid-push: the later writer takes it over, and
 * its event is read whole. */
static int test_a_later_lap_takes_over_a_slot_left_by_a_killed_writer(void)
{
    qs_node *node = make_node("lappush");
    EXPECT(node);
    struct qs_ring *ring = &node->seg.state->ring;
    uint64_t dead = begin_push(ring); /* never finished */
    for (uint32_t i = 1; i <= QS_EVENT_RING_SIZE; i++)
        qs_ring_push(ring, QS_EV_OOM, 0, 1, 0, i);
    struct qs_ring_slot *slot = &ring->slots[dead % QS_EVENT_RING_SIZE];
    EXPECT(atomic_load(&slot->seq) == 2 * (dead + QS_EVENT_RING_SIZE) + 2);
    qs_event ev = {0};
    uint64_t last = 0;
    while (qs_node_next_event(node, &ev, 10) == QS_OK)
        last = ev.value;
    EXPECT(last == QS_EVENT_RING_SIZE);
    qs_node_close(node);
    return 0;
}

/* A writer taken over for being slow was only descheduled: it wakes and stores the rest of its
 * event into the slot a later lap has written. The consumer never gets an event made of two:
 * every event it reads is one a push made (here: value = ticket - first ticket). */
static int test_a_taken_over_writer_that_wakes_never_mixes_into_the_later_event(void)
{
    qs_node *node = make_node("wakepush");
    EXPECT(node);
    struct qs_ring *ring = &node->seg.state->ring;
    uint64_t slow = begin_push(ring); /* descheduled after storing nothing yet */
    for (uint32_t i = 1; i <= QS_EVENT_RING_SIZE; i++)
        qs_ring_push(ring, QS_EV_OOM, 0, 1, 0, i);
    struct qs_ring_slot *slot = &ring->slots[slow % QS_EVENT_RING_SIZE];
    qs_event late = {.seq = slow, .kind = QS_EV_OOM, .vgpu = 1, .value = 0xdeadull};
    uint64_t words[QS_EVENT_WORDS];
    memcpy(words, &late, sizeof words);
    size_t value_word = offsetof(qs_event, value) / sizeof(uint64_t);
    for (size_t i = value_word; i < QS_EVENT_WORDS; i++) /* the rest of its stores, as push does */
        atomic_store_explicit(&slot->words[i], words[i], memory_order_relaxed);
    qs_event ev = {0};
    int mixed = 0;
    while (qs_node_next_event(node, &ev, 10) == QS_OK)
        mixed += ev.seq >= slow && ev.value != ev.seq - slow;
    EXPECT(mixed == 0);
    qs_node_close(node);
    return 0;
}

/* ---- a tenant holding a lock of the shared state part (which every tenant maps writable) ---- */

/* The state slot of vGPU `id`, from the configuration (as the owner's process reads it). */
static int vslot_of(qs_node *node, uint32_t id)
{
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        if (atomic_load(&node->seg.cfg->vgpus[s].state) == QS_SLOT_ACTIVE &&
            node->seg.cfg->vgpus[s].id == id)
            return (int)s;
    return -1;
}


/* A process attached to vGPU 1 takes its vGPU's memory lock (in the memory part) through its
 * own mapping and keeps it; returns its pid once it holds it (-1 on failure). */
static pid_t tenant_holding_lock(const char *tag, int vslot)
{
    int fds[2];
    if (pipe(fds))
        return -1;
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        uint32_t card;
        if (qs_client_attach(test_segment(tag), NULL, 1, &cl) != QS_OK)
            _exit(2);
        struct qs_segment *seg = qs_client_segment(cl, &card);
        pthread_mutex_lock(&seg->vmem[vslot]->lock);
        if (write(fds[1], "L", 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    char c = 0;
    ssize_t n = pid > 0 ? read(fds[0], &c, 1) : -1;
    close(fds[0]);
    return n == 1 ? pid : -1;
}

struct reserve_call {
    qs_client *cl;
    int rc;
};

static void *reserve_mib(void *arg)
{
    struct reserve_call *call = arg;
    call->rc = qs_mem_reserve(call->cl, MiB);
    return NULL;
}

/* 1 if `thread` ended within `seconds` (joined); else 0 and it is left running. */
static int joined_within(pthread_t thread, int seconds)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += seconds;
    return pthread_timedjoin_np(thread, NULL, &deadline) == 0;
}

/* A tenant of vGPU 1 holds its vGPU's memory lock for good: the reservations of vGPU 1's
 * other processes fail with QS_ETIMEDOUT instead of waiting for good (before, they hung until
 * the tenant let go). No other vGPU's lock is within its reach (the test above). */
static int test_a_tenant_holding_its_vgpus_memory_lock_cannot_hang_its_peers_reservations(void)
{
    qs_node *node = make_node("memhold");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    pid_t holder = tenant_holding_lock("memhold", vslot_of(node, 1));
    EXPECT(holder > 0);
    struct reserve_call call = {.rc = 1};
    EXPECT(qs_client_attach(test_segment("memhold"), NULL, 1, &call.cl) == QS_OK);
    pthread_t thread;
    EXPECT(pthread_create(&thread, NULL, reserve_mib, &call) == 0);
    int returned = joined_within(thread, 10);
    kill_and_wait(holder); /* a reservation still waiting then takes the lock and returns */
    if (!returned)
        pthread_join(thread, NULL);
    EXPECT(returned && call.rc == QS_ETIMEDOUT);
    EXPECT(qs_mem_reserve(call.cl, MiB) == QS_OK); /* the holder gone, the lock serves again */
    EXPECT(qs_client_detach(call.cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

/* A tenant of vGPU 1 holds its vGPU's memory lock for good while vGPU 1's other processes
 * detach: the owner returns their memory without waiting the lock's deadline for each, so its
 * service thread stays free for vGPU 2's attach (before, each reap waited 1 s for the lock and
 * then returned nothing: four detaches held vGPU 2's attach for over 4 s, and vGPU 1's count
 * kept the detached process's 256 MiB). */
static int test_a_tenant_holding_its_memory_lock_cannot_stall_the_owners_reaps(void)
{
    const char *seg = test_segment("reaphold");
    qs_node *node = make_node("reaphold");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *peers[4] = {0}, *other = NULL;
    for (int i = 0; i < 4; i++)
        EXPECT(qs_client_attach(seg, NULL, 1, &peers[i]) == QS_OK);
    EXPECT(qs_mem_reserve(peers[0], 256 * MiB) == QS_OK);
    pid_t holder = tenant_holding_lock("reaphold", vslot_of(node, 1));
    EXPECT(holder > 0);
    uint64_t t0 = qs_now_ns();
    int detached = 0;
    for (int i = 0; i < 4; i++)
        detached += qs_client_detach(peers[i]) == QS_OK;
    int attached = qs_client_attach(seg, NULL, 2, &other) == QS_OK;
    uint64_t took = qs_now_ns() - t0;
    qs_vgpu_stats st = {0};
    int stats = qs_vgpu_stats_get(node, 1, &st);
    kill_and_wait(holder);
    if (other)
        qs_client_detach(other);
    qs_node_close(node);
    fprintf(stderr, "  4 detaches and an attach: %llu ms; vGPU 1 uses %llu MiB\n",
            (unsigned long long)(took / 1000000), (unsigned long long)(st.mem_used / MiB));
    EXPECT(detached == 4 && attached && stats == QS_OK);
    EXPECT(took < 1000000000ull);
    EXPECT(st.mem_used == 0);
    return 0;
}

struct link_smasher {
    volatile uintptr_t *links;
    _Atomic int stop;
};

/* Keep writing junk into two words: a robust mutex's list links (glibc follows them on unlock). */
static void *smash_links(void *arg)
{
    struct link_smasher *s = arg;
    volatile uintptr_t *links = s->links;
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        links[0] = 0x1000;
        links[1] = 0x1000;
    }
    return NULL;
}

/* A tenant of vGPU 1 keeps writing junk into the robust-list links of its vGPU's memory lock
 * (in its memory part, which it maps writable) while its vGPU's processes come and go: the
 * owner never takes that lock, so it survives (before, its reap took the lock, and glibc's
 * unlock followed the links: the owner died of SIGSEGV within a few detaches). */
static int test_a_tenant_smashing_its_memory_locks_links_cannot_crash_the_owner(void)
{
    int fds[2];
    char r;
    EXPECT(pipe(fds) == 0);
    pid_t owner = owner_with_fd_limit("linksmash", 1024, fds[1]);
    EXPECT(read(fds[0], &r, 1) == 1);
    const char *seg = test_segment("linksmash");
    qs_client *tenant = NULL;
    uint32_t card;
    EXPECT(qs_client_attach(seg, NULL, 1, &tenant) == QS_OK);
    pthread_mutex_t *lock = &qs_client_segment(tenant, &card)->vmem[0]->lock;
    struct link_smasher smasher = {.links = (volatile uintptr_t *)&lock->__data.__list};
    pthread_t thread;
    EXPECT(pthread_create(&thread, NULL, smash_links, &smasher) == 0);
    int rounds = 0;
    for (qs_client *cl = NULL; rounds < 2000; rounds++, cl = NULL)
        if (qs_client_attach(seg, NULL, 1, &cl) != QS_OK || qs_client_detach(cl) != QS_OK)
            break;
    atomic_store(&smasher.stop, 1);
    pthread_join(thread, NULL);
    int status = 0, died = waitpid(owner, &status, WNOHANG) == owner;
    qs_client_detach(tenant);
    if (!died)
        kill_and_wait(owner);
    close(fds[0]);
    close(fds[1]);
    qs_segment_unlink(NULL, seg);
    if (died)
        fprintf(stderr, "  the owner died (signal %d, exit %d) after %d rounds\n",
                WIFSIGNALED(status) ? WTERMSIG(status) : 0,
                WIFEXITED(status) ? WEXITSTATUS(status) : 0, rounds);
    EXPECT(!died && rounds == 2000);
    return 0;
}

/* vGPU 1's tenant writes over every vGPU entry of the state part it maps: vGPU 2's memory
 * count and lock are in vGPU 2's memory part, which vGPU 1's processes never map, so vGPU 2
 * still reserves exactly up to its limit (before, its count and lock were in those entries). */
static int test_a_tenant_rewriting_the_vgpu_entries_cannot_change_another_vgpus_memory(void)
{
    qs_node *node = make_node("memsmash");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *victim = NULL;
    EXPECT(qs_client_attach(test_segment("memsmash"), NULL, 2, &victim) == QS_OK);
    EXPECT(qs_mem_reserve(victim, 256 * MiB) == QS_OK);
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        uint32_t card;
        if (qs_client_attach(test_segment("memsmash"), NULL, 1, &cl) != QS_OK)
            _exit(2);
        struct qs_state *st = qs_client_segment(cl, &card)->state;
        memset(st->vgpus, 0x5a, sizeof st->vgpus);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT(qs_mem_reserve(victim, GiB - 256 * MiB) == QS_OK);
    EXPECT(qs_mem_reserve(victim, 1) == QS_ENOMEM);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 2, &st) == QS_OK && st.mem_used == GiB);
    EXPECT(qs_client_detach(victim) == QS_OK);
    EXPECT(qs_vgpu_stats_get(node, 2, &st) == QS_OK && st.mem_used == 0);
    qs_node_close(node);
    return 0;
}

/* A process of vGPU 1 keeps a mapping of vGPU 1's memory part past its detach; vGPU 1 goes and
 * vGPU 3 takes its slot: vGPU 3 has a memory part of its own, so what the old process writes
 * into its mapping changes nothing of vGPU 3's (a guard: the slot's part is never reused). */
static int test_a_slots_next_vgpu_gets_a_memory_part_its_previous_tenant_cannot_reach(void)
{
    qs_node *node = make_node("memreuse");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int slot = vslot_of(node, 1), ready[2], go[2];
    EXPECT(slot >= 0 && pipe(ready) == 0 && pipe(go) == 0);
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        uint32_t card;
        if (qs_client_attach(test_segment("memreuse"), NULL, 1, &cl) != QS_OK)
            _exit(2);
        int fd = qs_client_segment(cl, &card)->vmem_fd[slot];
        unsigned char *kept = mmap(NULL, sizeof(struct qs_vmem), PROT_READ | PROT_WRITE,
                                   MAP_SHARED, fd, 0);
        char c = 0;
        if (kept == MAP_FAILED || qs_client_detach(cl) != QS_OK || write(ready[1], "d", 1) != 1 ||
            read(go[0], &c, 1) != 1)
            _exit(3);
        memset(kept + offsetof(struct qs_vmem, lock), 0x5a,
               sizeof(struct qs_vmem) - offsetof(struct qs_vmem, lock));
        _exit(0);
    }
    char c = 0;
    EXPECT(read(ready[0], &c, 1) == 1);
    EXPECT(qs_vgpu_destroy(node, 1) == QS_OK);
    EXPECT(vgpu(node, 3, QS_PRIO_LOW, 50, GiB) == QS_OK && vslot_of(node, 3) == slot);
    EXPECT(write(go[1], "g", 1) == 1);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("memreuse"), NULL, 3, &cl) == QS_OK);
    EXPECT(qs_mem_reserve(cl, GiB) == QS_OK && qs_mem_reserve(cl, 1) == QS_ENOMEM);
    EXPECT(qs_client_detach(cl) == QS_OK);
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(go[i]);
    }
    qs_node_close(node);
    return 0;
}

/* vGPU 1's tenant writes vGPU 2's context count in the state part down to zero while a process
 * of vGPU 2 is attached, then vGPU 2 is destroyed and vGPU 3 created. The owner counts contexts
 * from its own records: vGPU 2's slot waits for its last process, so that process sees its vGPU
 * destroyed, vGPU 3 gets another slot, and the detach leaves vGPU 3's count alone (before, the
 * slot was freed at once and given to vGPU 3, whose configuration the process then ran on; its
 * detach took one off vGPU 3's contexts, and the owner reaped it through vGPU 3's memory part). */
static int test_a_tenant_zeroing_a_context_count_cannot_free_a_slot_still_in_use(void)
{
    const char *seg = test_segment("ctxzero");
    qs_node *node = make_node("ctxzero");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 30, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 30, GiB) == QS_OK);
    int slot = vslot_of(node, 2);
    qs_client *tenant = NULL, *victim = NULL, *next = NULL;
    uint32_t card;
    EXPECT(slot >= 0 && qs_client_attach(seg, NULL, 2, &victim) == QS_OK);
    EXPECT(qs_client_attach(seg, NULL, 1, &tenant) == QS_OK);
    atomic_store(&qs_client_segment(tenant, &card)->state->vgpus[slot].contexts, 0);
    EXPECT(qs_vgpu_destroy(node, 2) == QS_OK);
    EXPECT(vgpu(node, 3, QS_PRIO_LOW, 30, 2 * GiB) == QS_OK);
    qs_client_info info;
    EXPECT(qs_client_info_get(victim, &info) == QS_EDESTROYED);
    EXPECT(vslot_of(node, 3) != slot);
    EXPECT(qs_client_attach(seg, NULL, 3, &next) == QS_OK);
    EXPECT(qs_client_detach(victim) == QS_OK);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 3, &st) == QS_OK && st.contexts == 1);
    EXPECT(atomic_load(&node->seg.cfg->vgpus[slot].state) == QS_SLOT_FREE);
    EXPECT(qs_client_detach(next) == QS_OK && qs_client_detach(tenant) == QS_OK);
    qs_node_close(node);
    return 0;
}

/* A tenant of vGPU 1 of segment `tag`, forked: the parent gets its pid; the child (0) is
 * attached through `*cl`, with none of the owner's descriptors but `ready` (it exits 2 if it
 * cannot attach). */
static pid_t fork_tenant(const char *tag, int ready, qs_client **cl)
{
    pid_t pid = fork_child();
    if (pid != 0)
        return pid;
    for (int fd = 3; fd < 1024; fd++) /* the owner's descriptors, this fork's copies */
        if (fd != ready)
            close(fd);
    if (qs_client_attach(test_segment(tag), NULL, 1, cl) != QS_OK)
        _exit(2);
    return 0;
}

/* A tenant of vGPU 1 that keeps flipping the descriptor of its memory part between the part
 * and a copy of its own (a memfd with the same header, not sealed: it could truncate it under
 * the owner). An owner adopting the segment must map the part it made, whatever the process
 * has put behind that number by the time it opens it (before, it checked the path and then
 * opened it again: it mapped the tenant's copy in some rounds). */
static pid_t tenant_flipping_its_memory_part(const char *tag, int slot, int ready)
{
    qs_client *cl = NULL;
    pid_t pid = fork_tenant(tag, ready, &cl);
    if (pid != 0)
        return pid;
    uint32_t card;
    struct qs_segment *seg = qs_client_segment(cl, &card);
    int n = seg->vmem_fd[slot], real = fcntl(n, F_DUPFD_CLOEXEC, 500);
    int copy = memfd_create("copy", MFD_CLOEXEC);
    if (real < 0 || copy < 0 || ftruncate(copy, sizeof(struct qs_vmem)) ||
        pwrite(copy, seg->vmem[slot], sizeof(struct qs_vmem), 0) != sizeof(struct qs_vmem) ||
        write(ready, "r", 1) != 1)
        _exit(3);
    for (;;) { /* the part stays at `real`, above `n`: the owner can always find it there */
        dup3(copy, n, O_CLOEXEC);
        dup3(real, n, O_CLOEXEC);
    }
}

static int test_adopt_maps_the_memory_part_it_made_not_what_a_tenant_swapped_in(void)
{
    qs_node *node = make_node("fdflip");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int slot = vslot_of(node, 1), ready[2];
    char c = 0;
    EXPECT(slot >= 0 && pipe(ready) == 0);
    pid_t pid = tenant_flipping_its_memory_part("fdflip", slot, ready[1]);
    EXPECT(pid > 0 && read(ready[0], &c, 1) == 1);
    uint64_t ino = node->seg.owner->vmem_ino[slot];
    int wrong = 0, round = 0;
    for (; round < 300 && !wrong; round++) {
        qs_node_leave(node);
        node = NULL;
        EXPECT(qs_node_adopt(test_segment("fdflip"), NULL, &node) == QS_OK);
        struct stat sb;
        wrong = fstat(node->seg.vmem_fd[slot], &sb) || (uint64_t)sb.st_ino != ino;
    }
    kill_and_wait(pid);
    close(ready[0]);
    close(ready[1]);
    qs_node_close(node);
    if (wrong)
        fprintf(stderr, "  round %d mapped the tenant's copy\n", round);
    EXPECT(!wrong);
    return 0;
}

/* A stand-in owner on vGPU 1's socket of segment `name`: its k-th answer on one connection
 * has status `status[k]` and carries the n[k] descriptors fds[k]. */
struct fake_owner {
    int lfd, answers, status[2], n[2], fds[2][4];
    uint32_t slot;
};

static void fake_answer(int fd, const struct fake_owner *f, int k)
{
    struct qs_proto_reply rep = {.status = f->status[k], .vgpu_slot = f->slot};
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = CMSG_SPACE((size_t)f->n[k] * sizeof(int))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)f->n[k] * sizeof(int));
    memcpy(CMSG_DATA(cm), f->fds[k], (size_t)f->n[k] * sizeof(int));
    sendmsg(fd, &msg, MSG_NOSIGNAL);
}

static void *fake_owner_main(void *arg)
{
    struct fake_owner *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    struct qs_proto_request req;
    for (int k = 0; fd >= 0 && k < f->answers && recv(fd, &req, sizeof req, 0) == sizeof req; k++)
        fake_answer(fd, f, k);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static int fake_listen(const char *name)
{
    char dir[512], path[512];
    qs_vgpu_dir_path(dir, sizeof dir, NULL, name, 1);
    qs_vgpu_sock_path(path, sizeof path, NULL, name, 1);
    mkdir(dir, 0755);
    unlink(path);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (lfd >= 0 && (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 4))) {
        close(lfd);
        return -1;
    }
    return lfd;
}

/* One attach (and a detach when it succeeds) against a stand-in owner; its status. */
static int attach_to_fake(struct fake_owner *f, const char *name)
{
    pthread_t thread;
    if (pthread_create(&thread, NULL, fake_owner_main, f))
        return QS_ESYS;
    qs_client *cl = NULL;
    int rc = qs_client_attach(name, NULL, 1, &cl);
    if (rc == QS_OK)
        qs_client_detach(cl);
    pthread_join(thread, NULL);
    return rc;
}

/* An owner's reply leaves no descriptor behind in the client: one past the three an attach
 * takes, any carried by a refusal or by a detach's answer is closed (before, the client kept
 * them open: a fourth descriptor fits the control buffer, and a detach never looked). */
static int test_an_owners_reply_leaves_no_descriptor_behind(void)
{
    qs_node *node = make_node("fdleak");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    const char *name = "ct-fdleak-fake";
    int slot = vslot_of(node, 1), extra = memfd_create("qs-extra", MFD_CLOEXEC);
    int lfd = fake_listen(name);
    EXPECT(slot >= 0 && extra >= 0 && lfd >= 0);
    struct fake_owner refused = {.lfd = lfd, .answers = 1, .status = {QS_EFULL}, .n = {4},
                                 .fds = {{node->seg.cfg_ro_fd, node->seg.state_fd,
                                          node->seg.vmem_fd[slot], extra}}};
    struct fake_owner served = refused;
    served.answers = 2;
    served.status[0] = served.status[1] = QS_OK;
    served.n[1] = 1;
    served.fds[1][0] = extra;
    served.slot = (uint32_t)slot;
    int rc_refused = attach_to_fake(&refused, name);
    int rc_served = attach_to_fake(&served, name);
    close(extra);
    close(lfd);
    int left = fd_linking_to("/memfd:qs-extra");
    qs_node_close(node);
    EXPECT(rc_refused == QS_EFULL && rc_served == QS_OK);
    EXPECT(left < 0);
    return 0;
}

/* An owner in a child that makes `rounds` configuration changes once told to; it exits 0 when
 * every one succeeded. */
static pid_t owner_changing_config(const char *tag, int ready, int go, int rounds)
{
    pid_t pid = fork_child();
    if (pid != 0)
        return pid;
    qs_node *node = make_node(tag);
    char c = 0;
    if (!node || vgpu(node, 1, QS_PRIO_LOW, 50, GiB) != QS_OK || write(ready, "r", 1) != 1 ||
        read(go, &c, 1) != 1)
        _exit(2);
    for (int i = 0; i < rounds; i++)
        if (qs_vgpu_update(node, 1, 40 + (uint32_t)(i % 2), GiB) != QS_OK)
            _exit(4);
    qs_node_close(node);
    _exit(0);
}

/* A tenant keeps writing junk into the two words of the state part (which every tenant maps
 * writable) just before the card entries, where ABI 6 kept the segment lock's robust-list
 * links, while the owner makes configuration changes: the segment lock lives in the owner
 * part, which no tenant maps, so every change succeeds (before, glibc's unlock followed the
 * links and the owner died of SIGSEGV within a few changes). */
static int test_a_tenant_smashing_the_state_part_cannot_crash_the_owners_changes(void)
{
    int ready[2], go[2], status = 0;
    char c = 0;
    EXPECT(pipe(ready) == 0 && pipe(go) == 0);
    pid_t owner = owner_changing_config("segsmash", ready[1], go[0], 2000);
    EXPECT(owner > 0 && read(ready[0], &c, 1) == 1);
    qs_client *tenant = NULL;
    uint32_t card;
    EXPECT(qs_client_attach(test_segment("segsmash"), NULL, 1, &tenant) == QS_OK);
    char *state = (char *)qs_client_segment(tenant, &card)->state;
    struct link_smasher smasher = {
        .links = (volatile uintptr_t *)(state + offsetof(struct qs_state, cards)) - 2};
    pthread_t thread;
    EXPECT(pthread_create(&thread, NULL, smash_links, &smasher) == 0);
    EXPECT(write(go[1], "g", 1) == 1);
    waitpid(owner, &status, 0);
    atomic_store(&smasher.stop, 1);
    pthread_join(thread, NULL);
    qs_client_detach(tenant);
    qs_segment_unlink(NULL, test_segment("segsmash"));
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(go[i]);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        fprintf(stderr, "  the owner: signal %d, exit %d\n",
                WIFSIGNALED(status) ? WTERMSIG(status) : 0,
                WIFEXITED(status) ? WEXITSTATUS(status) : 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}

struct launch_call {
    qs_client *cl;
    int rc;
};

static void *launch_once(void *arg)
{
    struct launch_call *call = arg;
    call->rc = qs_launch_begin(call->cl);
    return NULL;
}

/* vGPU 1's tenant raises the in-flight count of vGPU 2's context in the state part, then
 * exits: that process, with nothing in flight, still launches (before, its next launch waited
 * for good for completions that would never come). */
static int test_a_tenant_raising_another_contexts_inflight_count_cannot_hang_its_launches(void)
{
    qs_node *node = make_node("inflight");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_OK);
    struct launch_call call = {.rc = 1};
    EXPECT(qs_client_attach(test_segment("inflight"), NULL, 2, &call.cl) == QS_OK);
    int victim = ctx_of(node, (int)getpid());
    EXPECT(victim >= 0);
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        uint32_t card;
        if (qs_client_attach(test_segment("inflight"), NULL, 1, &cl) != QS_OK)
            _exit(2);
        atomic_store(&qs_client_segment(cl, &card)->state->ctxs[victim].inflight, 1000);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pthread_t thread;
    EXPECT(pthread_create(&thread, NULL, launch_once, &call) == 0);
    int returned = joined_within(thread, 5);
    if (!returned) { /* release it: the count back to what it had */
        atomic_store(&node->seg.state->ctxs[victim].inflight, 0);
        qs_futex_wake(&node->seg.state->ctxs[victim].inflight, INT_MAX);
        pthread_join(thread, NULL);
    }
    EXPECT(returned && call.rc == QS_OK);
    EXPECT(qs_launch_end(call.cl) == QS_OK);
    EXPECT(qs_client_detach(call.cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

/* A child forked while its parent's only in-flight slot is taken counts its own launches: the
 * parent's are not its own to end, and its first launch goes at once. */
static int test_a_forked_child_does_not_count_its_parents_launches_in_flight(void)
{
    qs_node *node = make_node("forkslot");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("forkslot"), NULL, 1, &cl) == QS_OK);
    EXPECT(qs_client_set_inflight_cap(cl, 1) == QS_OK && qs_launch_begin(cl) == QS_OK);
    int report[2];
    EXPECT(pipe(report) == 0);
    pid_t pid = fork_child();
    if (pid == 0) { /* one thread, as in wait_for_own_inflight_slot */
        int rc = qs_launch_begin(cl);
        _exit(write(report[1], &rc, sizeof rc) == (ssize_t)sizeof rc ? 0 : 2);
    }
    close(report[1]);
    struct pollfd ready = {.fd = report[0], .events = POLLIN};
    int rc = 1, answered = poll(&ready, 1, 5000) == 1 &&
                           read(report[0], &rc, sizeof rc) == (ssize_t)sizeof rc;
    close(report[0]);
    kill_and_wait(pid);
    EXPECT(answered && rc == QS_OK);
    EXPECT(qs_launch_end(cl) == QS_OK);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

/* A tenant closes the card's gate while high priority is quiet and nobody waits, then lives
 * on: the owner's release thread opens it again (before, it slept until something else woke
 * it, and low priority's work queued behind the gate word on the device waited for good). */
static int test_a_gate_a_live_tenant_closed_opens_again(void)
{
    qs_node *node = make_node("closed");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(qs_card_set_release_delay(node, 0, 1000000) == QS_OK);
    int ready[2];
    EXPECT(pipe(ready) == 0);
    pid_t pid = fork_child();
    if (pid == 0) {
        qs_client *cl = NULL;
        uint32_t card;
        if (qs_client_attach(test_segment("closed"), NULL, 1, &cl) != QS_OK)
            _exit(2);
        atomic_store(&qs_client_segment(cl, &card)->state->cards[0].gate, QS_GATE_CLOSED);
        if (write(ready[1], "C", 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(ready[1]);
    char c = 0;
    int closed = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    EVENTUALLY(atomic_load(&node->seg.state->cards[0].gate) == QS_GATE_OPEN);
    int opened = atomic_load(&node->seg.state->cards[0].gate) == QS_GATE_OPEN;
    kill_and_wait(pid);
    EXPECT(closed && opened);
    qs_node_close(node);
    return 0;
}

/* A free context index still holding a share in its vGPU's memory part, counted in the vGPU's
 * total (a stale reservation between its addition and its take-back, or a tenant's write into
 * its own part, leaves one), is bound to a new process: the share is dropped, and the total
 * must drop with it. Before, the attach zeroed the share without flagging the total for a
 * recount, so the vGPU stayed charged for it: the new process's reservation of the whole limit
 * was refused, and the statistics showed 256 MiB in use with no share anywhere. */
static int test_a_reused_context_index_leaves_the_vgpus_total_equal_to_its_shares(void)
{
    qs_node *node = make_node("reshare");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int slot = vslot_of(node, 1);
    qs_client *cl = NULL;
    EXPECT(slot >= 0 && qs_client_attach(test_segment("reshare"), NULL, 1, &cl) == QS_OK);
    int ctx = ctx_of(node, (int)getpid());
    EXPECT(ctx >= 0 && qs_client_detach(cl) == QS_OK);
    struct qs_vmem *vm = node->seg.vmem[slot];
    __atomic_store_n(&vm->reserved[ctx], 256 * MiB, __ATOMIC_SEQ_CST);
    __atomic_store_n(&vm->used, 256 * MiB, __ATOMIC_SEQ_CST);
    EXPECT(qs_client_attach(test_segment("reshare"), NULL, 1, &cl) == QS_OK);
    EXPECT(ctx_of(node, (int)getpid()) == ctx); /* the same index, bound again */
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK);
    int whole = qs_mem_reserve(cl, GiB);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    EXPECT(st.mem_used == 0 && whole == QS_OK);
    return 0;
}

/* A tenant of vGPU 1 reserves 512 MiB, then rewrites its memory part's magic and ABI version
 * and lives on; returns its pid once done (-1 on failure). */
static pid_t tenant_scribbling_its_part_header(const char *tag, int slot, int ready)
{
    qs_client *cl = NULL;
    pid_t pid = fork_tenant(tag, ready, &cl);
    if (pid != 0)
        return pid;
    uint32_t card;
    if (qs_mem_reserve(cl, 512 * MiB) != QS_OK)
        _exit(2);
    struct qs_vmem *vm = qs_client_segment(cl, &card)->vmem[slot];
    vm->magic = 0x6b6e756a;
    vm->abi = 99;
    if (write(ready, "r", 1) != 1)
        _exit(3);
    for (;;)
        pause();
}

/* An owner adopting the segment finds vGPU 1's memory part, held by its live tenant, with a
 * header the tenant rewrote: it writes the header again and keeps the part, so the vGPU's
 * count stays one. Before, it made a new part for the vGPU: the tenant went on charging the
 * old one, new processes the new one, and a new process got the whole limit beside the
 * tenant's 512 MiB (up to twice the limit in all). */
static int test_adopt_keeps_the_memory_part_whose_header_its_tenant_rewrote(void)
{
    qs_node *node = make_node("scribble");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    int slot = vslot_of(node, 1), ready[2];
    char c = 0;
    EXPECT(slot >= 0 && pipe(ready) == 0);
    pid_t pid = tenant_scribbling_its_part_header("scribble", slot, ready[1]);
    EXPECT(pid > 0 && read(ready[0], &c, 1) == 1);
    close(ready[0]);
    close(ready[1]);
    qs_node_leave(node);
    node = NULL;
    EXPECT(qs_node_adopt(test_segment("scribble"), NULL, &node) == QS_OK);
    qs_vgpu_stats st;
    qs_client *cl = NULL;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK);
    EXPECT(qs_client_attach(test_segment("scribble"), NULL, 1, &cl) == QS_OK);
    int whole = qs_mem_reserve(cl, GiB), rest = qs_mem_reserve(cl, 512 * MiB);
    EXPECT(qs_client_detach(cl) == QS_OK);
    kill_and_wait(pid);
    qs_node_close(node);
    EXPECT(st.mem_used == 512 * MiB && whole == QS_ENOMEM && rest == QS_OK);
    return 0;
}

/* The owner leaves (as when it dies) while high priority holds the gate closed: its release
 * thread is gone, and `hp` and `lp` (low priority, keeping the gate when `keep`) stay
 * attached. The card's gate state is `*cs`. 1 when done. */
static int owner_gone_with_gate_closed(const char *tag, int keep, qs_client **hp, qs_client **lp,
                                       struct qs_card_state **cs)
{
    qs_node *node = make_node(tag);
    uint32_t card;
    if (!node || vgpu(node, 1, QS_PRIO_HIGH, 100, GiB) || vgpu(node, 2, QS_PRIO_LOW, 50, GiB) ||
        qs_card_set_release_delay(node, 0, 10000000) ||
        qs_client_attach(test_segment(tag), NULL, 1, hp) ||
        qs_client_attach(test_segment(tag), NULL, 2, lp) || (keep && qs_client_keep_gate(*lp)) ||
        qs_launch_begin(*hp))
        return 0;
    qs_node_leave(node); /* adopt_and_close takes it back */
    *cs = &qs_client_segment(*lp, &card)->state->cards[0];
    return 1;
}

/* A new owner takes the segment back, the clients detach, and it is removed. */
static int adopt_and_close(const char *tag, qs_client *hp, qs_client *lp)
{
    qs_node *node = NULL;
    int rc = qs_node_adopt(test_segment(tag), NULL, &node);
    int detached = qs_client_detach(hp) == QS_OK && qs_client_detach(lp) == QS_OK;
    qs_node_close(node);
    return rc == QS_OK && detached;
}

/* With the device gate, low priority's queued work waits on the gate word on the GPU, and no
 * host thread of it need be waiting at the gate. The owner died while high priority held the
 * gate: the keeping client reopens it once high priority has been quiet for the delay (before,
 * nothing did until an owner adopted the segment), and never while high priority is busy. */
static int test_a_keeping_client_reopens_the_gate_a_gone_owner_left_closed(void)
{
    qs_client *hp = NULL, *lp = NULL;
    struct qs_card_state *cs = NULL;
    EXPECT(owner_gone_with_gate_closed("keeper", 1, &hp, &lp, &cs));
    sleep_ms(100);
    int held_while_busy = atomic_load(&cs->gate) == QS_GATE_CLOSED;
    uint64_t quiet = qs_now_ns();
    EXPECT(qs_launch_end(hp) == QS_OK);
    EVENTUALLY(atomic_load(&cs->gate) == QS_GATE_OPEN);
    uint64_t took = qs_now_ns() - quiet;
    int opened = atomic_load(&cs->gate) == QS_GATE_OPEN;
    EXPECT(qs_launch_begin(hp) == QS_OK && qs_launch_end(hp) == QS_OK); /* a second episode */
    EVENTUALLY(atomic_load(&cs->gate) == QS_GATE_OPEN);
    int again = atomic_load(&cs->gate) == QS_GATE_OPEN;
    EXPECT(adopt_and_close("keeper", hp, lp));
    EXPECT(held_while_busy && opened && again);
    EXPECT(took >= 10000000ull && took < 1000000000ull);
    return 0;
}

static void *launch_lp(void *arg)
{
    qs_client *lp = arg;
    if (qs_launch_begin(lp) == QS_OK)
        qs_launch_end(lp);
    return NULL;
}

/* Guard: a low-priority launch waiting on the host at the gate a gone owner left closed
 * passes once high priority has been quiet for the delay (its own wait releases the gate). */
static int test_a_launch_at_the_gate_passes_without_the_owner(void)
{
    qs_client *hp = NULL, *lp = NULL;
    struct qs_card_state *cs = NULL;
    EXPECT(owner_gone_with_gate_closed("nokeeper", 0, &hp, &lp, &cs));
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, launch_lp, lp) == 0);
    sleep_ms(50);
    EXPECT(qs_launch_end(hp) == QS_OK);
    int passed = joined_within(t, 2);
    EXPECT(adopt_and_close("nokeeper", hp, lp));
    EXPECT(passed);
    return 0;
}

int main(void)
{
    const struct test_case tests[] = {
        {"corrupted context entry does not crash the owner",
         test_corrupted_context_entry_does_not_crash_the_owner},
        {"killed policy waiter leaves no waiting count",
         test_killed_policy_waiter_leaves_no_waiting_count},
        {"burst-share peer keeps launching after a policy waiter is killed",
         test_burst_share_peer_keeps_launching_after_a_policy_waiter_is_killed},
        {"killed gate sleeper leaves no sleeper count",
         test_killed_gate_sleeper_leaves_no_sleeper_count},
        {"gate left releasing by a killed process opens again",
         test_gate_left_releasing_by_a_killed_process_opens_again},
        {"reused context slot starts with no in-flight waiters",
         test_reused_context_slot_starts_with_no_inflight_waiters},
        {"detach from a fork leaves the parent attached",
         test_detach_from_a_fork_leaves_the_parent_attached},
        {"reservation through a reaped handle is refused",
         test_reservation_through_a_reaped_handle_is_refused},
        {"attach past the owner's descriptors is refused without spinning",
         test_attach_past_the_owners_descriptors_is_refused_without_spinning},
        {"attaches past the per-vGPU cap are refused and others attach",
         test_attaches_past_the_per_vgpu_cap_are_refused_and_others_attach},
        {"owner that never answers fails the attach by its deadline",
         test_owner_that_never_answers_fails_the_attach_by_its_deadline},
        {"an exchange timeout with a unit is refused for the default",
         test_an_exchange_timeout_with_a_unit_is_refused_for_the_default},
        {"FIFO in place of a segment part is refused without blocking",
         test_fifo_in_place_of_a_segment_part_is_refused_without_blocking},
        {"symlink in place of a segment part is refused",
         test_symlink_in_place_of_a_segment_part_is_refused},
        {"vGPU socket refuses another vGPU's id", test_vgpu_socket_refuses_another_vgpus_id},
        {"planted vGPU directory is refused", test_planted_vgpu_directory_is_refused},
        {"adopt recounts contexts from the owner's records",
         test_adopt_recounts_contexts_from_the_owners_records},
        {"another process cannot detach a context",
         test_another_process_cannot_detach_a_context},
        {"client cannot resize the state part", test_client_cannot_resize_the_state_part},
        {"client cannot make the configuration writable",
         test_client_cannot_make_the_configuration_writable},
        {"segment files are the owner's alone", test_segment_files_are_the_owners_alone},
        {"event of a writer descheduled mid-push is not dropped",
         test_event_of_a_writer_descheduled_mid_push_is_not_dropped},
        {"slot left by a writer killed mid-push is skipped across short polls",
         test_slot_left_by_a_writer_killed_mid_push_is_skipped_across_short_polls},
        {"a later lap takes over a slot left by a killed writer",
         test_a_later_lap_takes_over_a_slot_left_by_a_killed_writer},
        {"a taken-over writer that wakes never mixes into the later event",
         test_a_taken_over_writer_that_wakes_never_mixes_into_the_later_event},
        {"a tenant holding its vGPU's memory lock cannot hang its peers' reservations",
         test_a_tenant_holding_its_vgpus_memory_lock_cannot_hang_its_peers_reservations},
        {"a tenant holding its memory lock cannot stall the owner's reaps",
         test_a_tenant_holding_its_memory_lock_cannot_stall_the_owners_reaps},
        {"a tenant smashing its memory lock's links cannot crash the owner",
         test_a_tenant_smashing_its_memory_locks_links_cannot_crash_the_owner},
        {"a tenant rewriting the vGPU entries cannot change another vGPU's memory",
         test_a_tenant_rewriting_the_vgpu_entries_cannot_change_another_vgpus_memory},
        {"a slot's next vGPU gets a memory part its previous tenant cannot reach",
         test_a_slots_next_vgpu_gets_a_memory_part_its_previous_tenant_cannot_reach},
        {"a tenant zeroing a context count cannot free a slot still in use",
         test_a_tenant_zeroing_a_context_count_cannot_free_a_slot_still_in_use},
        {"adopt maps the memory part it made, not what a tenant swapped in",
         test_adopt_maps_the_memory_part_it_made_not_what_a_tenant_swapped_in},
        {"an owner's reply leaves no descriptor behind",
         test_an_owners_reply_leaves_no_descriptor_behind},
        {"a tenant smashing the state part cannot crash the owner's changes",
         test_a_tenant_smashing_the_state_part_cannot_crash_the_owners_changes},
        {"a tenant raising another context's in-flight count cannot hang its launches",
         test_a_tenant_raising_another_contexts_inflight_count_cannot_hang_its_launches},
        {"a forked child does not count its parent's launches in flight",
         test_a_forked_child_does_not_count_its_parents_launches_in_flight},
        {"a gate a live tenant closed opens again", test_a_gate_a_live_tenant_closed_opens_again},
        {"a reused context index leaves the vGPU's total equal to its shares",
         test_a_reused_context_index_leaves_the_vgpus_total_equal_to_its_shares},
        {"adopt keeps the memory part whose header its tenant rewrote",
         test_adopt_keeps_the_memory_part_whose_header_its_tenant_rewrote},
        {"a keeping client reopens the gate a gone owner left closed",
         test_a_keeping_client_reopens_the_gate_a_gone_owner_left_closed},
        {"a launch at the gate passes without the owner",
         test_a_launch_at_the_gate_passes_without_the_owner},
    };
    return run_tests(tests, sizeof tests / sizeof tests[0]);
}

/* test_driver.c — C-level specifications of the driver: validation, segment checks,
 * robust-lock recovery after SIGKILL, racing reservations, the simulated card, and the
 * event ring. */
#include "harness.h"
#include "node.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
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

static int test_segment_names_are_validated(void)
{
    qs_node *node = NULL;
    EXPECT(qs_node_create("a/b", NULL, 1, &node) == QS_ENAME);
    EXPECT(strstr(qs_last_error(), "'/'") != NULL);
    EXPECT(qs_node_create("", NULL, 1, &node) == QS_ENAME);
    EXPECT(qs_node_create("x123456789012345678901234567890123456789012345678901", NULL, 1,
                          &node) == QS_ENAME);
    EXPECT(node == NULL);
    return 0;
}

static int test_segment_of_another_version_is_refused_untouched(void)
{
    qs_node *node = make_node("ver");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    char path[512];
    qs_segment_path(path, sizeof path, NULL, test_segment("ver"), "cfg");
    int fd = open(path, O_RDWR);
    uint32_t other = QS_ABI_VERSION + 1;
    EXPECT(pwrite(fd, &other, sizeof other, 8) == sizeof other);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("ver"), NULL, 1, &cl) == QS_EVERSION);
    EXPECT(strstr(qs_last_error(), "ABI version") != NULL);
    uint32_t now = 0;
    EXPECT(pread(fd, &now, sizeof now, 8) == sizeof now && now == other);
    close(fd);
    qs_node_close(node);
    return 0;
}

/* A copy of a part's first page under another segment name: the right header, the wrong size. */
static int write_truncated_copy(const char *from, const char *to, const char *suffix)
{
    char src[512], dst[512], page[4096];
    qs_segment_path(src, sizeof src, NULL, from, suffix);
    qs_segment_path(dst, sizeof dst, NULL, to, suffix);
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int ok = in >= 0 && out >= 0 && read(in, page, sizeof page) == sizeof page &&
             write(out, page, sizeof page) == sizeof page;
    close(in);
    close(out);
    return ok;
}

static int test_segment_of_another_size_is_refused(void)
{
    qs_node *node = make_node("size");
    EXPECT(node);
    char other[48];
    snprintf(other, sizeof other, "%s", test_segment("size2"));
    EXPECT(write_truncated_copy(test_segment("size"), other, "cfg"));
    EXPECT(write_truncated_copy(test_segment("size"), other, "owner"));
    qs_node *adopted = NULL;
    EXPECT(qs_node_adopt(other, NULL, &adopted) == QS_ESIZE);
    EXPECT(strstr(qs_last_error(), "bytes") != NULL);
    qs_segment_unlink(NULL, other);
    qs_node_close(node);
    return 0;
}

static int test_bad_vgpu_specs_are_refused_and_change_nothing(void)
{
    qs_node *node = make_node("spec");
    EXPECT(node);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 0, GiB) == QS_ESHARE);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 101, GiB) == QS_ESHARE);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 50, 0) == QS_EMEMLIMIT);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 50, 17 * GiB) == QS_EMEMLIMIT);
    EXPECT(vgpu(node, 1, 7, 50, GiB) == QS_EPRIORITY);
    qs_vgpu_spec spec = {.id = 1, .card = 3, .priority = 0, .core_share = 10, .mem_limit = GiB};
    EXPECT(qs_vgpu_create(node, &spec) == QS_ENOENT);
    qs_card_stats cs;
    EXPECT(qs_card_stats_get(node, 0, &cs) == QS_OK && cs.vgpus == 0);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 60, GiB) == QS_OK);
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 10, GiB) == QS_EEXIST);
    EXPECT(vgpu(node, 2, QS_PRIO_LOW, 50, GiB) == QS_ESHARESUM);
    EXPECT(qs_vgpu_update(node, 1, 0, GiB) == QS_ESHARE);
    EXPECT(qs_vgpu_update(node, 9, 10, GiB) == QS_ENOENT);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.core_share == 60 && st.mem_limit == GiB);
    EXPECT(qs_card_stats_get(node, 0, &cs) == QS_OK && cs.vgpus == 1);
    qs_node_close(node);
    return 0;
}

static int test_unknown_create_flags_are_refused_and_create_nothing(void)
{
    qs_node *node = make_node("cflags");
    EXPECT(node);
    qs_vgpu_spec spec = {.id = 1, .card = 0, .priority = 0, .core_share = 10, .mem_limit = GiB};
    EXPECT(qs_vgpu_create_flags(node, &spec, 2) == QS_EINVAL);
    EXPECT(strstr(qs_last_error(), "unknown flags 0x2"));
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_ENOENT);
    EXPECT(qs_vgpu_create_flags(node, &spec, 0) == QS_OK);
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.suspended == 0);
    qs_node_close(node);
    return 0;
}

/* A thread's first launch, and whether the resume had been asked for when it passed. */
struct first_launch {
    qs_client *cl;
    _Atomic int tid, done, resume_asked;
    int rc, saw_resume_asked;
};

static void *launch_first(void *arg)
{
    struct first_launch *fl = arg;
    atomic_store(&fl->tid, (int)syscall(SYS_gettid));
    fl->rc = qs_launch_begin(fl->cl);
    fl->saw_resume_asked = atomic_load(&fl->resume_asked);
    if (fl->rc == QS_OK)
        qs_launch_end(fl->cl);
    atomic_store(&fl->done, 1);
    return NULL;
}

/* 1 while thread `tid` of this process sleeps in a futex wait on `word` (its syscall file). */
static int asleep_on(int tid, const void *word)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    long nr = -1;
    unsigned long arg0 = 0;
    int parsed = fgets(line, sizeof line, f) && sscanf(line, "%ld %lx", &nr, &arg0) == 2;
    fclose(f);
    return parsed && nr == SYS_futex && arg0 == (unsigned long)(uintptr_t)word;
}

/* Waits (up to 10 s) until the thread's launch returned or it sleeps on `word`. */
static void wait_launch_settled(struct first_launch *fl, const void *word)
{
    struct timespec ms = {.tv_sec = 0, .tv_nsec = 1000000};
    for (int i = 0; i < 10000 && !atomic_load(&fl->done); i++) {
        int tid = atomic_load(&fl->tid);
        if (tid && asleep_on(tid, word))
            return;
        nanosleep(&ms, NULL);
    }
}

/* A vGPU created suspended is suspended before anyone can attach: a client that attaches and
 * launches right after the create call returns is held at the gate (asleep on the vGPU's
 * suspended word) until the resume. Before, the node agent created it running and suspended it
 * in a second call, and such a launch passed. */
static int test_a_vgpu_created_suspended_holds_the_first_launch_until_resumed(void)
{
    qs_node *node = make_node("csusp");
    EXPECT(node);
    qs_vgpu_spec spec = {.id = 7, .card = 0, .priority = QS_PRIO_LOW, .core_share = 50,
                         .mem_limit = GiB};
    EXPECT(qs_vgpu_create_flags(node, &spec, QS_VGPU_CREATE_SUSPENDED) == QS_OK);
    struct first_launch fl = {.rc = 1};
    EXPECT(qs_client_attach(test_segment("csusp"), NULL, 7, &fl.cl) == QS_OK);
    uint32_t card = 0;
    struct qs_segment *seg = qs_client_segment(fl.cl, &card);
    int slot = qs_find_vgpu(seg->cfg, 7);
    EXPECT(slot >= 0);
    pthread_t thread;
    EXPECT(pthread_create(&thread, NULL, launch_first, &fl) == 0);
    wait_launch_settled(&fl, &seg->cfg->vgpus[slot].suspended);
    int held = !atomic_load(&fl.done);
    atomic_store(&fl.resume_asked, 1);
    EXPECT(qs_vgpu_resume(node, 7) == QS_OK);
    pthread_join(thread, NULL);
    EXPECT(held);
    EXPECT(fl.rc == QS_OK && fl.saw_resume_asked);
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 7, &st) == QS_OK && st.launches == 1 && !st.suspended);
    qs_event ev;
    EXPECT(qs_node_next_event(node, &ev, 1000) == QS_OK && ev.kind == QS_EV_SUSPENDED);
    EXPECT(ev.vgpu == 7);
    EXPECT(qs_client_detach(fl.cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_segment_lock_held_by_a_killed_process_is_recovered(void)
{
    qs_node *node = make_node("seglock");
    EXPECT(node);
    pid_t pid = fork();
    if (pid == 0) {
        qs_node_lock(node);
        raise(SIGKILL);
    }
    int status;
    waitpid(pid, &status, 0);
    EXPECT(WIFSIGNALED(status));
    EXPECT(vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    EXPECT(vgpu(node, 2, QS_PRIO_HIGH, 50, GiB) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_memory_lock_held_by_a_killed_process_is_recovered(void)
{
    qs_node *node = make_node("memlock");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    pid_t pid = fork();
    if (pid == 0) {
        qs_client *cl = NULL;
        if (qs_client_attach(test_segment("memlock"), NULL, 1, &cl) || qs_mem_reserve(cl, MiB)) {
            fprintf(stderr, "  child: %s\n", qs_last_error());
            _exit(3);
        }
        uint32_t card;
        pthread_mutex_lock(&qs_client_segment(cl, &card)->vmem[0]->lock);
        raise(SIGKILL);
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status))
        fprintf(stderr, "  child exit status %d\n", WEXITSTATUS(status));
    EXPECT(WIFSIGNALED(status));
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("memlock"), NULL, 1, &cl) == QS_OK);
    EXPECT(qs_mem_reserve(cl, GiB - MiB) == QS_OK || qs_mem_reserve(cl, GiB) == QS_OK);
    qs_client_info info;
    EXPECT(qs_client_info_get(cl, &info) == QS_OK && info.mem_used <= GiB);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int child_reserve_until_full(const char *seg, int out_fd)
{
    qs_client *cl = NULL;
    if (qs_client_attach(seg, NULL, 1, &cl) != QS_OK)
        return 2;
    uint64_t got = 0;
    while (qs_mem_reserve(cl, 3 * MiB) == QS_OK)
        got += 3 * MiB;
    if (write(out_fd, &got, sizeof got) != sizeof got)
        return 2;
    pause(); /* stay attached until the parent has checked the totals */
    return 0;
}

static int test_racing_reservations_never_exceed_the_limit(void)
{
    enum { KIDS = 8 };
    qs_node *node = make_node("race");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, 100 * MiB) == QS_OK);
    int fds[2];
    EXPECT(pipe(fds) == 0);
    pid_t kids[KIDS];
    for (int i = 0; i < KIDS; i++)
        if ((kids[i] = fork()) == 0)
            _exit(child_reserve_until_full(test_segment("race"), fds[1]));
    uint64_t total = 0;
    for (int i = 0; i < KIDS; i++) {
        uint64_t got;
        EXPECT(read(fds[0], &got, sizeof got) == sizeof got);
        total += got;
    }
    qs_vgpu_stats st;
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK);
    EXPECT(total <= 100 * MiB && total == st.mem_used && total == 99 * MiB);
    for (int i = 0; i < KIDS; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    qs_event ev;
    int died = 0;
    while (qs_node_next_event(node, &ev, 200) == QS_OK && died < KIDS)
        died += ev.kind == QS_EV_CLIENT_DIED;
    EXPECT(died == KIDS);
    EXPECT(qs_vgpu_stats_get(node, 1, &st) == QS_OK && st.mem_used == 0 && st.contexts == 0);
    qs_node_close(node);
    close(fds[0]);
    close(fds[1]);
    return 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Kernels of racing processes take turns on the one simulated card: every kernel is charged
 * its exact duration, and all of them together take at least their sum of wall time. */
static int test_simulated_kernels_of_racing_processes_never_overlap(void)
{
    enum { KIDS = 4, KERNELS = 25 };
    const uint64_t kernel_ns = 1000000;
    qs_node *node = make_node("simq");
    EXPECT(node);
    for (uint32_t v = 1; v <= KIDS; v++)
        EXPECT(vgpu(node, v, QS_PRIO_LOW, 20, GiB) == QS_OK);
    uint64_t t0 = mono_ns();
    pid_t kids[KIDS];
    for (int i = 0; i < KIDS; i++) {
        if ((kids[i] = fork()) == 0) {
            qs_client *cl = NULL;
            int ok = qs_client_attach(test_segment("simq"), NULL, (uint32_t)i + 1, &cl) == QS_OK &&
                     qs_sim_kernels(cl, KERNELS, kernel_ns) == QS_OK;
            _exit(ok ? 0 : 2);
        }
    }
    int clean = 1;
    for (int i = 0; i < KIDS; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        clean &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    uint64_t elapsed = mono_ns() - t0;
    qs_card_stats cs;
    EXPECT(clean && qs_card_stats_get(node, 0, &cs) == QS_OK);
    EXPECT(cs.device_ns == KIDS * KERNELS * kernel_ns);
    EXPECT(elapsed >= cs.device_ns);
    qs_node_close(node);
    return 0;
}

static int test_full_ring_drops_the_oldest_and_counts_them(void)
{
    qs_node *node = make_node("ring");
    EXPECT(node);
    for (uint32_t i = 0; i < QS_EVENT_RING_SIZE + 100; i++)
        qs_ring_push(&node->seg.state->ring, QS_EV_OOM, 0, 1, 0, i);
    qs_event ev;
    EXPECT(qs_node_next_event(node, &ev, 0) == QS_OK);
    EXPECT(ev.value == 100);
    EXPECT(qs_node_dropped_events(node) == 100);
    uint64_t prev = ev.seq;
    int n = 1;
    while (qs_node_next_event(node, &ev, 0) == QS_OK) {
        EXPECT(ev.seq == prev + 1);
        prev = ev.seq;
        n++;
    }
    EXPECT(n == QS_EVENT_RING_SIZE);
    qs_node_close(node);
    return 0;
}

#define WRITERS 4
#define PUSHES_EACH 900 /* WRITERS * PUSHES_EACH stays under the ring's size: nothing may drop */

struct ring_writer {
    struct qs_ring *ring;
    uint32_t id;
};

static void *push_many(void *arg)
{
    struct ring_writer *w = arg;
    for (uint64_t i = 0; i < PUSHES_EACH; i++)
        qs_ring_push(w->ring, QS_EV_OOM, 0, w->id, 0, i);
    return NULL;
}

static int test_concurrent_pushes_all_arrive_in_each_writers_order(void)
{
    qs_node *node = make_node("ringmt");
    EXPECT(node);
    pthread_t threads[WRITERS];
    struct ring_writer writers[WRITERS];
    for (uint32_t k = 0; k < WRITERS; k++) {
        writers[k] = (struct ring_writer){.ring = &node->seg.state->ring, .id = k};
        EXPECT(pthread_create(&threads[k], NULL, push_many, &writers[k]) == 0);
    }
    uint64_t next[WRITERS] = {0};
    int in_order = 1, got = 0;
    qs_event ev;
    while (got < WRITERS * PUSHES_EACH && qs_node_next_event(node, &ev, 2000) == QS_OK) {
        in_order &= ev.vgpu < WRITERS && ev.value == next[ev.vgpu];
        if (ev.vgpu < WRITERS)
            next[ev.vgpu]++;
        got++;
    }
    for (uint32_t k = 0; k < WRITERS; k++)
        pthread_join(threads[k], NULL);
    EXPECT(got == WRITERS * PUSHES_EACH && in_order);
    EXPECT(qs_node_dropped_events(node) == 0);
    qs_node_close(node);
    return 0;
}

static int test_attach_to_unknown_vgpu_names_it(void)
{
    qs_node *node = make_node("unknown");
    EXPECT(node);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("unknown"), NULL, 42, &cl) == QS_ENOENT);
    EXPECT(strstr(qs_last_error(), "42") != NULL);
    qs_node_close(node);
    EXPECT(qs_client_attach(test_segment("unknown"), NULL, 42, &cl) == QS_ENOENT);
    return 0;
}

static int test_release_beyond_reservation_is_refused(void)
{
    qs_node *node = make_node("release");
    EXPECT(node && vgpu(node, 1, QS_PRIO_LOW, 50, GiB) == QS_OK);
    qs_client *cl = NULL;
    EXPECT(qs_client_attach(test_segment("release"), NULL, 1, &cl) == QS_OK);
    EXPECT(qs_mem_reserve(cl, MiB) == QS_OK);
    EXPECT(qs_mem_release(cl, 2 * MiB) == QS_ERELEASE);
    EXPECT(qs_mem_release(cl, MiB) == QS_OK);
    EXPECT(qs_launch_end(cl) == QS_ESTATE);
    EXPECT(qs_client_detach(cl) == QS_OK);
    qs_node_close(node);
    return 0;
}

static int test_null_handles_are_refused_with_a_clear_error(void)
{
    EXPECT(qs_launch_begin(NULL) == QS_EINVAL);
    EXPECT(strstr(qs_last_error(), "client is NULL") != NULL);
    EXPECT(qs_mem_reserve(NULL, 1) == QS_EINVAL);
    EXPECT(qs_vgpu_create(NULL, NULL) == QS_EINVAL);
    qs_node *node = make_node("null");
    EXPECT(node);
    EXPECT(qs_vgpu_create(node, NULL) == QS_EINVAL);
    EXPECT(qs_card_stats_get(node, 0, NULL) == QS_EINVAL);
    EXPECT(qs_node_next_event(node, NULL, 0) == QS_EINVAL);
    qs_node_close(node);
    return 0;
}

/* The auto rule as a pure function, under the sanitizers: a history of steady requests gets
 * a delay under the maximum; edge inputs (no gaps, a zero gap, a NULL history) stay defined. */
static int test_auto_rule_chooses_a_short_delay_for_steady_requests(void)
{
    qs_release_auto_history history = {0};
    qs_release_auto_period period = {0};
    uint32_t b = qs_release_auto_bucket(30000000ull);
    period.gap_count[b] = 100;
    period.gap_sum_ns[b] = 100 * 30000000ull;
    period.lp_device_ns = 50000ull * 1000;
    period.lp_launches = 1000;
    EXPECT(qs_release_auto_fold(&history, &period) == QS_OK);
    uint64_t penalty = qs_release_auto_penalty(&history, 1, 500000ull, 2000000ull);
    EXPECT(penalty == 500000ull);
    EXPECT(qs_release_auto_choose(&history, 2000000ull, 100000000ull, penalty) < 1000000ull);
    EXPECT(qs_release_auto_bucket(0) == 0);
    EXPECT(qs_release_auto_choose(&history, 2000000ull, 0, penalty) == 0);
    EXPECT(qs_release_auto_fold(NULL, &period) == QS_EINVAL);
    EXPECT(qs_release_auto_penalty(NULL, 1, 1, 1) == 0);
    return 0;
}

int main(void)
{
    const struct test_case tests[] = {
        {"segment names are validated", test_segment_names_are_validated},
        {"segment of another version is refused untouched",
         test_segment_of_another_version_is_refused_untouched},
        {"segment of another size is refused", test_segment_of_another_size_is_refused},
        {"bad vGPU specs are refused and change nothing",
         test_bad_vgpu_specs_are_refused_and_change_nothing},
        {"unknown create flags are refused and create nothing",
         test_unknown_create_flags_are_refused_and_create_nothing},
        {"a vGPU created suspended holds the first launch until resumed",
         test_a_vgpu_created_suspended_holds_the_first_launch_until_resumed},
        {"segment lock held by a killed process is recovered",
         test_segment_lock_held_by_a_killed_process_is_recovered},
        {"memory lock held by a killed process is recovered",
         test_memory_lock_held_by_a_killed_process_is_recovered},
        {"racing reservations never exceed the limit",
         test_racing_reservations_never_exceed_the_limit},
        {"simulated kernels of racing processes never overlap",
         test_simulated_kernels_of_racing_processes_never_overlap},
        {"concurrent pushes all arrive in each writer's order",
         test_concurrent_pushes_all_arrive_in_each_writers_order},
        {"full ring drops the oldest and counts them",
         test_full_ring_drops_the_oldest_and_counts_them},
        {"attach to unknown vGPU names it", test_attach_to_unknown_vgpu_names_it},
        {"release beyond reservation is refused", test_release_beyond_reservation_is_refused},
        {"null handles are refused with a clear error",
         test_null_handles_are_refused_with_a_clear_error},
        {"auto rule chooses a short delay for steady requests",
         test_auto_rule_chooses_a_short_delay_for_steady_requests},
    };
    return run_tests(tests, sizeof tests / sizeof tests[0]);
}

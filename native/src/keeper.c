/* keeper.c — a client's stand-in for its owner's release thread. While the owner lives, the
 * keeper thread sleeps in poll() on the client's attach connection and costs nothing; once the
 * owner's end closes (the owner died, or left for a restart), it reopens the card's gate as the
 * owner's release thread would: once high priority has been quiet for the release delay, never
 * while it is busy. Low priority's work queued behind the gate word on the device (the CUDA
 * interposer's device gate) then never stays held by a dead owner. */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct qs_keeper {
    struct qs_segment *seg;
    uint32_t card;
    int sock, stop_fd, pid; /* pid: the process whose thread it is (a fork has none) */
    _Atomic uint32_t *mine;
    _Atomic uint32_t stop;
    pthread_t thread;
};

/* Sleep until the owner's end of the connection closes (1) or the keeper is stopped (0). */
static int owner_gone(struct qs_keeper *k)
{
    if (k->sock < 0)
        return 1;
    struct pollfd fds[2] = {{.fd = k->sock, .events = POLLRDHUP},
                            {.fd = k->stop_fd, .events = POLLIN}};
    int n;
    while ((n = poll(fds, 2, -1)) < 0 && errno == EINTR) {
    }
    return n > 0 && !fds[1].revents && !atomic_load(&k->stop);
}

static void *keeper_main(void *arg)
{
    struct qs_keeper *k = arg;
    if (owner_gone(k))
        qs_gate_keep_loop(k->seg, k->card, &k->stop, k->mine);
    return NULL;
}

/* The thread takes no signal: the program's handlers run on its own threads. */
static int start_thread(struct qs_keeper *k)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&k->thread, NULL, keeper_main, k);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return e;
}

int qs_keeper_start(struct qs_segment *seg, uint32_t card, int sock, _Atomic uint32_t *mine,
                    struct qs_keeper **out)
{
    struct qs_keeper *k = calloc(1, sizeof *k);
    if (!k)
        return qs_fail(QS_ESYS, "out of memory");
    *k = (struct qs_keeper){.seg = seg, .card = card, .sock = sock, .mine = mine,
                            .pid = (int)getpid()};
    k->stop_fd = eventfd(0, EFD_CLOEXEC);
    int e = k->stop_fd < 0 ? errno : start_thread(k);
    if (e) {
        if (k->stop_fd >= 0)
            close(k->stop_fd);
        free(k);
        errno = e;
        return qs_fail_errno("starting the gate keeper thread");
    }
    *out = k;
    return QS_OK;
}

void qs_keeper_stop(struct qs_keeper *k)
{
    if (!k)
        return;
    if (k->pid == (int)getpid()) {
        atomic_store(&k->stop, 1);
        uint64_t one = 1;
        if (write(k->stop_fd, &one, sizeof one) != sizeof one) {
            /* the count cannot overflow from one write; the wake below still stops a loop */
        }
        qs_gate_wake_all(k->seg, k->card);
        pthread_join(k->thread, NULL);
    }
    close(k->stop_fd);
    free(k);
}

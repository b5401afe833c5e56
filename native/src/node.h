/* node.h — the owner's handle and the service threads it runs. */
#ifndef QSHARE_NODE_H
#define QSHARE_NODE_H

#include "internal.h"

struct qs_release_arg {
    struct qs_node *node;
    uint32_t card;
};

struct qs_node {
    struct qs_segment seg;
    char dir[256];
    char name[QS_NAME_MAX];
    struct qs_ring_cursor ring_cursor;
    int epoll_fd, stop_fd, kick_fd, spare_fd;
    int fd_limit; /* the descriptor soft limit, after raising it */
    pthread_t service_thread;
    int service_running;
    pthread_t release_threads[QS_MAX_CARDS];
    int release_running[QS_MAX_CARDS];
    struct qs_release_arg release_args[QS_MAX_CARDS];
    _Atomic uint32_t stop;
    int conn_fd_of_ctx[QS_MAX_CONTEXTS];  /* service thread only */
    int pidfd_of_ctx[QS_MAX_CONTEXTS];    /* adopted contexts: liveness by pidfd */
    _Atomic int listen_fd_of_slot[QS_MAX_VGPUS];   /* each vGPU's attach socket */
    _Atomic int dead_listen_fd[QS_MAX_VGPUS];      /* closed by the service thread */
    /* A vGPU slot's life, under a lock of the owner's own (never in the state part): a new
     * vGPU replaces the slot's memory part (a process of the vGPU that had the slot before
     * keeps no reach into the new one); an attach binds a context only to an active slot; a
     * destroyed slot is freed only when the owner's records hold no context of it. Statistics
     * read under it too. Taken after the segment lock, never before it. */
    pthread_mutex_t slot_lock;
};

int qs_node_lock(qs_node *node);
/* The opening of every per-card call: clears the last error, then QS_OK if `node` is a handle
 * and card `index` is on it, else QS_EINVAL or QS_ENOENT naming what is wrong. */
int qs_node_check_card(qs_node *node, uint32_t index);
void qs_node_unlock(qs_node *node);
int qs_service_start(qs_node *node);
void qs_service_stop(qs_node *node);
int qs_service_card_added(qs_node *node, uint32_t card);
/* Open (or, after an adopt, reopen) vGPU slot `slot`'s attach socket; close it. */
int qs_service_vgpu_added(qs_node *node, uint32_t slot);
void qs_service_vgpu_removed(qs_node *node, uint32_t slot);
/* Adopt: keep the recorded contexts whose process lives (watched by pidfd), reap the rest. */
int qs_service_adopt_contexts(qs_node *node);
/* Contexts of vGPU slot `slot` in the owner's private records (the state part's count is
 * every tenant's to rewrite). */
uint32_t qs_service_contexts_of(qs_node *node, uint32_t slot);
/* The state memfd held by a live recorded process, or -1. */
int qs_service_find_state(qs_node *node);
/* Every live vGPU's memory part, as its processes hold it or made anew (after adopt_state). */
int qs_service_adopt_vmems(qs_node *node);
/* /proc/<pid>/stat starttime, or 0. */
uint64_t qs_proc_start_time(int pid);
/* Auto mode turned on: forget the gaps and start the warm-up again; LP's mean kernel stays. */
void qs_release_auto_restart(qs_release_auto_history *history);

#endif

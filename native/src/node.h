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
    uint64_t ring_tail;
    int listen_fd, epoll_fd, stop_fd;
    pthread_t service_thread;
    int service_running;
    pthread_t release_threads[QS_MAX_CARDS];
    int release_running[QS_MAX_CARDS];
    struct qs_release_arg release_args[QS_MAX_CARDS];
    _Atomic uint32_t stop;
    uint32_t generation;
    int conn_fd_of_ctx[QS_MAX_CONTEXTS]; /* service thread only */
};

int qs_node_lock(qs_node *node);
void qs_node_unlock(qs_node *node);
int qs_service_start(qs_node *node);
void qs_service_stop(qs_node *node);
int qs_service_card_added(qs_node *node, uint32_t card);

#endif

"""The API client's keep-alive connections end with the threads that opened them: the
kubelet plugins' threads come and go (a gRPC server and its pool are made again each time
the kubelet restarts), and a connection kept for a thread that ended is a socket leaked."""

from __future__ import annotations

import gc
import os
import threading

from qshare_node_agent.kubernetes.apiserver import KubeApi

from .conftest import wait_for
from .doubles import ApiServerDouble

NODE_PATH = "/api/v1/nodes/node-a"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_connection_of_a_thread_that_ended_is_closed(apiserver: ApiServerDouble) -> None:
    apiserver.put_object(NODE_PATH, {"kind": "Node", "metadata": {"name": "node-a"}})
    api = KubeApi(apiserver.url, None, None, timeout_s=5)
    before = open_fds()
    try:
        for _ in range(20):
            thread = threading.Thread(target=api.node, args=("node-a",))
            thread.start()
            thread.join()
        gc.collect()
        wait_for(lambda: open_fds() - before < 5)  # the server's ends close once ours do
    finally:
        api.close()

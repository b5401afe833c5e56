"""Build the cffi extension `qshare_driver._ffi` (API mode, out of line) from native/src.

Run by `make native`; never at import time.
"""

import os
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent

CDEF = """
#define QS_MAX_CARDS 16
#define QS_MAX_VGPUS_PER_CARD 64
#define QS_UUID_MAX 64
#define QS_ABI_VERSION 2
typedef struct qs_event {
    uint64_t seq; uint64_t time_ns; uint32_t kind; uint32_t card; uint32_t vgpu;
    int32_t pid; uint64_t value;
} qs_event;
typedef struct qs_vgpu_spec {
    uint32_t id; uint32_t card; uint32_t priority; uint32_t core_share; uint64_t mem_limit;
} qs_vgpu_spec;
typedef struct qs_vgpu_stats {
    uint32_t id, card, priority, core_share; uint64_t mem_limit; uint64_t mem_used;
    uint64_t device_ns; uint64_t launches; uint32_t contexts; uint32_t suspended;
} qs_vgpu_stats;
typedef struct qs_card_stats {
    uint32_t index; uint32_t busy; uint64_t total_mem; uint64_t release_delay_ns;
    uint32_t policy; uint32_t vgpus; uint64_t episodes; uint64_t device_ns;
    char uuid[64];
} qs_card_stats;
typedef struct qs_client_info {
    uint32_t vgpu, card, priority, core_share; uint64_t mem_limit; uint64_t mem_used;
    uint64_t mem_reserved; uint64_t card_total_mem; char card_uuid[64];
} qs_client_info;
typedef struct qs_node qs_node;
typedef struct qs_client qs_client;

const char *qs_strerror(int status);
const char *qs_last_error(void);
uint64_t qs_now_ns(void);

int qs_node_create(const char *name, const char *dir, int replace, qs_node **out);
void qs_node_close(qs_node *node);
int qs_card_add(qs_node *node, uint32_t index, const char *uuid, uint64_t total_mem);
int qs_card_set_release_delay(qs_node *node, uint32_t index, uint64_t delay_ns);
int qs_card_set_policy(qs_node *node, uint32_t index, uint32_t policy);
int qs_card_stats_get(qs_node *node, uint32_t index, qs_card_stats *out);
int qs_vgpu_create(qs_node *node, const qs_vgpu_spec *spec);
int qs_vgpu_update(qs_node *node, uint32_t id, uint32_t core_share, uint64_t mem_limit);
int qs_vgpu_destroy(qs_node *node, uint32_t id);
int qs_vgpu_suspend(qs_node *node, uint32_t id);
int qs_vgpu_resume(qs_node *node, uint32_t id);
int qs_vgpu_stats_get(qs_node *node, uint32_t id, qs_vgpu_stats *out);
int qs_node_next_event(qs_node *node, qs_event *out, int timeout_ms);
uint64_t qs_node_dropped_events(qs_node *node);

int qs_client_attach(const char *name, const char *dir, uint32_t vgpu_id, qs_client **out);
int qs_client_detach(qs_client *client);
int qs_launch_begin(qs_client *client);
int qs_launch_end(qs_client *client);
int qs_mem_reserve(qs_client *client, uint64_t bytes);
int qs_mem_release(qs_client *client, uint64_t bytes);
int qs_client_info_get(qs_client *client, qs_client_info *out);
int qs_account_device_time(qs_client *client, uint64_t ns);
int qs_sim_kernel(qs_client *client, uint64_t duration_ns);
int qs_sim_kernels(qs_client *client, uint32_t count, uint64_t duration_ns);
uint64_t qs_client_last_unblock_ns(qs_client *client);
int qs_bench_launch_overhead(qs_client *client, uint64_t iterations, double *ns_per_pair);
int qs_bench_timed_begin(qs_client *client, uint64_t *begin_ns, uint64_t *done_ns);
typedef struct qs_release_auto_stats {
    uint32_t enabled; uint32_t pad; uint64_t delay_ns; uint64_t p99_bound_ns;
    uint64_t max_delay_ns; uint64_t penalty_ns; uint64_t gaps;
} qs_release_auto_stats;
int qs_card_set_release_auto(qs_node *node, uint32_t index, int enable, uint64_t p99_bound_ns,
                             uint64_t max_delay_ns);
int qs_card_release_auto_get(qs_node *node, uint32_t index, qs_release_auto_stats *out);
"""


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    sources = sorted(str(p) for p in (ROOT / "src").glob("*.c"))
    ffi.set_source(
        "qshare_driver._ffi",
        '#include "qshare.h"',
        sources=sources,
        include_dirs=[str(ROOT / "include"), str(ROOT / "src")],
        extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-D_GNU_SOURCE", "-pthread"],
        extra_link_args=["-pthread"],
    )
    return ffi


def main() -> None:
    ffi = builder()
    ffi.compile(tmpdir=str(ROOT / "build" / "ffi"), verbose=False)
    built = sorted((ROOT / "build" / "ffi" / "qshare_driver").glob("_ffi*.so"))
    target_dir = ROOT / "python" / "qshare_driver"
    for so in built:
        # A new inode, never a rewrite in place: running processes keep the old mapping.
        staged = target_dir / (so.name + ".new")
        staged.write_bytes(so.read_bytes())
        os.replace(staged, target_dir / so.name)


if __name__ == "__main__":
    main()

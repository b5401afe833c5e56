/* qshare.h — the node-local driver: node segment, vGPU inventory, priority gate,
 * memory accounting, event ring and simulated device. One header, two roles:
 * the node owner (qs_node_*) and workload processes (qs_client_*). */
#ifndef QSHARE_H
#define QSHARE_H

#ifndef QS_CFFI_CDEF /* native/build_ffi.py feeds this header, preprocessed, to cffi */
#include <stdint.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define QS_ABI_VERSION 7u
#define QS_MAX_CARDS 16u
#define QS_MAX_VGPUS_PER_CARD 64u
#define QS_MAX_VGPUS (QS_MAX_CARDS * QS_MAX_VGPUS_PER_CARD)
#define QS_MAX_CONTEXTS 4096u
/* Contexts (attached processes) one vGPU may hold at once: one tenant cannot take the whole
 * table from the others. */
#define QS_MAX_CONTEXTS_PER_VGPU 64u
#define QS_NAME_MAX 48u
#define QS_UUID_MAX 64u
#define QS_EVENT_RING_SIZE 4096u
#define QS_DEFAULT_RELEASE_DELAY_NS 100000000ull
/* Low priority's in-flight window on a card, in estimated device time (about one long
 * low-priority kernel, ResNet-50 training's longest being 453 µs on an H100: what high
 * priority may wait behind when the gate closes). */
#define QS_DEFAULT_LP_WINDOW_NS 500000ull
#define QS_MAX_LP_WINDOW_NS 1000000000ull
/* The window while no high-priority process is attached to the card: nobody to protect,
 * but a bound still (deep enough for the host to run ahead of a training step's phases). */
#define QS_LP_WINDOW_ALONE_NS 20000000ull
/* With the device gate, low priority's queue reaches the card this much device time at a
 * time: what a high-priority launch waits for instead of the window. */
#define QS_LP_DEVICE_GATE_SLICE_NS 100000ull

/* Status codes: every function returns QS_OK or one of these (negative). */
enum qs_status {
    QS_OK = 0,
    QS_EINVAL = -1,      /* an argument is malformed (details in qs_last_error) */
    QS_ENAME = -2,       /* segment name empty, too long, or with a '/' */
    QS_EEXIST = -3,      /* the segment, card or vGPU id already exists */
    QS_ENOENT = -4,      /* no such segment, card or vGPU */
    QS_EVERSION = -5,    /* the segment was made by another ABI version */
    QS_ESIZE = -6,       /* the segment has an unexpected size */
    QS_EMAGIC = -7,      /* the file is not a qshare segment */
    QS_ESHARE = -8,      /* core share outside 1..100 */
    QS_EMEMLIMIT = -9,   /* memory limit 0 or above the card's memory */
    QS_ENOMEM = -10,     /* reservation would exceed the vGPU's memory limit */
    QS_ERELEASE = -11,   /* releasing more memory than this context reserved */
    QS_EFULL = -12,      /* a fixed-size table is full */
    QS_EDESTROYED = -13, /* the vGPU was destroyed */
    QS_ESYS = -14,       /* a system call failed (errno in qs_last_error) */
    QS_ETIMEDOUT = -15,  /* nothing happened before the timeout */
    QS_EPRIORITY = -16,  /* priority is neither high nor low */
    QS_ESTATE = -17,     /* not valid now (e.g. client already detached) */
    QS_EAGENT = -18,     /* the node owner does not answer */
    QS_ECORRUPT = -19,   /* a broken invariant was found; nothing was changed */
    QS_EPOLICY = -20,    /* unknown sharing policy */
    QS_ESHARESUM = -21,  /* guaranteed core shares on the card would exceed 100 */
};

enum qs_priority { QS_PRIO_LOW = 0, QS_PRIO_HIGH = 1 };

enum qs_policy { QS_POLICY_BEST_EFFORT = 0, QS_POLICY_FIXED_SHARE = 1, QS_POLICY_BURST_SHARE = 2 };

enum qs_event_kind {
    QS_EV_BUSY = 1,        /* card: high priority turned busy */
    QS_EV_IDLE = 2,        /* card: released to low priority; value = busy ns */
    QS_EV_SUSPENDED = 3,   /* vGPU suspended by qs_vgpu_suspend, or created suspended */
    QS_EV_RESUMED = 4,     /* vGPU resumed by qs_vgpu_resume */
    QS_EV_OOM = 5,         /* reservation refused; value = bytes asked */
    QS_EV_ATTACH = 6,      /* a process attached to a vGPU */
    QS_EV_DETACH = 7,      /* a process detached */
    QS_EV_CLIENT_DIED = 8, /* a process died attached; its resources were reclaimed */
};

typedef struct qs_event {
    uint64_t seq;     /* ring sequence number, increasing */
    uint64_t time_ns; /* CLOCK_MONOTONIC */
    uint32_t kind;    /* enum qs_event_kind */
    uint32_t card;    /* card index, or UINT32_MAX */
    uint32_t vgpu;    /* vGPU id, or UINT32_MAX */
    int32_t pid;      /* process concerned, as the owner sees it, or 0 */
    uint64_t value;   /* kind-specific */
} qs_event;

typedef struct qs_vgpu_spec {
    uint32_t id;          /* caller-chosen, unique in the segment */
    uint32_t card;        /* card index */
    uint32_t priority;    /* enum qs_priority */
    uint32_t core_share;  /* 1..100 */
    uint64_t mem_limit;   /* bytes, 1..card total */
} qs_vgpu_spec;

typedef struct qs_vgpu_stats {
    uint32_t id, card, priority, core_share;
    uint64_t mem_limit;
    uint64_t mem_used;
    uint64_t device_ns;  /* device time used, all contexts */
    uint64_t launches;
    uint32_t contexts;   /* processes attached */
    uint32_t suspended;
} qs_vgpu_stats;

typedef struct qs_card_stats {
    uint32_t index;
    uint32_t busy;       /* 1 while high priority holds the card */
    uint64_t total_mem;
    uint64_t release_delay_ns;
    uint32_t policy;
    uint32_t vgpus;
    uint64_t episodes;   /* busy transitions so far */
    uint64_t device_ns;  /* simulated device time used, all vGPUs */
    char uuid[QS_UUID_MAX];
    uint64_t lp_window_ns; /* low priority's in-flight window (qs_card_set_lp_window) */
    uint32_t lp_device_gate; /* 1: the device gate is on (qs_card_set_lp_device_gate) */
    uint64_t policy_wakes;   /* times low priority's accounting woke the policy's sleepers */
} qs_card_stats;

/* ---- errors ---- */
const char *qs_strerror(int status);
/* The detailed message of this thread's last failing call (never NULL). */
const char *qs_last_error(void);
/* CLOCK_MONOTONIC in ns: the clock of events and statistics. */
uint64_t qs_now_ns(void);

/* ---- owner side (the node agent) ---- */
typedef struct qs_node qs_node;

/* Create segment `name` in `dir` (NULL: $QSHARE_SHM_DIR or /dev/shm) and start the
 * owner's service threads. A stale segment of the same name is replaced only when
 * `replace` is non-zero; otherwise QS_EEXIST. */
int qs_node_create(const char *name, const char *dir, int replace, qs_node **out);
/* Adopt the existing segment `name` after its owner died (kill -9, crash): re-open it as
 * owner, restart the service threads and the vGPUs' attach sockets, keep the contexts whose
 * process still lives (watched by pidfd from now on) and reap the others. Processes that stay
 * attached keep working and stay limited. QS_EEXIST while the recorded owner still runs. */
int qs_node_adopt(const char *name, const char *dir, qs_node **out);
/* Stop the service threads and remove the segment. */
void qs_node_close(qs_node *node);
/* Stop the service threads and let go of the segment without removing it: its vGPUs and
 * the processes attached to them stay as they are until another owner adopts it
 * (qs_node_adopt). What a node agent does when it stops for a restart or an upgrade. */
void qs_node_leave(qs_node *node);
/* Ids of the segment's vGPUs / indices of its cards: `*count` is how many there are; at most
 * `cap` are written to the array (which may be NULL to ask for the count). */
int qs_node_list_vgpus(qs_node *node, uint32_t *ids, uint32_t cap, uint32_t *count);
int qs_node_list_cards(qs_node *node, uint32_t *indices, uint32_t cap, uint32_t *count);
/* The directory holding vGPU `id`'s attach socket (`<dir>/qshare.<name>.v<id>`, socket `sock`
 * inside): mount it, at the same path, into that vGPU's container and nowhere else. */
int qs_vgpu_attach_dir(qs_node *node, uint32_t id, char *buf, uint32_t len);

int qs_card_add(qs_node *node, uint32_t index, const char *uuid, uint64_t total_mem);
int qs_card_set_release_delay(qs_node *node, uint32_t index, uint64_t delay_ns);
int qs_card_set_policy(qs_node *node, uint32_t index, uint32_t policy);
int qs_card_stats_get(qs_node *node, uint32_t index, qs_card_stats *out);

/* Sleeper counts of a card, without the owner's own release thread: all 0 when no process
 * waits (a count left raised by a dead process is a leak). */
typedef struct qs_card_sleepers {
    uint32_t gate_sleepers;  /* processes asleep on the gate that need a wake at HP quiet */
    uint32_t policy_waiters; /* processes asleep in a sharing-policy wait */
    uint32_t policy_waiting; /* processes held by the policy, all LP vGPUs of the card */
    uint32_t pad;
} qs_card_sleepers;
int qs_card_sleepers_get(qs_node *node, uint32_t index, qs_card_sleepers *out);

int qs_vgpu_create(qs_node *node, const qs_vgpu_spec *spec);
/* Flags of qs_vgpu_create_flags (any other bit: QS_EINVAL, nothing created). */
#define QS_VGPU_CREATE_SUSPENDED 1u /* suspended before any process can attach to it */
/* qs_vgpu_create with `flags`; 0 is qs_vgpu_create. A vGPU created with
 * QS_VGPU_CREATE_SUSPENDED is marked suspended before it is published to attachers, so no
 * launch passes its gate until qs_vgpu_resume; its creation pushes a suspended event. */
int qs_vgpu_create_flags(qs_node *node, const qs_vgpu_spec *spec, uint32_t flags);
int qs_vgpu_update(qs_node *node, uint32_t id, uint32_t core_share, uint64_t mem_limit);
int qs_vgpu_destroy(qs_node *node, uint32_t id);
int qs_vgpu_suspend(qs_node *node, uint32_t id);
int qs_vgpu_resume(qs_node *node, uint32_t id);
int qs_vgpu_stats_get(qs_node *node, uint32_t id, qs_vgpu_stats *out);

/* Wait up to timeout_ms (-1: forever) for the next event. QS_ETIMEDOUT if none. */
int qs_node_next_event(qs_node *node, qs_event *out, int timeout_ms);
/* Events overwritten before the owner read them. */
uint64_t qs_node_dropped_events(qs_node *node);

/* ---- client side (workload processes) ---- */
typedef struct qs_client qs_client;

typedef struct qs_client_info {
    uint32_t vgpu, card, priority, core_share;
    uint64_t mem_limit;
    uint64_t mem_used;      /* whole vGPU, all processes */
    uint64_t mem_reserved;  /* this process */
    uint64_t card_total_mem;
    char card_uuid[QS_UUID_MAX];
} qs_client_info;

/* Attach this process to vGPU `vgpu_id` of segment `name` (dir as for qs_node_create). */
int qs_client_attach(const char *name, const char *dir, uint32_t vgpu_id, qs_client **out);
/* Detach: returns the process's memory reservations and frees the client. */
int qs_client_detach(qs_client *client);

/* Around each unit of device work. Low priority may block in begin (card busy,
 * vGPU suspended, in-flight bound, policy); high priority never waits. */
int qs_launch_begin(qs_client *client);
int qs_launch_end(qs_client *client);

int qs_mem_reserve(qs_client *client, uint64_t bytes);
int qs_mem_release(qs_client *client, uint64_t bytes);
int qs_client_info_get(qs_client *client, qs_client_info *out);

/* Account device time measured elsewhere (CUDA completion events). */
int qs_account_device_time(qs_client *client, uint64_t ns);

/* Simulated device: one kernel of `duration_ns` — launch_begin, hold the card's
 * execution resource (FIFO among contexts, sleeping) for the duration, account
 * the device time, launch_end. */
int qs_sim_kernel(qs_client *client, uint64_t duration_ns);
/* `count` simulated kernels back to back, each one launch (gated on its own); stops at
 * the first error. Models a process that keeps its queue full, as real launches do. */
int qs_sim_kernels(qs_client *client, uint32_t count, uint64_t duration_ns);
/* Replay a recorded timeline on the simulated card: for each of `count` launches, spend
 * gap_ns[i] on the host, then launch (gated) a kernel of dur_ns[i], booked on the card
 * without waiting for it, as a real launch queues; kernels are ended (and their device
 * time accounted) as the card finishes them. With `window_ns` > 0 a launch first waits
 * while the process's queued work ends that far or more in the future. Returns once all
 * completed; *first_end_ns and *last_end_ns (may be NULL) get the first and last kernel's
 * end. Stops at the first error, having ended what it launched. The vGPU's in-flight bound
 * in launches is lifted for the call (qs_client_set_inflight_cap, restored to 0 after). */
int qs_sim_replay(qs_client *client, const uint64_t *gap_ns, const uint64_t *dur_ns,
                  uint32_t count, uint64_t window_ns, uint64_t *first_end_ns,
                  uint64_t *last_end_ns);
/* qs_sim_replay with the device gate of the CUDA interposer (QSHARE_LP_DEVICE_GATE) modelled:
 * with `slice_ns` > 0 launches are held by the process and booked on the card a slice of
 * device time at a time, each slice only once the card has (nearly) finished the one before
 * and the card's gate reads open; `window_ns` bounds booked plus held work. 0: as qs_sim_replay. */
int qs_sim_replay_gated(qs_client *client, const uint64_t *gap_ns, const uint64_t *dur_ns,
                        uint32_t count, uint64_t window_ns, uint64_t slice_ns,
                        uint64_t *first_end_ns, uint64_t *last_end_ns);

/* Times for the caller's benchmark: CLOCK_MONOTONIC ns at which the last
 * qs_launch_begin of this client stopped blocking (0 if it never blocked). */
uint64_t qs_client_last_unblock_ns(qs_client *client);

/* Tight-loop cost of qs_launch_begin + qs_launch_end, in ns per pair. */
int qs_bench_launch_overhead(qs_client *client, uint64_t iterations, double *ns_per_pair);

/* qs_launch_begin with CLOCK_MONOTONIC read just before and just after it, in C: for a
 * high-priority context on an idle card, the gate is closed by *done_ns. */
int qs_bench_timed_begin(qs_client *client, uint64_t *begin_ns, uint64_t *done_ns);

/* ---- auto release mode (owner side) ---- */
typedef struct qs_release_auto_stats {
    uint32_t enabled;      /* 1 while the card is in auto mode */
    uint32_t pad;
    uint64_t delay_ns;     /* the release delay in force now */
    uint64_t p99_bound_ns; /* as configured */
    uint64_t max_delay_ns; /* as configured */
    uint64_t penalty_ns;   /* estimated wait of a high-priority launch behind low priority */
    uint64_t gaps;         /* gaps between high-priority activity counted so far */
} qs_release_auto_stats;

/* Auto release mode: the owner chooses the card's release delay from the gaps it sees
 * between high-priority bursts, so that high priority's p99 latency grows by at most
 * `p99_bound_ns` while low priority harvests as much of the idle card as that allows; never
 * above `max_delay_ns` (0: QS_DEFAULT_RELEASE_DELAY_NS), which also holds until enough gaps
 * are seen. `enable` 0 returns the card to its fixed delay (qs_card_set_release_delay). */
int qs_card_set_release_auto(qs_node *node, uint32_t index, int enable, uint64_t p99_bound_ns,
                             uint64_t max_delay_ns);
int qs_card_release_auto_get(qs_node *node, uint32_t index, qs_release_auto_stats *out);

/* The auto rule itself, pure functions of what the owner has seen, one for the owner's release
 * thread and for models (`qshare bench model` replays it in simulated time). The owner folds
 * what each period of QS_RELEASE_AUTO_PERIOD_NS added into a history that forgets with a time
 * constant of 2 s, then asks for the penalty and the delay. */
#define QS_RELEASE_AUTO_BUCKETS 40 /* log2 buckets of HP's gaps: b holds [2^b, 2^(b+1)) ns */
#define QS_RELEASE_AUTO_PERIOD_NS 20000000ull
typedef struct qs_release_auto_period { /* what one period added */
    uint64_t gap_count[QS_RELEASE_AUTO_BUCKETS];  /* gaps between HP's activity, by bucket */
    uint64_t gap_sum_ns[QS_RELEASE_AUTO_BUCKETS];
    uint64_t lp_device_ns; /* device time of the LP launches completed */
    uint64_t lp_launches;  /* their number */
} qs_release_auto_period;
typedef struct qs_release_auto_history { /* decayed sums of the periods folded in */
    double gap_count[QS_RELEASE_AUTO_BUCKETS];
    double gap_sum_ns[QS_RELEASE_AUTO_BUCKETS];
    double lp_device_ns, lp_launches; /* their ratio: LP's mean kernel, weighted by launch */
    uint64_t gaps_seen;               /* every gap folded in, never decayed: the warm-up */
} qs_release_auto_history;
/* The bucket of a gap (gaps of 2^40 ns or more go to the last one). */
uint32_t qs_release_auto_bucket(uint64_t gap_ns);
/* Decay `history` by one period and add `period`. QS_EINVAL for a NULL pointer. */
int qs_release_auto_fold(qs_release_auto_history *history, const qs_release_auto_period *period);
/* How long a high-priority launch on a released card waits behind LP's work in flight: the
 * larger of LP's mean kernel and what each of `inflight` launchers may hold (`held_ns`: its
 * window, or one device-gate slice). With no LP launch in the history, `bound_ns` (at least
 * 1) if any LP launcher is attached, else 0. 0 for a NULL history. Saturates at UINT64_MAX. */
uint64_t qs_release_auto_penalty(const qs_release_auto_history *history, uint64_t inflight,
                                 uint64_t held_ns, uint64_t bound_ns);
/* The release delay for the gaps in `history`: `max_delay_ns` until 50 gaps have been seen
 * (ever: at a steady rate the decayed count settles at rate x 2 s, under 50 below 25 gaps a
 * second) or when one exposure costs more than `bound_ns`; otherwise the delay that maximises
 * LP's harvest against HP's loss while a request's exposures stay within the bound
 * (docs/colocation.md). `max_delay_ns` for a NULL history. */
uint64_t qs_release_auto_choose(const qs_release_auto_history *history, uint64_t bound_ns,
                                uint64_t max_delay_ns, uint64_t penalty_ns);

/* ---- low priority's in-flight window ---- */
/* The device time low priority may have submitted and not yet completed on card `index`,
 * per process (1 µs .. QS_MAX_LP_WINDOW_NS); takes effect at the next launch. Launchers that
 * track completion by batch (the CUDA interposer) apply it; read it in qs_card_stats. */
int qs_card_set_lp_window(qs_node *node, uint32_t index, uint64_t window_ns);
/* The window as a launcher applies it now: the card's while a high-priority process is
 * attached to the card, else the larger of it and QS_LP_WINDOW_ALONE_NS. */
uint64_t qs_client_lp_window_ns(qs_client *client);
/* The window rule, one for every launcher (the CUDA interposer, the simulated card's replay
 * and, through the binding, Python): 1 if a low-priority launch may go with `queued_ns` of its
 * process's work submitted and not known complete (estimated device time; 0 when none is in
 * flight: a launch then always goes) under `window_ns`. */
int qs_lp_window_admits(uint64_t queued_ns, uint64_t window_ns);
/* The window in force for a launcher given `window_ns` (qs_client_lp_window_ns): with the
 * device gate on (`device_gate` 1: high priority then waits for a slice, not for the window),
 * at least QS_LP_WINDOW_ALONE_NS. */
uint64_t qs_lp_window_in_force(uint64_t window_ns, int device_gate);
/* The card's gate word, for a device to wait on: a 32-bit value in the shared segment that is
 * QS_GATE_WORD_OPEN exactly while low priority may run (high priority closes it; the release
 * reopens it). Its page can be registered with the GPU so that queued low-priority work
 * waits on it (the CUDA interposer's device gate). NULL for a NULL client. */
#define QS_GATE_WORD_OPEN 0u
const void *qs_client_gate_word(qs_client *client);
/* The card's device gate for low priority (off by default): launchers that can (the CUDA
 * interposer) make their queued work wait on the gate word on the GPU, so that high priority
 * waits for a slice of it rather than the window, and keep the window they have alone. Read
 * by a process when it first launches; QSHARE_LP_DEVICE_GATE overrides it per process. */
int qs_card_set_lp_device_gate(qs_node *node, uint32_t index, int enable);
int qs_client_lp_device_gate(qs_client *client);
/* Keep the card's gate should the owner die: a thread of the client's sleeps in poll() on its
 * attach connection while the owner lives (no cost to anyone), and once the owner's end closes
 * it reopens the gate as the owner's release thread does, once high priority has been quiet
 * for the release delay and never while it is busy, until qs_client_detach stops it. For
 * launchers whose queued work waits on the gate word on the device (the CUDA interposer's
 * device gate), where no host thread may be waiting at the gate to reopen it. Calling it again
 * does nothing. */
int qs_client_keep_gate(qs_client *client);
/* How many times high priority has closed the client's card's gate so far (0 for NULL): a
 * change between two moments says the gate closed in between. */
uint64_t qs_client_hp_episodes(qs_client *client);
/* Replace the vGPU's in-flight bound in launches for this process only (0: the vGPU's): a
 * launcher that bounds its in-flight work in device time itself lifts it. */
int qs_client_set_inflight_cap(qs_client *client, uint32_t max_launches);

#ifdef __cplusplus
}
#endif
#endif

/* internal.h — the node segment's layout and the helpers shared by the driver's
 * translation units. Nothing here is part of the public ABI of qshare.h. */
#ifndef QSHARE_INTERNAL_H
#define QSHARE_INTERNAL_H

#include "qshare.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define QS_CFG_MAGIC 0x3166636572616873ull   /* "sharecf1" */
#define QS_STATE_MAGIC 0x3174736572616873ull /* "sharest1" */
#define QS_CACHELINE 64
#define QS_MASK_WORDS (QS_MAX_CONTEXTS / 64u)
#define QS_GAP_BUCKETS 40u /* log2 buckets of HP gaps, up to 2^40 ns */
_Static_assert(QS_GAP_BUCKETS == QS_RELEASE_AUTO_BUCKETS, "the auto rule's buckets");

enum qs_slot_state { QS_SLOT_FREE = 0, QS_SLOT_ACTIVE = 1, QS_SLOT_DESTROYED = 2 };
enum qs_gate_state { QS_GATE_OPEN = 0, QS_GATE_CLOSED = 1, QS_GATE_RELEASING = 2 };
_Static_assert(QS_GATE_OPEN == QS_GATE_WORD_OPEN, "the public gate word's open value");

/* ---- configuration part: written by the owner only, mapped read-only by clients ---- */
struct qs_cfg_card {
    _Atomic uint32_t present;
    uint32_t index;
    uint64_t total_mem;
    _Atomic uint64_t release_delay_ns;
    _Atomic uint32_t policy;
    uint32_t pad;
    char uuid[QS_UUID_MAX];
    _Atomic uint64_t lp_vgpus[QS_MAX_VGPUS / 64]; /* slots of its low-priority vGPUs */
    /* auto release mode (gate.c): set by qs_card_set_release_auto, the delay by the release thread */
    _Atomic uint32_t release_auto;      /* 1: the delay in force is auto_delay_ns */
    uint32_t pad_auto;
    _Atomic uint64_t auto_bound_ns;     /* high priority's p99 may grow by at most this */
    _Atomic uint64_t auto_max_delay_ns; /* the chosen delay never exceeds this */
    _Atomic uint64_t auto_delay_ns;     /* the delay chosen now */
    _Atomic uint64_t auto_penalty_ns;   /* estimated wait of HP behind LP work in flight */
    _Atomic uint64_t lp_window_ns;      /* LP in-flight device time per process; 0: default */
    _Atomic uint32_t lp_device_gate;    /* 1: LP's queued work waits on the gate word on the GPU */
    uint32_t pad_gate;
};

struct qs_cfg_vgpu {
    _Atomic uint32_t state;     /* enum qs_slot_state; ACTIVE is published last */
    _Atomic uint32_t suspended; /* futex word: clients wait while non-zero */
    uint32_t id, card, priority;
    _Atomic uint32_t core_share;
    _Atomic uint64_t mem_limit;
    uint32_t lp_max_inflight;
    uint32_t pad;
};

struct qs_cfg {
    uint64_t magic;
    uint32_t abi;
    uint32_t header_size;
    uint64_t cfg_size;
    uint64_t state_size;
    char name[QS_NAME_MAX];
    struct qs_cfg_card cards[QS_MAX_CARDS];
    struct qs_cfg_vgpu vgpus[QS_MAX_VGPUS];
};

/* ---- state part: counters and flags that clients update ---- */
struct qs_policy_state {
    _Atomic uint64_t budget_ns;      /* fixed-share: wall time at which its budget runs out */
    _Atomic uint64_t vtime_ns;       /* burst-share: device time used, scaled by 100/share */
    _Atomic uint64_t last_active_ns; /* last launch or completion */
    _Atomic uint32_t waiting;        /* contexts held back by the policy right now */
    uint32_t pad;
};

struct qs_card_state {
    _Alignas(QS_CACHELINE) _Atomic uint32_t gate; /* enum qs_gate_state */
    _Atomic uint32_t wake_seq;                    /* futex: gate waiters sleep here */
    _Atomic uint32_t untimed_sleepers;            /* waiters that need a wake on HP quiet */
    uint32_t pad0;
    _Atomic uint64_t last_hp_ns;
    _Atomic uint64_t busy_since_ns;
    _Atomic uint64_t episodes;
    _Atomic uint64_t hp_mask[QS_MASK_WORDS]; /* contexts of high priority on this card */
    /* simulated card: when the last kernel booked on it ends (simdev.c) */
    _Alignas(QS_CACHELINE) _Atomic uint64_t sim_busy_until_ns;
    _Atomic uint64_t device_ns;
    _Alignas(QS_CACHELINE) _Atomic uint32_t policy_seq; /* futex: policy waiters sleep here */
    _Atomic uint32_t policy_waiters;
    /* burst-share: the least scaled time a peer must reach to release a sleeper (0: none
     * asleep); accounting that reaches it wakes the sleepers (policy.c) */
    _Atomic uint64_t policy_wake_vtime;
    _Atomic uint64_t policy_wakes; /* wake-ups made by accounting, for the stats */
    /* auto release mode: gaps between HP activity, counted by HP launches (gate.c) */
    _Alignas(QS_CACHELINE) _Atomic uint64_t gap_seen_ns; /* last_hp_ns whose gap is counted */
    _Atomic uint64_t gap_count[QS_GAP_BUCKETS];         /* bucket b: gaps in [2^b, 2^(b+1)) ns */
    _Atomic uint64_t gap_sum_ns[QS_GAP_BUCKETS];
};
/* The burst-share words went into the policy line's padding: the segment keeps its layout. */
_Static_assert(offsetof(struct qs_card_state, gap_seen_ns) ==
                   offsetof(struct qs_card_state, policy_seq) + QS_CACHELINE,
               "the policy words fit one cache line");

/* A vGPU's memory count is not here but in its memory part (struct qs_vmem). */
struct qs_vgpu_state {
    _Alignas(QS_CACHELINE) _Atomic uint64_t device_ns;
    _Atomic uint64_t launches; /* of contexts already gone; live ones count in their ctx */
    _Atomic uint32_t contexts;
    uint32_t pad;
    struct qs_policy_state policy;
};

/* A context as its process sees it. The owner never trusts these fields for anything but
 * the process's own counts: it reaps from its private record (struct qs_owner_rec). */
struct qs_ctx {
    _Alignas(QS_CACHELINE) _Atomic uint32_t state; /* enum qs_slot_state (FREE/ACTIVE) */
    int32_t pid;
    uint32_t vgpu_slot, card, priority;
    _Atomic uint32_t generation;    /* of the attach that owns the slot now */
    _Atomic uint32_t inflight;      /* units between launch_begin and launch_end */
    _Atomic uint32_t inflight_waiters;
    _Atomic uint64_t launches;
    /* this context's part of the shared sleeper counts, returned when it is reaped */
    _Atomic uint32_t gate_sleepers;   /* of its card's untimed_sleepers */
    _Atomic uint32_t policy_sleepers; /* of its card's policy_waiters */
    _Atomic uint32_t policy_waiting;  /* of its vGPU's policy.waiting */
    uint32_t pad;
};

#define QS_EVENT_WORDS (sizeof(qs_event) / sizeof(uint64_t))
_Static_assert(sizeof(qs_event) % sizeof(uint64_t) == 0, "an event is whole 64-bit words");

struct qs_ring_slot {
    _Atomic uint64_t seq; /* 2t+1 while writing ticket t, 2t+2 once written */
    _Atomic uint64_t words[QS_EVENT_WORDS]; /* the event, word by word (a seqlock's payload) */
    _Atomic uint64_t check; /* digest of ticket t and the words: a writer taken over for being
                             * slow that wakes and stores into the slot is caught by it */
};

/* Store ticket `t`'s event and its digest into a slot its caller holds (seq odd, 2t+1). */
void qs_ring_slot_store(struct qs_ring_slot *slot, uint64_t t, const qs_event *ev);

struct qs_ring {
    _Alignas(QS_CACHELINE) _Atomic uint64_t head;
    _Atomic uint32_t notify;           /* futex: bumped after a push when someone waits */
    _Atomic uint32_t consumer_waiting;
    _Atomic uint64_t dropped;
    struct qs_ring_slot slots[QS_EVENT_RING_SIZE];
};

struct qs_state {
    uint64_t magic;
    uint32_t abi;
    uint32_t pad;
    uint64_t state_size; /* (ABI 6 kept the segment lock here; it is in the owner part now) */
    struct qs_card_state cards[QS_MAX_CARDS];
    struct qs_vgpu_state vgpus[QS_MAX_VGPUS];
    struct qs_ctx ctxs[QS_MAX_CONTEXTS];
    struct qs_ring ring;
};

/* ---- a vGPU's memory part: a memfd of its own (sealed against shrinking and growing),
 * passed to that vGPU's processes alone. Another vGPU's tenant can neither rewrite its count
 * nor take its lock, which it could while they lived in the state part every tenant maps. */
#define QS_VMEM_MAGIC 0x316d767372616873ull /* "sharsvm1" */

struct qs_vmem {
    uint64_t magic;
    uint32_t abi;
    uint32_t slot; /* the vGPU slot it was made for */
    uint64_t vmem_size;
    uint32_t recount; /* set by the owner's reap: `used` is to be summed again from reserved */
    _Alignas(QS_CACHELINE) pthread_mutex_t lock; /* robust; taken by the vGPU's processes only */
    uint64_t used;                               /* written under lock */
    uint64_t reserved[QS_MAX_CONTEXTS];          /* by context slot; added to under lock */
};
_Static_assert(offsetof(struct qs_vmem, lock) == QS_CACHELINE, "the header fits one line");

/* ---- owner part: a file only the owner can open (0600); never mapped by clients ---- */
#define QS_OWNER_MAGIC 0x3172776f72616873ull /* "sharowr1" */

struct qs_owner_rec {
    _Atomic uint32_t state; /* enum qs_slot_state: ACTIVE while the context is attached */
    int32_t pid;            /* as the owner sees it */
    uint64_t start_time;    /* /proc/<pid>/stat starttime: tells a reused pid apart */
    uint32_t vslot, card, priority, generation, vgpu_id, pad;
};

struct qs_owner {
    uint64_t magic;
    uint32_t abi;
    uint32_t generation; /* last attach generation handed out */
    uint64_t owner_size;
    uint64_t state_ino, state_dev;                  /* identity of the state memfd */
    int32_t owner_pid, pad_owner;                   /* the owner now, and its start time: */
    uint64_t owner_start;                           /* a live owner cannot be adopted from */
    _Atomic uint32_t owner_untimed[QS_MAX_CARDS];    /* release threads' part of untimed_sleepers */
    uint64_t vmem_ino[QS_MAX_VGPUS], vmem_dev[QS_MAX_VGPUS]; /* identity of each memory part */
    /* Robust: serialises the owner's configuration changes. Here, where no tenant maps it:
     * in a part a tenant can write, the tenant can hold it, or write junk into its robust-list
     * links, which glibc follows when the owner unlocks it. */
    _Alignas(QS_CACHELINE) pthread_mutex_t seg_lock;
    struct qs_owner_rec recs[QS_MAX_CONTEXTS];
};

/* Low priority's in-flight window on a card (lp_window.c): the default when unset. */
uint64_t qs_card_lp_window(const struct qs_cfg_card *card);

/* A mapped segment. Clients have cfg (read-only), state and their own vGPU's memory part;
 * only the owner has `owner` and every vGPU's memory part. Made empty by qs_segment_init. */
struct qs_segment {
    struct qs_cfg *cfg;
    struct qs_state *state;
    struct qs_owner *owner;
    int state_fd;  /* the state memfd (clients keep it: an adopting owner finds it there) */
    int cfg_ro_fd; /* owner: a read-only descriptor of the cfg part, passed to clients */
    struct qs_vmem *vmem[QS_MAX_VGPUS]; /* by vGPU slot; NULL where not mapped */
    int vmem_fd[QS_MAX_VGPUS];          /* kept open, like state_fd; -1 where none */
};

/* ---- attach protocol over a vGPU's unix socket ---- */
#define QS_PROTO_MAGIC 0x71736871u
#define QS_EXCHANGE_TIMEOUT_MS 5000 /* every client exchange with the owner has this deadline */
enum qs_proto_op { QS_OP_ATTACH = 1, QS_OP_DETACH = 2 };
struct qs_proto_request {
    uint32_t magic, op, vgpu_id, ctx, generation, pad;
};
/* An ATTACH reply with status QS_OK carries three descriptors (SCM_RIGHTS): the cfg part,
 * read-only, the state memfd and the vGPU's memory part, both sealed against shrinking and
 * growing. */
#define QS_ATTACH_FDS 3
struct qs_proto_reply {
    int32_t status;
    uint32_t ctx, vgpu_slot, generation;
    char message[160];
};

/* Public entry points refuse a NULL handle or out-pointer with a clear error. */
#define QS_REQUIRE(ptr, what)                                      \
    do {                                                           \
        if (!(ptr))                                                \
            return qs_fail(QS_EINVAL, "%s is NULL", (what));       \
    } while (0)

/* error.c */
int qs_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int qs_fail_errno(const char *what);
void qs_clear_error(void);

static inline void qs_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* The first set bit at or after `from` in an array of `words` atomic 64-bit masks, or -1.
 * Iterate: for (int i = qs_mask_next(m, n, 0); i >= 0; i = qs_mask_next(m, n, i + 1)). */
static inline int qs_mask_next(const _Atomic uint64_t *mask, uint32_t words, uint32_t from)
{
    for (uint32_t w = from / 64; w < words; w++) {
        uint64_t bits = atomic_load(&mask[w]);
        if (w == from / 64)
            bits &= ~0ull << (from % 64);
        if (bits)
            return (int)(w * 64 + (uint32_t)__builtin_ctzll(bits));
    }
    return -1;
}

/* Counts a sleeper in a shared count and in the context's own part of it. The order makes a
 * death between the two steps leave a surplus (one spare wake), never a deficit. */
static inline void qs_count_in(_Atomic uint32_t *mine, _Atomic uint32_t *shared)
{
    atomic_fetch_add(shared, 1);
    if (mine)
        atomic_fetch_add(mine, 1);
}

static inline void qs_count_out(_Atomic uint32_t *mine, _Atomic uint32_t *shared)
{
    if (mine)
        atomic_fetch_sub(mine, 1);
    atomic_fetch_sub(shared, 1);
}

/* Owner: take back a dead context's part (`*mine`, however corrupt) from `shared`, never
 * below zero. */
static inline void qs_count_return(_Atomic uint32_t *mine, _Atomic uint32_t *shared)
{
    uint32_t part = atomic_exchange(mine, 0), cur = atomic_load(shared);
    while (part && !atomic_compare_exchange_weak(shared, &cur, cur - (part < cur ? part : cur))) {
    }
}

/* futex.c */
int qs_futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t deadline_ns);
void qs_futex_wake(_Atomic uint32_t *word, int count);
void qs_atomic_max(_Atomic uint64_t *word, uint64_t value);

/* lock.c */
int qs_robust_init(pthread_mutex_t *m);
/* Lock; if the previous holder died, run `recover(arg)` before marking it consistent. */
int qs_robust_lock(pthread_mutex_t *m, void (*recover)(void *), void *arg);
void qs_robust_unlock(pthread_mutex_t *m);

/* segment.c */
void qs_segment_init(struct qs_segment *seg); /* nothing mapped, no descriptor */
int qs_check_name(const char *name);
int qs_segment_path(char *buf, size_t len, const char *dir, const char *name, const char *suffix);
int qs_segment_create(const char *dir, const char *name, int replace, struct qs_segment *seg);
/* Owner: open the cfg and owner parts of an existing segment (adopt); the state is found apart. */
int qs_segment_open_owner(const char *dir, const char *name, struct qs_segment *seg);
/* A memfd of `size` zero bytes, sealed against shrinking and growing, mapped read-write. */
int qs_memfd_sealed(const char *label, size_t size, int *fd, void **map);
/* The inode and device of descriptor `fd` (how an adopting owner recognises a memfd). */
int qs_fd_identity(int fd, uint64_t *ino, uint64_t *dev);
/* A part's type, magic, ABI version and size, checked before it is mapped. */
int qs_check_part(int fd, const char *what, uint64_t magic, size_t size);
/* A new state part (memfd, sealed), recorded in the owner part. */
int qs_segment_new_state(const char *name, struct qs_segment *seg);
/* Map a state memfd after checking it is one of this ABI; takes over `fd` on success. */
int qs_segment_map_state(int fd, struct qs_segment *seg);
/* Client: map the descriptors the owner passed (cfg, state, vGPU slot `vslot`'s memory
 * part); takes them all over on success. */
int qs_segment_map_client(const int fds[QS_ATTACH_FDS], uint32_t vslot, struct qs_segment *seg);
void qs_segment_unmap(struct qs_segment *seg);
/* The per-vGPU attach directory and socket of segment `name`. */
int qs_vgpu_dir_path(char *buf, size_t len, const char *dir, const char *name, uint32_t id);
int qs_vgpu_sock_path(char *buf, size_t len, const char *dir, const char *name, uint32_t id);
void qs_segment_unlink(const char *dir, const char *name);
const char *qs_default_dir(const char *dir);
int qs_find_vgpu(const struct qs_cfg *cfg, uint32_t id); /* slot of the ACTIVE vGPU, or -1 */

/* ring.c */
void qs_ring_push(struct qs_ring *ring, uint32_t kind, uint32_t card, uint32_t vgpu, int32_t pid,
                  uint64_t value);
/* The consumer's place in the ring (there is one consumer: the owner). */
struct qs_ring_cursor {
    uint64_t tail;          /* the next ticket to read */
    uint64_t torn_since_ns; /* when ticket `tail` was first found half-written; 0 if not */
};
int qs_ring_pop(struct qs_ring *ring, struct qs_ring_cursor *cur, qs_event *out, int timeout_ms);

/* gate.c */
void qs_gate_hp_begin(struct qs_segment *seg, uint32_t card);
void qs_gate_hp_end(struct qs_card_state *cs);
/* Block until the gate of `card` is open; returns 1 if it blocked. `stop` ends the wait early.
 * `mine` is the waiter's own part of the card's untimed_sleepers. */
int qs_gate_wait(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop,
                 _Atomic uint32_t *mine);
/* Owner's release loop for one card (runs until *stop). */
void qs_gate_release_loop(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop);
void qs_gate_forget_hp(struct qs_segment *seg, uint32_t card, uint32_t ctx);
/* A client's stand-in for a dead owner's release loop (runs until *stop); `mine` is the
 * client context's part of the card's untimed_sleepers. */
void qs_gate_keep_loop(struct qs_segment *seg, uint32_t card, _Atomic uint32_t *stop,
                       _Atomic uint32_t *mine);
/* Wake every gate sleeper of `card` (one that is stopping looks at its flag). */
void qs_gate_wake_all(struct qs_segment *seg, uint32_t card);

/* keeper.c: a client's thread that keeps the card's gate once the owner is gone */
struct qs_keeper;
/* Start it for the client whose attach connection is `sock` (-1: none, the owner is gone). */
int qs_keeper_start(struct qs_segment *seg, uint32_t card, int sock, _Atomic uint32_t *mine,
                    struct qs_keeper **out);
/* Stop and free it; only the process that started it has its thread to join. */
void qs_keeper_stop(struct qs_keeper *keeper);

/* vmem.c: each vGPU's memory part */
/* Owner: a new memory part for vGPU slot `slot` (any old one of the slot is dropped). */
int qs_vmem_new(struct qs_segment *seg, const char *name, uint32_t slot);
/* Map memory part `fd` as slot `slot`'s after checking it; takes `fd` over on success. */
int qs_vmem_map(struct qs_segment *seg, uint32_t slot, int fd);
void qs_vmem_drop(struct qs_segment *seg, uint32_t slot);
/* Adopt: write slot `slot`'s header into its own part `fd` again (a tenant rewrote it). */
int qs_vmem_restore_header(int fd, uint32_t slot);

/* memory.c */
void qs_mem_recover(void *vgpu_state_and_slot);
/* Owner: return all that context `ctx` of vGPU slot `vslot` reserved; the amount returned. */
uint64_t qs_mem_reap(struct qs_segment *seg, uint32_t ctx, uint32_t vslot);
/* Client: `vslot` and `generation` are the handle's own; a context reaped since is refused. */
struct qs_ctx_ref {
    uint32_t ctx, vslot, generation;
};
int qs_mem_reserve_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes);
int qs_mem_release_ctx(struct qs_segment *seg, struct qs_ctx_ref ref, uint64_t bytes);
/* A vGPU's memory in use, and one context's reservations (0 where the part is not mapped). */
uint64_t qs_mem_used(struct qs_segment *seg, uint32_t vslot);
uint64_t qs_mem_reserved(struct qs_segment *seg, uint32_t vslot, uint32_t ctx);

/* simdev.c */
/* Book `card` for a kernel of `duration_ns` after every kernel booked before; its start. */
uint64_t qs_sim_book(struct qs_segment *seg, uint32_t card, uint64_t duration_ns);
/* The client's segment and card (for the simulated card's replay, simdev.c). */
struct qs_segment *qs_client_segment(qs_client *cl, uint32_t *card);

/* vgpu.c: launches of a vGPU, its live contexts' and its departed ones' */
uint64_t qs_vgpu_launches(struct qs_segment *seg, uint32_t slot);

/* policy.c */
int qs_policy_begin(struct qs_segment *seg, uint32_t ctx, uint32_t card, uint32_t vslot);
void qs_policy_account(struct qs_segment *seg, uint32_t vslot, uint64_t ns);
void qs_policy_changed(struct qs_segment *seg, uint32_t card);
void qs_policy_membership(struct qs_segment *seg, uint32_t vslot, int member);

/* Recovery context for a vGPU's memory lock. */
struct qs_mem_recovery {
    struct qs_segment *seg;
    uint32_t vslot;
};

#endif

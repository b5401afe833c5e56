/* session.c — the process's attachment to its vGPU. The identity comes from the
 * environment that `qshare run` sets (QSHARE_VGPU or QSHARE_VGPU_<ID>, QSHARE_SEGMENT,
 * QSHARE_SHM_DIR; vgpu_set.c); limits and priority come from the segment. With one vGPU the
 * process attaches at its first CUDA call; with several (one per card of a container), at the
 * first call that needs one, to the vGPU of the card that call's context is on (qsc_bind). A process that cannot attach gets a
 * clear message and an error from every interposed call, never an unlimited GPU.
 * A normal exit detaches (the owner records a detach, not a death): see detach_at_exit. */
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_uuid.h"
#include "internal.h"
#include "interposer.h"

#define QSC_DEFAULT_SEGMENT "qshare"
#define QSC_DRAIN_NS 250000000ull /* at exit, how long calls in progress are waited for */

static qsc_session session;
static qsc_session detached; /* what qsc_enter returns once the process detaches */
/* Several vGPUs, none bound yet; the same when a call found no context to bind by. */
static const qsc_session unbound = {.failure = CUDA_ERROR_INVALID_CONTEXT, .deferred = 1};
/* Several vGPUs, and the call's card is in no entry: refused, and bound to nothing. */
static const qsc_session unserved = {.failure = CUDA_ERROR_NOT_PERMITTED, .deferred = 1};
static qsc_vgpu_set vgpus; /* read once, at attach */
static pthread_once_t attach_once = PTHREAD_ONCE_INIT;
/* `session` once attached (or failed to), `unbound` while several vGPUs wait for a bind. */
static _Atomic(const qsc_session *) published;
static _Alignas(64) _Atomic uint32_t users; /* calls between qsc_enter and qsc_leave; futex */
static _Atomic uint32_t closing;            /* the process has begun to detach */
static atomic_int warned[QSC_WARN_COUNT];

void qsc_warn_once(int key, const char *fmt, ...) {
    if (key < 0 || key >= QSC_WARN_COUNT || atomic_exchange(&warned[key], 1)) return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "qshare: %s\n", text);
}

int qsc_start_thread(void *(*main)(void *), void *arg, const char *what) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &attr, main, arg);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        qsc_warn_once(QSC_WARN_RING, "cannot start %s", what);
    return rc;
}

/* The driver's default mode for a thread is global: while any other thread captures a graph in
 * global mode (the default for captures too), this thread's waits on events are refused and
 * invalidate that capture, so the program's capture would fail because of the interposer's
 * completion threads. Thread-local mode leaves other threads' captures out of it (as CUDA
 * libraries do for their own watchdog threads); these threads never capture. */
void qsc_thread_ignores_captures(void) { qsc_capture_mode(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL); }

CUstreamCaptureMode qsc_capture_mode(CUstreamCaptureMode mode) {
    typedef CUresult (*exchange_fn)(CUstreamCaptureMode *);
    exchange_fn exchange = QSC_REAL(exchange_fn, cuThreadExchangeStreamCaptureMode);
    if (exchange != NULL) exchange(&mode);
    return mode;
}

CUresult qsc_cu_status(int status) {
    switch (status) {
    case QS_OK: return CUDA_SUCCESS;
    case QS_ENOMEM: return CUDA_ERROR_OUT_OF_MEMORY;
    case QS_EINVAL: return CUDA_ERROR_INVALID_VALUE;
    default: return CUDA_ERROR_NOT_PERMITTED;
    }
}

/* A child forked after attach keeps the parent's client (its launches are the vGPU's), but
 * none of the parent's launches in flight: only the parent's threads can see those complete,
 * so a child that waited on them (the LP window, a full ring) would wait for good. */
static void forget_parents_units(void) {
    qsc_units_forked();
    qsc_hp_forked();
    qsc_lp_forked();
    qsc_captures_forked();
}

/* 1 when the segment puts the vGPU on the card its entry names (or the entry names none). */
static int on_named_card(const qsc_vgpu_entry *e, const qs_client_info *info) {
    char bytes[16];
    if (!e->has_card || (qsc_uuid_parse(info->card_uuid, bytes) && memcmp(bytes, e->bytes, 16) == 0))
        return 1;
    qsc_warn_once(QSC_WARN_ATTACH, "%s puts vGPU %u on card %s, but the node has it on %s. CUDA "
                  "calls will fail with CUDA_ERROR_NOT_INITIALIZED", e->var, e->id, e->uuid,
                  info->card_uuid);
    return 0;
}

/* Fill `session` from an attached client. */
static void take_client(qs_client *client, const qs_client_info *info, uint32_t vgpu) {
    session.low_priority = info->priority == QS_PRIO_LOW;
    /* Low priority's work in flight is bounded in device time here (lp_batch.c), not in
     * launches by the driver. */
    if (session.low_priority) qs_client_set_inflight_cap(client, QSC_LP_MAX_INFLIGHT);
    memcpy(session.card_uuid, info->card_uuid, sizeof session.card_uuid);
    session.card_uuid[QS_UUID_MAX - 1] = '\0';
    char bytes[16];
    session.card_uuid_valid = qsc_uuid_parse(session.card_uuid, bytes);
    session.pid = (int)getpid();
    session.vgpu = vgpu;
    pthread_atfork(NULL, NULL, forget_parents_units);
    detached = session;
    detached.failure = CUDA_ERROR_DEINITIALIZED;
    session.client = client;
    session.failure = CUDA_SUCCESS;
}

/* Attach `session` to the vGPU of entry `e`; on failure it stays failed (NOT_INITIALIZED). */
static void attach_to(const qsc_vgpu_entry *e) {
    const char *segment = getenv("QSHARE_SEGMENT");
    if (segment == NULL || *segment == '\0') segment = QSC_DEFAULT_SEGMENT;
    qs_client *client = NULL;
    int rc = qs_client_attach(segment, NULL, e->id, &client);
    qs_client_info info;
    if (rc == QS_OK) rc = qs_client_info_get(client, &info);
    if (rc != QS_OK)
        qsc_warn_once(QSC_WARN_ATTACH,
                      "cannot attach to vGPU %u of segment '%s': %s (%s). CUDA calls will fail "
                      "with CUDA_ERROR_NOT_INITIALIZED",
                      e->id, segment, qs_strerror(rc), qs_last_error());
    if (rc == QS_OK && on_named_card(e, &info)) {
        take_client(client, &info, e->id);
        return;
    }
    if (client != NULL) qs_client_detach(client);
}

static void attach(void) {
    session.failure = CUDA_ERROR_NOT_INITIALIZED;
    qsc_stats_init();
    if (qsc_real_table[QSC_cuInit] != NULL && qsc_vgpu_set_read(environ, &vgpus)) {
        if (vgpus.n > 1) {
            atomic_store_explicit(&published, &unbound, memory_order_release);
            return;
        }
        attach_to(&vgpus.entries[0]);
    }
    atomic_store_explicit(&published, &session, memory_order_release);
}

const qsc_session *qsc_session_get(void) {
    const qsc_session *s = atomic_load_explicit(&published, memory_order_acquire);
    if (s != NULL) return s;
    qsc_resolve();
    pthread_once(&attach_once, attach);
    return atomic_load_explicit(&published, memory_order_acquire);
}

/* The Dekker pair with detach_at_exit: raise `users`, then read `closing`; it raises
 * `closing`, then reads `users`. So either this call sees the detach coming, or the detach
 * waits for this call. */
const qsc_session *qsc_enter_on(CUstream stream) {
    const qsc_session *s = qsc_session_get();
    if (s->client == NULL) {
        if (!s->deferred) return s;
        s = qsc_bind(stream);
        if (s->client == NULL) return s;
    }
    atomic_fetch_add(&users, 1);
    if (!atomic_load(&closing)) return s;
    qsc_leave(s);
    return &detached;
}

const qsc_session *qsc_enter(void) { return qsc_enter_on(NULL); }

void qsc_leave(const qsc_session *s) {
    if (s->client == NULL) return;
    if (atomic_fetch_sub(&users, 1) == 1 && atomic_load(&closing)) qs_futex_wake(&users, INT_MAX);
}

/* Wait, at most QSC_DRAIN_NS, until no call uses the client. 1 when none does. */
static int drained(void) {
    uint64_t deadline = qs_now_ns() + QSC_DRAIN_NS;
    for (;;) {
        uint32_t n = atomic_load(&users);
        if (n == 0) return 1;
        if (qs_futex_wait(&users, n, deadline) == QS_ETIMEDOUT) return atomic_load(&users) == 0;
    }
}

/* Low priority's launches that no completion thread has seen end (still queued on the card,
 * or completed and not yet seen) are charged to the vGPU at their estimate before the detach
 * reclaims them: the policies would never see their device time otherwise. Called once no call
 * uses the client, so the completion threads have charged all they will. */
static void charge_unended(void) {
    if (!session.low_priority) return;
    uint64_t ns = qsc_lp_unended_ns() + qsc_units_unended() * qsc_lp_estimate_ns();
    if (ns != 0) qs_account_device_time(session.client, ns);
}

/* A normal exit (return from main, exit(), or unloading the library) detaches. A destructor,
 * not atexit: it runs after the program's own exit handlers (the CUDA runtime's teardown
 * still frees through the interposer) and once only. Calls that other threads have in
 * progress are waited for, briefly; one still running (say, held at the gate) makes the exit
 * a death, as a crash or SIGKILL is: the owner reaps the context when the process is gone.
 * A fork's copy only drops itself (qs_client_detach knows the attaching pid). */
__attribute__((destructor)) static void detach_at_exit(void) {
    if (atomic_load(&published) != &session || session.client == NULL ||
        atomic_exchange(&closing, 1))
        return;
    if (session.pid == (int)getpid() && !drained()) {
        qsc_warn_once(QSC_WARN_EXIT, "exiting while another thread is in a CUDA call; the node "
                                     "records this exit as the process's death");
        return;
    }
    if (session.pid == (int)getpid()) charge_unended(); /* after the drain, which a child skips */
    int rc = qs_client_detach(session.client);
    if (rc != QS_OK)
        qsc_warn_once(QSC_WARN_EXIT, "detaching at exit failed: %s (%s)", qs_strerror(rc),
                      qs_last_error());
}

/* Several vGPUs: the entry of the card `stream`'s context (else the current one) is on, or -1
 * with the session that says why not (no context; a card in no entry, warned about once). */
static int entry_for(CUstream stream, const qsc_session **why) {
    CUdevice dev = 0;
    char bytes[16], text[QSC_UUID_TEXT_LEN] = "its UUID unreadable", set[512];
    *why = &unbound;
    if (qsc_work_device(stream, &dev) != CUDA_SUCCESS) return -1;
    int readable = qsc_device_uuid(dev, bytes);
    int i = readable ? qsc_vgpu_set_find(&vgpus, bytes) : -1;
    if (i >= 0) return i;
    if (readable) qsc_uuid_format(bytes, text);
    qsc_vgpu_set_describe(&vgpus, set, sizeof set);
    qsc_warn_once(QSC_WARN_UNSERVED, "device %d (%s) is on none of this process's vGPUs (%s): "
                  "its CUDA calls are refused with CUDA_ERROR_NOT_PERMITTED", (int)dev, text, set);
    *why = &unserved;
    return -1;
}

const qsc_session *qsc_bind(CUstream stream) {
    static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
    const qsc_session *why = NULL;
    int i = entry_for(stream, &why);
    if (i < 0) return why;
    pthread_mutex_lock(&bind_lock);
    if (atomic_load(&published) == &unbound) {
        session.multi = 1;
        attach_to(&vgpus.entries[i]);
        atomic_store_explicit(&published, &session, memory_order_release);
    }
    pthread_mutex_unlock(&bind_lock);
    return atomic_load_explicit(&published, memory_order_acquire);
}

/* Several vGPUs: the driver is initialized now, and the vGPU chosen at the first call that
 * needs one. */
QSC_EXPORT CUresult cuInit(unsigned int flags) {
    const qsc_session *s = qsc_session_get();
    if (s->client == NULL && !s->deferred) return s->failure;
    typedef CUresult (*init_fn)(unsigned int);
    init_fn real = QSC_REAL(init_fn, cuInit);
    return real != NULL ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
}

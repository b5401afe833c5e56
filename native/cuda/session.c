/* session.c — the process's attachment to its vGPU. The identity comes from the
 * environment that `qshare run` sets (QSHARE_VGPU, QSHARE_SEGMENT, QSHARE_SHM_DIR);
 * limits and priority come from the segment. A process that cannot attach gets a
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
#define QSC_MAX_DEVICES 64
#define QSC_DRAIN_NS 250000000ull /* at exit, how long calls in progress are waited for */

static qsc_session session;
static qsc_session detached; /* what qsc_enter returns once the process detaches */
static pthread_once_t attach_once = PTHREAD_ONCE_INIT;
static atomic_int attached;
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

/* QSHARE_VGPU as a vGPU id; 0 with a message on failure. */
static int parse_vgpu(const char *text, uint32_t *out) {
    if (text == NULL || *text == '\0') {
        qsc_warn_once(QSC_WARN_ATTACH,
                      "QSHARE_VGPU is not set; start the program with `qshare run --vgpu ID -- CMD`."
                      " CUDA calls will fail with CUDA_ERROR_NOT_INITIALIZED");
        return 0;
    }
    unsigned long v = 0;
    if (!qsc_parse_whole(text, UINT32_MAX, &v)) {
        qsc_warn_once(QSC_WARN_ATTACH,
                      "QSHARE_VGPU=%s is not a vGPU id. CUDA calls will fail with "
                      "CUDA_ERROR_NOT_INITIALIZED",
                      text);
        return 0;
    }
    *out = (uint32_t)v;
    return 1;
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

static void attach(void) {
    session.failure = CUDA_ERROR_NOT_INITIALIZED;
    qsc_stats_init();
    if (qsc_real_table[QSC_cuInit] == NULL) return; /* no driver: real.c said why */
    uint32_t vgpu;
    if (!parse_vgpu(getenv("QSHARE_VGPU"), &vgpu)) return;
    const char *segment = getenv("QSHARE_SEGMENT");
    if (segment == NULL || *segment == '\0') segment = QSC_DEFAULT_SEGMENT;
    qs_client *client = NULL;
    int rc = qs_client_attach(segment, NULL, vgpu, &client);
    qs_client_info info;
    if (rc == QS_OK) rc = qs_client_info_get(client, &info);
    if (rc != QS_OK) {
        qsc_warn_once(QSC_WARN_ATTACH,
                      "cannot attach to vGPU %u of segment '%s': %s (%s). CUDA calls will fail "
                      "with CUDA_ERROR_NOT_INITIALIZED",
                      vgpu, segment, qs_strerror(rc), qs_last_error());
        if (client != NULL) qs_client_detach(client);
        return;
    }
    session.low_priority = info.priority == QS_PRIO_LOW;
    /* Low priority's work in flight is bounded in device time here (lp_batch.c), not in
     * launches by the driver. */
    if (session.low_priority) qs_client_set_inflight_cap(client, QSC_LP_MAX_INFLIGHT);
    memcpy(session.card_uuid, info.card_uuid, sizeof session.card_uuid);
    session.card_uuid[QS_UUID_MAX - 1] = '\0';
    char bytes[16];
    session.card_uuid_valid = qsc_uuid_parse(session.card_uuid, bytes);
    session.pid = (int)getpid();
    pthread_atfork(NULL, NULL, forget_parents_units);
    detached = session;
    detached.failure = CUDA_ERROR_DEINITIALIZED;
    session.client = client;
    session.failure = CUDA_SUCCESS;
}

const qsc_session *qsc_session_get(void) {
    if (atomic_load_explicit(&attached, memory_order_acquire)) return &session;
    qsc_resolve();
    pthread_once(&attach_once, attach);
    atomic_store_explicit(&attached, 1, memory_order_release);
    return &session;
}

/* The Dekker pair with detach_at_exit: raise `users`, then read `closing`; it raises
 * `closing`, then reads `users`. So either this call sees the detach coming, or the detach
 * waits for this call. */
const qsc_session *qsc_enter(void) {
    const qsc_session *s = qsc_session_get();
    if (s->client == NULL) return s;
    atomic_fetch_add(&users, 1);
    if (!atomic_load(&closing)) return s;
    qsc_leave(s);
    return &detached;
}

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
    if (!atomic_load(&attached) || session.client == NULL || atomic_exchange(&closing, 1)) return;
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

/* Per device ordinal: 0 unknown, 1 the card, 2 another card. */
static atomic_int device_match[QSC_MAX_DEVICES];

int qsc_device_is_card(CUdevice dev) {
    const qsc_session *s = qsc_session_get();
    if (!s->card_uuid_valid || dev < 0 || dev >= QSC_MAX_DEVICES) return 1;
    int known = atomic_load(&device_match[dev]);
    if (known != 0) return known == 1;
    qsc_device_get_uuid_fn get_uuid = QSC_REAL(qsc_device_get_uuid_fn, cuDeviceGetUuid);
    CUuuid uuid;
    if (get_uuid == NULL || get_uuid(&uuid, dev) != CUDA_SUCCESS) return 1;
    char text[QSC_UUID_TEXT_LEN];
    qsc_uuid_format(uuid.bytes, text);
    int mine = strcmp(text, s->card_uuid) == 0;
    atomic_store(&device_match[dev], mine ? 1 : 2);
    return mine;
}

QSC_EXPORT CUresult cuInit(unsigned int flags) {
    const qsc_session *s = qsc_session_get();
    if (s->client == NULL) return s->failure;
    typedef CUresult (*init_fn)(unsigned int);
    init_fn real = QSC_REAL(init_fn, cuInit);
    return real != NULL ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
}

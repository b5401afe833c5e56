/* session.c — the process's attachment to its vGPU. The identity comes from the
 * environment that `qshare run` sets (QSHARE_VGPU, QSHARE_SEGMENT, QSHARE_SHM_DIR);
 * limits and priority come from the segment. A process that cannot attach gets a
 * clear message and an error from every interposed call, never an unlimited GPU. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_uuid.h"
#include "interposer.h"

#define QSC_DEFAULT_SEGMENT "qshare"
#define QSC_MAX_DEVICES 64

static qsc_session session;
static pthread_once_t attach_once = PTHREAD_ONCE_INIT;
static atomic_int attached;
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
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v > UINT32_MAX) {
        qsc_warn_once(QSC_WARN_ATTACH,
                      "QSHARE_VGPU=%s is not a vGPU id. CUDA calls will fail with "
                      "CUDA_ERROR_NOT_INITIALIZED",
                      text);
        return 0;
    }
    *out = (uint32_t)v;
    return 1;
}

static void attach(void) {
    session.failure = CUDA_ERROR_NOT_INITIALIZED;
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

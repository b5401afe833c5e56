/* card.c — which card a context or device is: the vGPU's card, told by UUID (cached per device
 * ordinal), and for a process bound out of several vGPUs, whether work in a context may go
 * to the vGPU (cached per thread by context). */
#include <stdatomic.h>
#include <string.h>

#include "gpu_uuid.h"
#include "interposer.h"

#define QSC_MAX_DEVICES 64
#define SEEN_CONTEXTS 4 /* contexts a thread's verdicts are kept for */

static CUcontext current_context(void) {
    CUcontext ctx = NULL;
    QSC_REAL(qsc_ctx_get_current_fn, cuCtxGetCurrent)(&ctx);
    return ctx;
}

CUresult qsc_ctx_device(CUcontext ctx, CUdevice *dev) {
    qsc_ctx_set_current_fn set = QSC_REAL(qsc_ctx_set_current_fn, cuCtxSetCurrent);
    qsc_ctx_get_device_fn get = QSC_REAL(qsc_ctx_get_device_fn, cuCtxGetDevice);
    CUcontext was = current_context();
    CUresult rc = was == ctx ? CUDA_SUCCESS : set(ctx);
    if (rc == CUDA_SUCCESS) rc = get(dev);
    if (was != ctx) set(was);
    return rc;
}

CUresult qsc_work_device(CUstream stream, CUdevice *dev) {
    CUcontext ctx = qsc_stream_context(stream, current_context());
    return ctx != NULL ? qsc_ctx_device(ctx, dev) : CUDA_ERROR_INVALID_CONTEXT;
}

int qsc_device_uuid(CUdevice dev, char bytes[16]) {
    qsc_device_get_uuid_fn get_uuid = QSC_REAL(qsc_device_get_uuid_fn, cuDeviceGetUuid);
    CUuuid uuid;
    if (get_uuid == NULL || get_uuid(&uuid, dev) != CUDA_SUCCESS) return 0;
    memcpy(bytes, uuid.bytes, 16);
    return 1;
}

/* Per device ordinal: 0 unknown, 1 the card, 2 another card. */
static atomic_int device_match[QSC_MAX_DEVICES];

int qsc_device_is_card(CUdevice dev) {
    const qsc_session *s = qsc_session_get();
    if (!s->card_uuid_valid || dev < 0 || dev >= QSC_MAX_DEVICES) return 1;
    int known = atomic_load(&device_match[dev]);
    if (known != 0) return known == 1;
    char bytes[16], text[QSC_UUID_TEXT_LEN];
    if (!qsc_device_uuid(dev, bytes)) return 1;
    qsc_uuid_format(bytes, text);
    int mine = strcmp(text, s->card_uuid) == 0;
    atomic_store(&device_match[dev], mine ? 1 : 2);
    return mine;
}

/* Whether work in `ctx` may go to the bound vGPU; warns (once) when not. */
static int judge(const qsc_session *s, CUcontext ctx) {
    CUdevice dev = 0;
    if (qsc_ctx_device(ctx, &dev) != CUDA_SUCCESS || qsc_device_is_card(dev)) return 1;
    char bytes[16], text[QSC_UUID_TEXT_LEN] = "its UUID unreadable";
    if (qsc_device_uuid(dev, bytes)) qsc_uuid_format(bytes, text);
    qsc_warn_once(QSC_WARN_OTHER_CARD,
                  "this process is served by vGPU %u on card %s; its work on device %d (%s) is "
                  "refused with CUDA_ERROR_NOT_PERMITTED: qshare serves one card per process "
                  "(run one process per card, as torchrun does)",
                  s->vgpu, s->card_uuid, (int)dev, text);
    return 0;
}

typedef struct seen_context {
    CUcontext ctx;
    uint64_t epoch; /* qsc_ctx_epoch when judged: a destroyed context's handle is judged anew */
    int ok;
} seen_context;

static _Thread_local seen_context seen[SEEN_CONTEXTS];
static _Thread_local unsigned seen_next;

int qsc_ctx_on_card(const qsc_session *s, CUcontext ctx) {
    if (ctx == NULL) return 1;
    uint64_t epoch = qsc_ctx_epoch(ctx);
    for (unsigned i = 0; i < SEEN_CONTEXTS; i++)
        if (seen[i].ctx == ctx && seen[i].epoch == epoch) return seen[i].ok;
    int ok = judge(s, ctx);
    seen[seen_next++ % SEEN_CONTEXTS] = (seen_context){ctx, epoch, ok};
    return ok;
}

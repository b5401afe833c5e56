/* lp_device_gate.c — low priority's queued work waits for the gate on the device, opt-in
 * (per card, qs_card_set_lp_device_gate; per process, QSHARE_LP_DEVICE_GATE=0|1). The card's gate word (qs_client_gate_word) lives in the node's
 * shared segment; its page is registered with the GPU, and after every slice of estimated
 * device time the launching thread enqueues into the tracked stream a wait for that word to
 * read open, in each stream the process's launches are batched in (each counts its own
 * slices). When high priority closes the gate, the card finishes the slice each stream is in and
 * holds the rest of the queues; when the release reopens it, the queue resumes on the card
 * with no host round trip. So high priority waits for about one slice while low priority
 * keeps the deep queue it has alone (lp_batch.c widens the window). Should the owner, whose
 * release thread reopens the gate, die while it is closed, the process's gate keeper
 * (qs_client_keep_gate) reopens it instead. Off, or where the driver
 * refuses the registration, the window alone bounds what high priority waits for. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interposer.h"

#define SLICE_NS QS_LP_DEVICE_GATE_SLICE_NS /* device time between two waits on the word */

typedef CUresult (*register_fn)(void *, size_t, unsigned int);
typedef CUresult (*device_pointer_fn)(CUdeviceptr *, void *, unsigned int);
typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, uint32_t, unsigned int);

static struct {
    _Atomic int on;
    CUdeviceptr word;
} dg;

static pthread_once_t bind_once = PTHREAD_ONCE_INIT;
static qs_client *binding_client;

/* The card's setting (qs_client_lp_device_gate), unless QSHARE_LP_DEVICE_GATE says 0 (off) or
 * 1 (on) for this process; anything else is named in a warning and the card's setting holds. */
static int wanted(qs_client *client) {
    const char *text = getenv("QSHARE_LP_DEVICE_GATE");
    if (text != NULL && strcmp(text, "0") == 0) return 0;
    if (text != NULL && strcmp(text, "1") == 0) return 1;
    if (text != NULL && *text != '\0')
        qsc_warn_once(QSC_WARN_CONFIG, "QSHARE_LP_DEVICE_GATE='%s' is neither 0 nor 1; the "
                                       "card's setting holds", text);
    return qs_client_lp_device_gate(client);
}

static void refuse(const char *what, CUresult rc) {
    qsc_warn_once(QSC_WARN_DRIVER, "the low-priority device gate is off: %s failed (CUDA error "
                                   "%d); the window alone bounds what high priority waits for",
                  what, (int)rc);
}

/* Register the page holding the gate word and find the word's device address. */
static void bind_word(void) {
    if (!wanted(binding_client)) return;
    register_fn reg = QSC_REAL(register_fn, cuMemHostRegister_v2);
    device_pointer_fn map = QSC_REAL(device_pointer_fn, cuMemHostGetDevicePointer_v2);
    if (reg == NULL || map == NULL || QSC_REAL(wait_value_fn, cuStreamWaitValue32_v2) == NULL) {
        refuse("finding the driver's stream memory operations", CUDA_ERROR_NOT_SUPPORTED);
        return;
    }
    void *word = (void *)(uintptr_t)qs_client_gate_word(binding_client);
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    void *page = (void *)((uintptr_t)word & ~(page_size - 1));
    CUresult rc = reg(page, page_size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (rc == CUDA_SUCCESS) rc = map(&dg.word, word, 0);
    if (rc != CUDA_SUCCESS) {
        refuse("registering the gate word with the GPU", rc);
        return;
    }
    atomic_store(&dg.on, 1);
    /* Queued work now waits on the word with no host thread at the gate: should the owner die
     * while the gate is closed, the process reopens it itself (qs_client_keep_gate). */
    if (qs_client_keep_gate(binding_client) != QS_OK)
        qsc_warn_once(QSC_WARN_DRIVER, "the gate keeper did not start (%s): should the node "
                                       "owner die while high priority holds the gate, queued "
                                       "work waits for a new owner", qs_last_error());
}

int qsc_dgate_bind(const qsc_session *s) {
    binding_client = s->client;
    if (binding_client != NULL) pthread_once(&bind_once, bind_word);
    return qsc_dgate_on();
}

int qsc_dgate_on(void) { return atomic_load_explicit(&dg.on, memory_order_acquire); }

void qsc_dgate_after(CUstream stream, _Atomic uint64_t *since_n, uint64_t n, uint64_t est_ns) {
    uint64_t since = atomic_load_explicit(since_n, memory_order_relaxed);
    if (n <= since || (n - since) * est_ns < SLICE_NS) return;
    if (!atomic_compare_exchange_strong(since_n, &since, n)) return; /* another thread did */
    CUresult rc = QSC_REAL(wait_value_fn, cuStreamWaitValue32_v2)(stream, dg.word,
                                                                   QS_GATE_WORD_OPEN,
                                                                   CU_STREAM_WAIT_VALUE_EQ);
    if (rc == CUDA_SUCCESS) {
        qsc_stats_count(QSC_STAT_LP_GATE_WAITS, 1);
        return;
    }
    atomic_store(&dg.on, 0); /* the window alone from the next batch on */
    refuse("enqueuing a wait on the gate word", rc);
}

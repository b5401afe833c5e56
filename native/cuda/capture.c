/* capture.c — graph captures the program begins, against the interposer's own recordings. The
 * interposer records fences into a stream only after asking the driver that no capture is
 * under way there (qsc_stream_capturing, qsc_stream_unrecordable): a capture that began
 * between the question and the recording would take the fence into the program's graph (the
 * fence then never completes, and the graph records the interposer's event whenever it runs).
 * Every way of beginning a capture is interposed, and waits while a recording is between its
 * question and its recording; the recordings (per batch, per completion round: never on a
 * launch's fast path) hold the read side of one lock for those two calls. */
#include <pthread.h>

#include "interposer.h"

static pthread_rwlock_t begins = PTHREAD_RWLOCK_INITIALIZER;

void qsc_record_begin(void) { pthread_rwlock_rdlock(&begins); }

void qsc_record_end(void) { pthread_rwlock_unlock(&begins); }

void qsc_captures_forked(void) {
    pthread_rwlock_init(&begins, NULL); /* the parent's threads may have held it */
}

typedef CUresult (*begin_v1_fn)(CUstream);
typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*begin_to_graph_fn)(CUstream, CUgraph, const void *, const void *, size_t,
                                      CUstreamCaptureMode);

/* Begin the capture through the real `name` while no recording is between its question and
 * its recording. */
#define QSC_BEGIN_CAPTURE(type, name, ...)                    \
    do {                                                      \
        qsc_resolve();                                        \
        type real_ = QSC_REAL(type, name);                    \
        if (real_ == NULL) return CUDA_ERROR_NOT_FOUND;       \
        pthread_rwlock_wrlock(&begins);                       \
        CUresult rc_ = real_(__VA_ARGS__);                    \
        pthread_rwlock_unlock(&begins);                       \
        return rc_;                                           \
    } while (0)

QSC_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
    QSC_BEGIN_CAPTURE(begin_v1_fn, cuStreamBeginCapture, stream);
}

QSC_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
    QSC_BEGIN_CAPTURE(begin_v1_fn, cuStreamBeginCapture_ptsz, stream);
}

QSC_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
    QSC_BEGIN_CAPTURE(begin_fn, cuStreamBeginCapture_v2, stream, mode);
}

QSC_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
    QSC_BEGIN_CAPTURE(begin_fn, cuStreamBeginCapture_v2_ptsz, stream, mode);
}

QSC_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                                const void *dependencies, const void *edge_data,
                                                size_t count, CUstreamCaptureMode mode) {
    QSC_BEGIN_CAPTURE(begin_to_graph_fn, cuStreamBeginCaptureToGraph, stream, graph,
                      dependencies, edge_data, count, mode);
}

QSC_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                     const void *dependencies,
                                                     const void *edge_data, size_t count,
                                                     CUstreamCaptureMode mode) {
    QSC_BEGIN_CAPTURE(begin_to_graph_fn, cuStreamBeginCaptureToGraph_ptsz, stream, graph,
                      dependencies, edge_data, count, mode);
}

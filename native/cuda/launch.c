/* launch.c — the gate on every way of submitting device work: kernels (plain,
 * extensible, cooperative), graphs and host functions, in their legacy-stream and
 * per-thread-stream (_ptsz) forms. Each submission is one unit (tracker.c). */
#include "interposer.h"

/* The stream a legacy entry point means by NULL: the legacy default stream, which programs
 * also name CU_STREAM_LEGACY (a runtime and the libraries it loads may use either), so
 * that both spellings are tracked as the one stream they are. */
static CUstream legacy(CUstream stream) {
    return stream == NULL ? CU_STREAM_LEGACY : stream;
}

/* The whole submission, from the gate to its tracking, is one use of the client (a process
 * of several vGPUs binds to the one of the stream's card here). With statistics on
 * (stats.c), the launch is counted by its path and timed. */
#define QSC_GATED(stream, call)                                          \
    do {                                                                 \
        int tracked_;                                                    \
        qsc_clock clk_ = {qsc_stamp(), 0, 0};                            \
        const qsc_session *s_ = qsc_enter_on(stream);                    \
        CUresult rc_ = qsc_unit_begin(s_, (stream), &tracked_);          \
        if (rc_ == CUDA_SUCCESS) {                                       \
            clk_.before_driver = qsc_stamp();                            \
            rc_ = (call);                                                \
            clk_.after_driver = qsc_stamp();                             \
            if (tracked_) qsc_unit_end(s_, (stream), rc_, tracked_);     \
        }                                                                \
        qsc_leave(s_);                                                   \
        if (clk_.entered) qsc_stats_timed(&clk_, tracked_, rc_);         \
        return rc_;                                                      \
    } while (0)

typedef CUresult (*launch_kernel_fn)(QSC_LAUNCH_KERNEL_ARGS, void **extra);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*launch_coop_fn)(QSC_LAUNCH_KERNEL_ARGS);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*host_func_fn)(CUstream, CUhostFn, void *);

QSC_EXPORT CUresult cuLaunchKernel(QSC_LAUNCH_KERNEL_ARGS, void **extra) {
    QSC_GATED(legacy(stream), QSC_REAL(launch_kernel_fn, cuLaunchKernel)(
                                  f, gx, gy, gz, bx, by, bz, shared, stream, params, extra));
}

QSC_EXPORT CUresult cuLaunchKernel_ptsz(QSC_LAUNCH_KERNEL_ARGS, void **extra) {
    QSC_GATED(qsc_per_thread(stream),
              QSC_REAL(launch_kernel_fn, cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shared,
                                                              stream, params, extra));
}

QSC_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                     void **extra) {
    if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
    QSC_GATED(legacy(config->hStream),
              QSC_REAL(launch_ex_fn, cuLaunchKernelEx)(config, f, params, extra));
}

QSC_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                          void **params, void **extra) {
    if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
    QSC_GATED(qsc_per_thread(config->hStream),
              QSC_REAL(launch_ex_fn, cuLaunchKernelEx_ptsz)(config, f, params, extra));
}

QSC_EXPORT CUresult cuLaunchCooperativeKernel(QSC_LAUNCH_KERNEL_ARGS) {
    QSC_GATED(legacy(stream), QSC_REAL(launch_coop_fn, cuLaunchCooperativeKernel)(
                          f, gx, gy, gz, bx, by, bz, shared, stream, params));
}

QSC_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(QSC_LAUNCH_KERNEL_ARGS) {
    QSC_GATED(qsc_per_thread(stream), QSC_REAL(launch_coop_fn, cuLaunchCooperativeKernel_ptsz)(
                                      f, gx, gy, gz, bx, by, bz, shared, stream, params));
}

QSC_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    QSC_GATED(legacy(stream), QSC_REAL(graph_launch_fn, cuGraphLaunch)(exec, stream));
}

QSC_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    QSC_GATED(qsc_per_thread(stream), QSC_REAL(graph_launch_fn, cuGraphLaunch_ptsz)(exec, stream));
}

QSC_EXPORT CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *user_data) {
    QSC_GATED(legacy(stream), QSC_REAL(host_func_fn, cuLaunchHostFunc)(stream, fn, user_data));
}

QSC_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void *user_data) {
    QSC_GATED(qsc_per_thread(stream),
              QSC_REAL(host_func_fn, cuLaunchHostFunc_ptsz)(stream, fn, user_data));
}

/* graph_mem.c — graph memory against the vGPU's limit. A graph's allocation nodes (added by
 * cuGraphAddMemAllocNode or cuGraphAddNode, or captured from cuMemAllocAsync) are backed with
 * physical memory from the device's graph memory pool when the executable graph is launched or
 * uploaded, and that memory stays with the pool (executable graphs, allocations not yet freed,
 * cached memory) until cuDeviceGraphMemTrim. So every instantiation reserves the sum of the
 * graph's allocation nodes (child graphs included, each rounded up to 2 MiB) before the driver
 * instantiates it, and the reservation lives with the executable graph. At its destroy the pool
 * is trimmed and what the pool still holds (at most what the destroyed graphs reserved) stays
 * reserved, settled again at the program's trims and before a reservation that would not
 * fit otherwise (docs/driver.md, "Graph memory"). */
#include <pthread.h>
#include <stdlib.h>

#include "interposer.h"

#define GRAPH_GRANULE (2ull << 20) /* the pool's physical granularity: a node takes at least this */
#define GRAPH_DEPTH 16             /* child graphs nested deeper are refused */
#define GRAPH_DEVICES 64           /* devices whose graph memory pool is settled by its count */

typedef CUresult (*get_nodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*node_type_fn)(CUgraphNode, int *);
typedef CUresult (*alloc_params_fn)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult (*child_graph_fn)(CUgraphNode, CUgraph *);
typedef CUresult (*trim_fn)(CUdevice);
typedef CUresult (*graph_mem_attr_fn)(CUdevice, int, void *);
typedef CUresult (*exec_destroy_fn)(CUgraphExec);

static CUresult graph_bytes(CUgraph graph, int depth, uint64_t *sum);

/* The bytes node `node` allocates (a child graph's allocations included). */
static CUresult node_bytes(CUgraphNode node, int depth, uint64_t *sum) {
    int type = 0;
    CUresult rc = QSC_REAL(node_type_fn, cuGraphNodeGetType)(node, &type);
    if (rc != CUDA_SUCCESS) return rc;
    if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
        CUgraph child = NULL;
        child_graph_fn get = QSC_REAL(child_graph_fn, cuGraphChildGraphNodeGetGraph);
        rc = get == NULL ? CUDA_ERROR_NOT_SUPPORTED : get(node, &child);
        return rc != CUDA_SUCCESS ? rc : graph_bytes(child, depth + 1, sum);
    }
    if (type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_SUCCESS;
    CUDA_MEM_ALLOC_NODE_PARAMS params = {0};
    alloc_params_fn get = QSC_REAL(alloc_params_fn, cuGraphMemAllocNodeGetParams);
    rc = get == NULL ? CUDA_ERROR_NOT_SUPPORTED : get(node, &params);
    if (rc == CUDA_SUCCESS)
        *sum += ((uint64_t)params.bytesize + GRAPH_GRANULE - 1) / GRAPH_GRANULE * GRAPH_GRANULE;
    return rc;
}

/* Add to *sum the bytes `graph`'s allocation nodes take; a driver error is returned (and the
 * instantiation refused with it) rather than taken for a graph without any. */
static CUresult graph_bytes(CUgraph graph, int depth, uint64_t *sum) {
    get_nodes_fn get_nodes = QSC_REAL(get_nodes_fn, cuGraphGetNodes);
    if (depth > GRAPH_DEPTH) return CUDA_ERROR_NOT_SUPPORTED;
    if (get_nodes == NULL || QSC_REAL(node_type_fn, cuGraphNodeGetType) == NULL)
        return CUDA_SUCCESS; /* a driver without node queries has no allocation nodes either */
    size_t count = 0;
    CUresult rc = get_nodes(graph, NULL, &count);
    if (rc != CUDA_SUCCESS || count == 0) return rc;
    CUgraphNode *nodes = calloc(count, sizeof *nodes);
    if (nodes == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = get_nodes(graph, nodes, &count);
    for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++) rc = node_bytes(nodes[i], depth, sum);
    free(nodes);
    return rc;
}

/* ---- executable graphs and their reservations ---- */
typedef struct exec_rec {
    CUgraphExec exec;
    CUdevice dev; /* of the context current at instantiation; -1 when unknown */
    uint64_t bytes;
    struct exec_rec *next;
} exec_rec;

static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static exec_rec *execs;
/* Per device, reserved for graph memory that outlived its executable graph (allocations not yet
 * freed, memory the pool kept although trimmed), per that device's pool count. The last entry
 * holds what was reserved on a device we cannot name or count: it is never released. */
static uint64_t residual[GRAPH_DEVICES + 1];
static _Atomic int residual_held; /* some residual is nonzero: a hint read without the lock */

static uint64_t *residual_of(CUdevice dev) {
    return &residual[dev >= 0 && dev < GRAPH_DEVICES ? dev : GRAPH_DEVICES];
}

static CUdevice current_device(void) {
    CUdevice dev = -1;
    qsc_ctx_get_device_fn get = QSC_REAL(qsc_ctx_get_device_fn, cuCtxGetDevice);
    return get != NULL && get(&dev) == CUDA_SUCCESS ? dev : -1;
}

/* The interposer's own trim, in relaxed capture mode: another thread's capture neither forbids
 * it nor is invalidated by it. */
static CUresult relaxed_trim(trim_fn trim, CUdevice dev) {
    CUstreamCaptureMode was = qsc_capture_mode(CU_STREAM_CAPTURE_MODE_RELAXED);
    CUresult rc = trim(dev);
    qsc_capture_mode(was);
    return rc;
}

/* Under graph_lock: `freed` bytes of reservation are no longer tied to an executable graph of
 * `dev`. Trim the pool, then keep reserved (as residual) what it still holds, never more than
 * was reserved; release the rest. The live graphs' reservations are not subtracted from the
 * pool's count: one not launched (or idle, which the trim unmaps) holds none of it, and will
 * take its memory anew at its launch, so what the pool holds is the destroyed graphs' (their
 * allocations left live) unless a live graph runs during the trim or left its own allocations
 * live (counted twice then, until the next settle). Without the pool's count (a driver that
 * cannot say, a device we cannot name), everything stays reserved. */
static void settle_pool(CUdevice dev, uint64_t freed) {
    uint64_t *kept = residual_of(dev);
    uint64_t held = *kept + freed;
    cuuint64_t pool = 0;
    trim_fn trim = QSC_REAL(trim_fn, cuDeviceGraphMemTrim);
    graph_mem_attr_fn attr = QSC_REAL(graph_mem_attr_fn, cuDeviceGetGraphMemAttribute);
    if (kept == &residual[GRAPH_DEVICES] || trim == NULL || attr == NULL ||
        relaxed_trim(trim, dev) != CUDA_SUCCESS ||
        attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &pool) != CUDA_SUCCESS) {
        *kept = held;
        return;
    }
    *kept = pool < held ? pool : held;
    qsc_mem_release(held - *kept);
}

/* Under graph_lock: whether any residual is left (the hint). */
static void note_residual(void) {
    int any = 0;
    for (int i = 0; i <= GRAPH_DEVICES; i++) any |= residual[i] != 0;
    atomic_store(&residual_held, any);
}


/* Take `exec`'s record out before the driver destroys it: once destroyed, its handle may be
 * the next instantiation's, and that graph's record must not be taken for this one. */
static exec_rec *untie(CUgraphExec exec) {
    pthread_mutex_lock(&graph_lock);
    exec_rec **p = &execs;
    while (*p != NULL && (*p)->exec != exec) p = &(*p)->next;
    exec_rec *r = *p;
    if (r != NULL) *p = r->next;
    pthread_mutex_unlock(&graph_lock);
    return r;
}

/* Record `r` is (again) an executable graph's: a new one's, or one whose destroy the driver
 * refused. */
static void retie(exec_rec *r) {
    if (r == NULL) return;
    pthread_mutex_lock(&graph_lock);
    r->next = execs;
    execs = r;
    pthread_mutex_unlock(&graph_lock);
}

/* Tie `bytes` reserved to `exec`; 0 when there is no memory to remember it with. */
static int remember(CUgraphExec exec, uint64_t bytes) {
    exec_rec *r = malloc(sizeof *r);
    if (r == NULL) return 0;
    *r = (exec_rec){exec, current_device(), bytes, NULL};
    retie(r);
    return 1;
}

/* The executable graph of record `r` is destroyed: its reservation is settled against the pool. */
static void forget(exec_rec *r) {
    if (r == NULL) return;
    pthread_mutex_lock(&graph_lock);
    settle_pool(r->dev, r->bytes);
    note_residual();
    pthread_mutex_unlock(&graph_lock);
    free(r);
}

int qsc_graphs_hold_residual(void) { return atomic_load(&residual_held); }

/* Graph memory freed outside its graph goes back to the pool, which keeps it until trimmed. */
void qsc_graphs_settle(void) {
    pthread_mutex_lock(&graph_lock);
    for (CUdevice dev = 0; dev < GRAPH_DEVICES; dev++)
        if (residual[dev] != 0) settle_pool(dev, 0);
    note_residual();
    pthread_mutex_unlock(&graph_lock);
}

/* Before an instantiation of `graph`: reserve its allocation nodes' bytes (*bytes). */
static CUresult reserve_graph(CUgraph graph, uint64_t *bytes) {
    qsc_resolve();
    *bytes = 0;
    CUresult rc = graph_bytes(graph, 0, bytes);
    return rc == CUDA_SUCCESS && *bytes > 0 ? qsc_mem_reserve(*bytes) : rc;
}

/* After the driver answered the instantiation: the reservation goes with the executable graph,
 * or back if there is none. */
static CUresult settle_exec(CUresult rc, CUgraphExec *exec, uint64_t bytes) {
    if (bytes == 0) return rc;
    if (rc != CUDA_SUCCESS) {
        qsc_mem_release(bytes);
        return rc;
    }
    if (remember(*exec, bytes)) return rc;
    QSC_REAL(exec_destroy_fn, cuGraphExecDestroy)(*exec);
    qsc_mem_release(bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

typedef CUresult (*inst_log_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
typedef CUresult (*inst_flags_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*inst_params_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);

#define QSC_INSTANTIATE(type, name, graph, ...)                           \
    do {                                                                  \
        uint64_t bytes_ = 0;                                              \
        CUresult rc_ = reserve_graph(graph, &bytes_);                     \
        type real_ = QSC_REAL(type, name);                                \
        if (rc_ == CUDA_SUCCESS && real_ == NULL) {                       \
            qsc_mem_release(bytes_);                                      \
            rc_ = CUDA_ERROR_NOT_SUPPORTED;                               \
        } else if (rc_ == CUDA_SUCCESS) {                                 \
            rc_ = settle_exec(real_(exec, graph, __VA_ARGS__), exec, bytes_); \
        }                                                                 \
        return rc_;                                                       \
    } while (0)

QSC_EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node,
                                       char *log, size_t log_size) {
    QSC_INSTANTIATE(inst_log_fn, cuGraphInstantiate, graph, err_node, log, log_size);
}

QSC_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err_node,
                                          char *log, size_t log_size) {
    QSC_INSTANTIATE(inst_log_fn, cuGraphInstantiate_v2, graph, err_node, log, log_size);
}

QSC_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                unsigned long long flags) {
    QSC_INSTANTIATE(inst_flags_fn, cuGraphInstantiateWithFlags, graph, flags);
}

/* The parameters' result says why when the instantiation is refused here. */
static CUresult with_params(CUresult rc, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && params != NULL)
        params->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
    return rc;
}

static CUresult instantiate_params(CUgraphExec *exec, CUgraph graph,
                                   CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    QSC_INSTANTIATE(inst_params_fn, cuGraphInstantiateWithParams, graph, params);
}

static CUresult instantiate_params_ptsz(CUgraphExec *exec, CUgraph graph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    QSC_INSTANTIATE(inst_params_fn, cuGraphInstantiateWithParams_ptsz, graph, params);
}

QSC_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                                 CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return with_params(instantiate_params(exec, graph, params), params);
}

QSC_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return with_params(instantiate_params_ptsz(exec, graph, params), params);
}

QSC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
    qsc_resolve();
    exec_destroy_fn real = QSC_REAL(exec_destroy_fn, cuGraphExecDestroy);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    exec_rec *r = untie(exec);
    CUresult rc = real(exec);
    if (rc == CUDA_SUCCESS) forget(r);
    else retie(r);
    return rc;
}

/* The program trims the pool itself: what the pool gave back leaves the residual. */
QSC_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    qsc_resolve();
    trim_fn real = QSC_REAL(trim_fn, cuDeviceGraphMemTrim);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(dev);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&graph_lock);
    if (*residual_of(dev) > 0) settle_pool(dev, 0);
    note_residual();
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

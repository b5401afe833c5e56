/* probe_direct.c — the probe as a program linked against libcuda.so.1 and
 * libnvidia-ml.so.1 that calls the driver directly by its exported names. */
#include "probe.h"

CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(PROBE_KERNEL_ARGS, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(PROBE_KERNEL_ARGS);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuLaunchHostFunc(CUstream, CUhostFn, void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetUuid(CUuuid *, CUdevice);

int main(int argc, char **argv) {
    const probe_driver d = {
        "direct", cuInit, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuModuleLoadData,
        cuModuleGetFunction, cuStreamCreate, cuStreamSynchronize, cuLaunchKernel,
        cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphCreate, cuGraphInstantiateWithFlags,
        cuGraphLaunch, cuLaunchHostFunc, cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged,
        cuMemFree_v2, cuMemAllocAsync, cuMemFreeAsync, cuDeviceGetDefaultMemPool,
        cuMemAllocFromPoolAsync, cuMemCreate, cuMemRelease, cuArrayCreate_v2,
        cuArray3DCreate_v2, cuArrayDestroy, cuMemGetInfo_v2, cuDeviceTotalMem_v2, nvmlInit_v2,
        nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
        cuDeviceGetCount, cuDeviceGetUuid,
    };
    return probe_main(&d, argc, argv, 1);
}

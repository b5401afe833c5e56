/* probe_runtime.c — the probe finding its entry points the way the CUDA runtime (11.3+)
 * does: dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, then ask it for every base name
 * for a CUDA 12 runtime, legacy-stream or (with --per-thread) per-thread-stream
 * variants. NVML is dlopen'd and looked up with dlsym. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "probe.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static int failed;

static void *driver_entry(get_proc_fn get_proc, const char *base, cuuint64_t flags) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (get_proc(base, &fn, 12080, flags, &status) != CUDA_SUCCESS || fn == NULL) {
        fprintf(stderr, "probe: cuGetProcAddress(%s) found nothing (status %d)\n", base, status);
        failed = 1;
    }
    return fn;
}

static void *nvml_entry(void *lib, const char *name) {
    void *fn = lib != NULL ? dlsym(lib, name) : NULL;
    if (fn == NULL) {
        fprintf(stderr, "probe: no %s in libnvidia-ml.so.1\n", name);
        failed = 1;
    }
    return fn;
}

int main(int argc, char **argv) {
    int per_thread = argc > 1 && strcmp(argv[1], "--per-thread") == 0;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    get_proc_fn get_proc = cuda != NULL ? (get_proc_fn)dlsym(cuda, "cuGetProcAddress_v2") : NULL;
    if (get_proc == NULL) {
        fprintf(stderr, "probe: cannot find cuGetProcAddress_v2: %s\n", dlerror());
        return 2;
    }
    cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                  : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
#define CU(name) driver_entry(get_proc, #name, flags)
#define NV(name) nvml_entry(nvml, #name)
    const probe_driver d = {
        per_thread ? "runtime-per-thread" : "runtime", CU(cuInit), CU(cuDevicePrimaryCtxRetain),
        CU(cuCtxSetCurrent), CU(cuModuleLoadData), CU(cuModuleGetFunction), CU(cuStreamCreate),
        CU(cuStreamSynchronize), CU(cuLaunchKernel), CU(cuLaunchKernelEx),
        CU(cuLaunchCooperativeKernel), CU(cuGraphCreate), CU(cuGraphInstantiateWithFlags),
        CU(cuGraphLaunch), CU(cuLaunchHostFunc), CU(cuMemAlloc), CU(cuMemAllocPitch),
        CU(cuMemAllocManaged), CU(cuMemFree), CU(cuMemAllocAsync), CU(cuMemFreeAsync),
        CU(cuDeviceGetDefaultMemPool), CU(cuMemAllocFromPoolAsync), CU(cuMemCreate),
        CU(cuMemRelease), CU(cuArrayCreate), CU(cuArray3DCreate), CU(cuArrayDestroy),
        CU(cuMemGetInfo), CU(cuDeviceTotalMem), NV(nvmlInit_v2),
        NV(nvmlDeviceGetHandleByIndex_v2), NV(nvmlDeviceGetMemoryInfo),
        NV(nvmlDeviceGetMemoryInfo_v2), CU(cuDeviceGetCount), CU(cuDeviceGetUuid),
    };
#undef CU
#undef NV
    if (failed) return 2;
    return probe_main(&d, argc, argv, per_thread ? 2 : 1);
}

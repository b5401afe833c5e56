/* fake_cuda_config.h — TEST DOUBLE configuration shared by the fake libcuda.so.1 and the
 * fake libnvidia-ml.so.1: one simulated GPU whose UUID and memory the tests choose with
 * QSHARE_FAKE_GPU_UUID and QSHARE_FAKE_GPU_MEM (bytes). */
#ifndef QSHARE_FAKE_CUDA_CONFIG_H
#define QSHARE_FAKE_CUDA_CONFIG_H

#include <stdint.h>
#include <stdlib.h>

#include "gpu_uuid.h"

#define FAKE_DEFAULT_UUID "GPU-00000000-0000-0000-0000-000000000000"
#define FAKE_DEFAULT_MEM (16ull << 30)

static inline const char *fake_gpu_uuid(void) {
    const char *uuid = getenv("QSHARE_FAKE_GPU_UUID");
    char bytes[16];
    return uuid != NULL && qsc_uuid_parse(uuid, bytes) ? uuid : FAKE_DEFAULT_UUID;
}

static inline uint64_t fake_gpu_mem(void) {
    const char *text = getenv("QSHARE_FAKE_GPU_MEM");
    unsigned long long v = text != NULL ? strtoull(text, NULL, 10) : 0;
    return v != 0 ? (uint64_t)v : FAKE_DEFAULT_MEM;
}

#endif

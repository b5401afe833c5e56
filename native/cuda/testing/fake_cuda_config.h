/* fake_cuda_config.h — TEST DOUBLE configuration shared by the fake libcuda.so.1 and the
 * fake libnvidia-ml.so.1: the simulated GPUs, QSHARE_FAKE_GPU_COUNT of them (1 unless set,
 * at most FAKE_MAX_GPUS). Device i's UUID is QSHARE_FAKE_GPU_UUID_<i> and its memory
 * QSHARE_FAKE_GPU_MEM_<i> (bytes); device 0 also takes QSHARE_FAKE_GPU_UUID and every device
 * QSHARE_FAKE_GPU_MEM when its own is unset. Unset UUIDs default to GPU-0...0<i>. */
#ifndef QSHARE_FAKE_CUDA_CONFIG_H
#define QSHARE_FAKE_CUDA_CONFIG_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_uuid.h"

#define FAKE_MAX_GPUS 8
#define FAKE_DEFAULT_MEM (16ull << 30)

static inline int fake_gpu_count(void) {
    const char *text = getenv("QSHARE_FAKE_GPU_COUNT");
    long n = text != NULL ? strtol(text, NULL, 10) : 1;
    return n < 1 ? 1 : n > FAKE_MAX_GPUS ? FAKE_MAX_GPUS : (int)n;
}

/* 1 when `dev` is one of the simulated devices. */
static inline int fake_gpu_valid(int dev) { return dev >= 0 && dev < fake_gpu_count(); }

/* The environment variable `base`_<dev>, else (for device 0 only when `all` is 0) `base`. */
static inline const char *fake_gpu_env(const char *base, int dev, int all) {
    char name[64];
    snprintf(name, sizeof name, "%s_%d", base, dev);
    const char *own = getenv(name);
    return own != NULL || (!all && dev != 0) ? own : getenv(base);
}

/* Device `dev`'s UUID, written into `out`. */
static inline void fake_gpu_uuid_of(int dev, char out[QSC_UUID_TEXT_LEN]) {
    const char *uuid = fake_gpu_env("QSHARE_FAKE_GPU_UUID", dev, 0);
    char bytes[16];
    if (uuid != NULL && qsc_uuid_parse(uuid, bytes)) {
        snprintf(out, QSC_UUID_TEXT_LEN, "%s", uuid);
        return;
    }
    snprintf(out, QSC_UUID_TEXT_LEN, "GPU-00000000-0000-0000-0000-%012x", (unsigned)dev);
}

static inline uint64_t fake_gpu_mem_of(int dev) {
    const char *text = fake_gpu_env("QSHARE_FAKE_GPU_MEM", dev, 1);
    unsigned long long v = text != NULL ? strtoull(text, NULL, 10) : 0;
    return v != 0 ? (uint64_t)v : FAKE_DEFAULT_MEM;
}

#endif

/* fake_cuda_nvml.c — TEST DOUBLE of libnvidia-ml.so.1 for CI machines without a GPU: the
 * devices of fake_cuda_config.h, with their UUIDs and total memory. It reports no memory
 * in use; under the interposer the vGPU's numbers replace these. Not a real NVML. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"
#include "fake_cuda_config.h"

static int initialized;
static char device_tokens[FAKE_MAX_GPUS]; /* device i's handle points at the i-th */

nvmlReturn_t nvmlInit_v2(void) {
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t rc) { return rc == NVML_SUCCESS ? "Success" : "Error"; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned)fake_gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!fake_gpu_valid((int)index) || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)&device_tokens[index];
    return NVML_SUCCESS;
}

/* The index of `device` in *index, or why it is not one. */
static nvmlReturn_t check(nvmlDevice_t device, int *index) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    uintptr_t at = (uintptr_t)device, first = (uintptr_t)device_tokens;
    if (at < first || at >= first + (uintptr_t)fake_gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (int)(at - first);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int index = 0;
    nvmlReturn_t rc = check(device, &index);
    if (rc != NVML_SUCCESS) return rc;
    char text[QSC_UUID_TEXT_LEN];
    fake_gpu_uuid_of(index, text);
    if (length < strlen(text) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    int index = 0;
    nvmlReturn_t rc = check(device, &index);
    if (rc != NVML_SUCCESS) return rc;
    uint64_t total = fake_gpu_mem_of(index);
    *memory = (nvmlMemory_t){.total = total, .free = total, .used = 0};
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    int index = 0;
    nvmlReturn_t rc = check(device, &index);
    if (rc != NVML_SUCCESS) return rc;
    uint64_t total = fake_gpu_mem_of(index);
    memory->total = total;
    memory->reserved = 0;
    memory->free = total;
    memory->used = 0;
    return NVML_SUCCESS;
}

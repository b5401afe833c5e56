/* fake_cuda_nvml.c — TEST DOUBLE of libnvidia-ml.so.1 for CI machines without a GPU: one
 * device, whose UUID and total memory come from fake_cuda_config.h. It reports no memory
 * in use; under the interposer the vGPU's numbers replace these. Not a real NVML. */
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"
#include "fake_cuda_config.h"

static int initialized;
static char device_token; /* the one device handle points here */

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
    *count = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index != 0 || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)&device_token;
    return NVML_SUCCESS;
}

static nvmlReturn_t check(nvmlDevice_t device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return device == (nvmlDevice_t)&device_token ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t rc = check(device);
    if (rc != NVML_SUCCESS) return rc;
    const char *text = fake_gpu_uuid();
    if (length < strlen(text) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t rc = check(device);
    if (rc != NVML_SUCCESS) return rc;
    uint64_t total = fake_gpu_mem();
    *memory = (nvmlMemory_t){.total = total, .free = total, .used = 0};
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t rc = check(device);
    if (rc != NVML_SUCCESS) return rc;
    uint64_t total = fake_gpu_mem();
    memory->total = total;
    memory->reserved = 0;
    memory->free = total;
    memory->used = 0;
    return NVML_SUCCESS;
}

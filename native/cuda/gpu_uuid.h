/* gpu_uuid.h — NVIDIA's textual GPU UUID ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
 * to and from the 16 bytes that cuDeviceGetUuid returns. Shared by the interposer
 * and the fake driver. */
#ifndef QSHARE_GPU_UUID_H
#define QSHARE_GPU_UUID_H

#include <stdio.h>
#include <string.h>

#define QSC_UUID_TEXT_LEN 41u /* "GPU-" + 36 characters + NUL */

static inline void qsc_uuid_format(const char bytes[16], char out[QSC_UUID_TEXT_LEN]) {
    const unsigned char *b = (const unsigned char *)bytes;
    snprintf(out, QSC_UUID_TEXT_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

static inline int qsc_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* 1 if `text` is a well-formed GPU UUID (its bytes in `bytes`), else 0. */
static inline int qsc_uuid_parse(const char *text, char bytes[16]) {
    if (strncmp(text, "GPU-", 4) != 0 || strlen(text) != QSC_UUID_TEXT_LEN - 1) return 0;
    const char *p = text + 4;
    for (int i = 0; i < 16; i++) {
        if (*p == '-') p++;
        int hi = qsc_hex_digit(p[0]), lo = hi < 0 ? -1 : qsc_hex_digit(p[1]);
        if (lo < 0) return 0;
        bytes[i] = (char)(hi << 4 | lo);
        p += 2;
    }
    return *p == '\0';
}

#endif

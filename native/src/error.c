/* error.c — status strings and the per-thread detailed message of the last failure. */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[256];

const char *qs_strerror(int status)
{
    switch (status) {
    case QS_OK: return "ok";
    case QS_EINVAL: return "invalid argument";
    case QS_ENAME: return "invalid segment name";
    case QS_EEXIST: return "already exists";
    case QS_ENOENT: return "not found";
    case QS_EVERSION: return "segment ABI version mismatch";
    case QS_ESIZE: return "segment size mismatch";
    case QS_EMAGIC: return "not a qshare segment";
    case QS_ESHARE: return "core share out of range 1..100";
    case QS_EMEMLIMIT: return "memory limit out of range";
    case QS_ENOMEM: return "out of vGPU memory";
    case QS_ERELEASE: return "release exceeds reservation";
    case QS_EFULL: return "table full";
    case QS_EDESTROYED: return "vGPU destroyed";
    case QS_ESYS: return "system call failed";
    case QS_ETIMEDOUT: return "timed out";
    case QS_EPRIORITY: return "invalid priority";
    case QS_ESTATE: return "invalid state";
    case QS_EAGENT: return "node owner not reachable";
    case QS_ECORRUPT: return "segment invariant broken";
    case QS_EPOLICY: return "unknown policy";
    case QS_ESHARESUM: return "core shares on the card exceed 100";
    default: return "unknown status";
    }
}

const char *qs_last_error(void)
{
    return last_error[0] ? last_error : "no error";
}

void qs_clear_error(void)
{
    last_error[0] = '\0';
}

int qs_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

int qs_fail_errno(const char *what)
{
    int saved = errno;
    return qs_fail(QS_ESYS, "%s: %s", what, strerror(saved));
}

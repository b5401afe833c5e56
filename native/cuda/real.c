/* real.c — finding the real driver: loads libcuda.so.1 and libnvidia-ml.so.1, and makes
 * every way a program can reach a driver entry point (direct linking, dlsym on a
 * dlopen'd handle, cuGetProcAddress of CUDA 11.3+ runtimes) arrive at our wrappers. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "interposer.h"

enum { LIB_CUDA, LIB_NVML };

typedef struct entry {
    const char *name;
    const char *base;
    int lib;
    void *wrapper;
} entry;

static const entry entries[QSC_N_ALL] = {
#define QSC_WRAPPED_ROW(name, base, lib) {#name, #base, LIB_##lib, (void *)name},
#define QSC_HELPER_ROW(name, base, lib) {#name, #base, LIB_##lib, NULL},
    QSC_ENTRIES(QSC_WRAPPED_ROW) QSC_HELPERS(QSC_HELPER_ROW)
#undef QSC_WRAPPED_ROW
#undef QSC_HELPER_ROW
};

void *qsc_real_table[QSC_N_ALL];

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
/* Set while this thread loads the real libraries: their own dlsym calls pass straight through. */
static _Thread_local int resolving;

static void find_real_dlsym(void) {
    /* dlvsym is not interposed, so it reaches libc's dlsym past our own definition. */
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (real_dlsym == NULL) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static void resolve_all(void) {
    pthread_once(&dlsym_once, find_real_dlsym);
    resolving = 1;
    void *libs[2] = {dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL),
                     dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL)};
    for (int i = 0; i < QSC_N_ALL; i++) {
        void *lib = libs[entries[i].lib];
        qsc_real_table[i] = lib != NULL && real_dlsym != NULL ? real_dlsym(lib, entries[i].name) : NULL;
    }
    if (libs[LIB_CUDA] == NULL)
        qsc_warn_once(QSC_WARN_DRIVER, "cannot load libcuda.so.1: %s", dlerror());
    resolving = 0;
}

void qsc_resolve(void) { pthread_once(&resolve_once, resolve_all); }

static int is_per_thread(const char *name) {
    size_t n = strlen(name);
    return n > 5 && (strcmp(name + n - 5, "_ptsz") == 0 || strcmp(name + n - 5, "_ptds") == 0);
}

/* The wrapper standing for what the driver answered `base` with: the entry whose real
 * pointer is that answer; failing that (a driver that hands out internal addresses),
 * the entry its flags and version select by name. NULL if `base` is not interposed. */
static const entry *wrapper_for(const char *base, void *answer, int version, cuuint64_t flags) {
    const entry *by_name = NULL;
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (int i = 0; i < QSC_N_WRAPPED; i++) {
        if (strcmp(entries[i].base, base) != 0) continue;
        if (qsc_real_table[i] == answer) return &entries[i];
        if (is_per_thread(entries[i].name) != want_pt) continue;
        if (i == QSC_cuGetProcAddress_v2 && version < 12000) continue;
        by_name = &entries[i];
    }
    if (by_name == NULL) {
        for (int i = 0; i < QSC_N_WRAPPED; i++)
            if (strcmp(entries[i].base, base) == 0) by_name = &entries[i];
    }
    return by_name;
}

/* The entry a request for `symbol` at `version` names: CUDA 12 gave cuGraphInstantiate the
 * signature of cuGraphInstantiateWithFlags, and the driver answers it with that function. */
static const char *base_requested(const char *symbol, int version) {
    return version >= 12000 && strcmp(symbol, "cuGraphInstantiate") == 0
               ? "cuGraphInstantiateWithFlags"
               : symbol;
}

static void *interpose_answer(const char *symbol, void *answer, int version, cuuint64_t flags) {
    if (answer == NULL || symbol == NULL) return answer;
    const entry *e = wrapper_for(base_requested(symbol, version), answer, version, flags);
    return e != NULL ? e->wrapper : answer;
}

/* CUDA 3.2 (version 3020) brought the _v2 memory entries (64-bit device pointers and sizes). A
 * request below it means the v1 ABI, with 32-bit slots our _v2 wrappers would overrun, and a v1
 * entry left unwrapped would escape the memory limit: such requests are refused as not found
 * (docs/driver.md). */
#define QSC_V2_SINCE 3020

static int legacy_v1_request(const char *symbol, int version) {
    if (symbol == NULL || version >= QSC_V2_SINCE || strcmp(symbol, "cuGetProcAddress") == 0)
        return 0;
    size_t n = strlen(symbol);
    for (int i = 0; i < QSC_N_WRAPPED; i++)
        if (strcmp(entries[i].base, symbol) == 0 && strncmp(entries[i].name, symbol, n) == 0 &&
            strcmp(entries[i].name + n, "_v2") == 0)
            return 1;
    return 0;
}

typedef CUresult (*get_proc_v1)(const char *, void **, int, cuuint64_t);
typedef CUresult (*get_proc_v2)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

QSC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                     cuuint64_t flags) {
    qsc_resolve();
    get_proc_v1 real = QSC_REAL(get_proc_v1, cuGetProcAddress);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (legacy_v1_request(symbol, version)) {
        if (pfn != NULL) *pfn = NULL;
        return CUDA_ERROR_NOT_FOUND;
    }
    CUresult rc = real(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && pfn != NULL) *pfn = interpose_answer(symbol, *pfn, version, flags);
    return rc;
}

QSC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                        cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    qsc_resolve();
    get_proc_v2 real = QSC_REAL(get_proc_v2, cuGetProcAddress_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    if (legacy_v1_request(symbol, version)) {
        if (pfn != NULL) *pfn = NULL;
        if (status != NULL) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && pfn != NULL) *pfn = interpose_answer(symbol, *pfn, version, flags);
    return rc;
}

#ifndef QSC_NO_DLSYM_HOOK
/* Left out of the sanitizer build (make asan), whose runtime resolves its own
 * interceptors through dlsym before anything of ours is ready. */

/* dlsym(RTLD_NEXT, ...) asked of us must answer as if asked of libc by the caller:
 * search the objects loaded after the caller's, in load order. */
static void *next_after(const void *caller, const char *name) {
    Dl_info info;
    struct link_map *caller_map = NULL;
    if (dladdr1(caller, &info, (void **)&caller_map, RTLD_DL_LINKMAP) == 0 || caller_map == NULL)
        return NULL;
    for (struct link_map *l = caller_map->l_next; l != NULL; l = l->l_next) {
        void *handle = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (handle == NULL) continue;
        void *found = real_dlsym(handle, name);
        struct link_map *owner = NULL;
        int own = found != NULL &&
                  dladdr1(found, &info, (void **)&owner, RTLD_DL_LINKMAP) != 0 && owner == l;
        dlclose(handle);
        if (own) return found;
    }
    return NULL;
}

/* dlsym(RTLD_DEFAULT, ...) asked of us must search the caller's scope, as libc does: the
 * global scope, then, for a library loaded with RTLD_LOCAL (a Python extension module, say),
 * the objects it depends on. Asked from here, libc would search this library's scope, the
 * global one only, and a local library's own dependencies would not be found. dlerror then
 * tells what libc's would: nothing after a success, the miss after a failure. */
static void *default_for(const void *caller, const char *name) {
    void *found = real_dlsym(RTLD_DEFAULT, name);
    Dl_info info;
    struct link_map *map = NULL;
    if (found != NULL || dladdr1(caller, &info, (void **)&map, RTLD_DL_LINKMAP) == 0 ||
        map == NULL || map->l_name == NULL || map->l_name[0] == '\0')
        return found; /* found, or the caller is the program: its scope is the global one */
    void *handle = dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD);
    found = handle != NULL ? real_dlsym(handle, name) : NULL;
    if (handle != NULL) dlclose(handle);
    if (found == NULL) return real_dlsym(RTLD_DEFAULT, name); /* the miss, for dlerror */
    dlerror(); /* the global search's miss is no error of the caller's */
    return found;
}

static const entry *entry_named(const char *name) {
    for (int i = 0; i < QSC_N_WRAPPED; i++)
        if (strcmp(entries[i].name, name) == 0) return &entries[i];
    return NULL;
}

static int may_be_driver_symbol(const char *name) {
    return name != NULL &&
           ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0);
}

QSC_EXPORT void *dlsym(void *handle, const char *name) {
    pthread_once(&dlsym_once, find_real_dlsym);
    if (real_dlsym == NULL) return NULL;
    const void *caller = __builtin_return_address(0);
    void *found = handle == RTLD_NEXT      ? next_after(caller, name)
                  : handle == RTLD_DEFAULT ? default_for(caller, name)
                                           : real_dlsym(handle, name);
    if (found == NULL || resolving || !may_be_driver_symbol(name)) return found;
    qsc_resolve();
    const entry *e = entry_named(name);
    if (e != NULL && found == qsc_real_table[e - entries]) return e->wrapper;
    return found;
}
#endif

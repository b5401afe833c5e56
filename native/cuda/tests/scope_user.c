/* scope_user.c — a library loaded with RTLD_LOCAL (as Python loads extension modules) that
 * looks up a symbol of its own dependency with dlsym(RTLD_DEFAULT, ...): libc searches the
 * caller's scope, so it is found, with no error left for dlerror. */
#include <dlfcn.h>
#include <stddef.h>

int qsc_scope_dep_symbol(void);
int qsc_scope_lookup(const char *name);

/* 1: found and no error; 0: not found and an error; -1: an answer libc never gives. */
int qsc_scope_lookup(const char *name) {
    dlerror();
    void *found = dlsym(RTLD_DEFAULT, name);
    const char *error = dlerror();
    if (found != NULL && error == NULL) return 1;
    return found == NULL && error != NULL ? 0 : -1;
}

int qsc_scope_call(void) { return qsc_scope_dep_symbol(); } /* links the dependency */

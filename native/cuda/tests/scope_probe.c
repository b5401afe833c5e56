/* scope_probe.c — loads scope_user.c's library with RTLD_LOCAL and has it look up a symbol
 * of its dependency, and one that exists nowhere, with dlsym(RTLD_DEFAULT, ...). Prints
 * "scope dep=1 missing=0" as libc answers (see qsc_scope_lookup). */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *user = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (user == NULL) {
        fprintf(stderr, "scope-probe: %s\n", dlerror());
        return 2;
    }
    int (*lookup)(const char *) = (int (*)(const char *))dlsym(user, "qsc_scope_lookup");
    if (lookup == NULL) return 2;
    printf("scope dep=%d missing=%d\n", lookup("qsc_scope_dep_symbol"),
           lookup("qsc_scope_no_such_symbol"));
    return 0;
}

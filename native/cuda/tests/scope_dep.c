/* scope_dep.c — a library that another (scope_user.c) depends on: the symbol that its user
 * looks up with dlsym(RTLD_DEFAULT, ...). */
int qsc_scope_dep_symbol(void);
int qsc_scope_dep_symbol(void) { return 42; }

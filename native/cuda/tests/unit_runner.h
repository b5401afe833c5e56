/* unit_runner.h — what the interposer's unit-test programs share: EXPECT, which ends a test
 * with 1 and names the condition that failed, and the runner that prints each test's verdict
 * and returns the program's exit status. */
#ifndef QSC_UNIT_RUNNER_H
#define QSC_UNIT_RUNNER_H

#include <stddef.h>
#include <stdio.h>

#define EXPECT(cond)                                                              \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "  %s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                             \
        }                                                                         \
    } while (0)

typedef struct {
    const char *name;
    int (*fn)(void);
} unit_test;

/* Run every test of `tests` (n of them) in order; 0 when all passed, else 1. */
static inline int unit_run_all(const unit_test *tests, size_t n) {
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = tests[i].fn();
        printf("%s %s\n", rc ? "FAIL" : "ok  ", tests[i].name);
        failed += rc != 0;
    }
    printf("%zu passed, %d failed\n", n - (size_t)failed, failed);
    return failed ? 1 : 0;
}

#define UNIT_RUN_ALL(tests) unit_run_all(tests, sizeof tests / sizeof tests[0])

#endif

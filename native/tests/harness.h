/* harness.h — a minimal test runner for the driver's C tests: each test is a function
 * returning 0 on success; the runner prints one line per test and a closing tally. */
#ifndef QSHARE_TEST_HARNESS_H
#define QSHARE_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPECT(cond)                                                                    \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "  %s:%d: expected %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, qs_last_error());                                            \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static int test_pid; /* the runner's pid, the same in forked children */

struct test_case {
    const char *name;
    int (*fn)(void);
};

/* Runs every test, or with $QSHARE_C_TEST set only those whose name contains it. */
static inline int run_tests(const struct test_case *tests, size_t n)
{
    int passed = 0, failed = 0;
    const char *only = getenv("QSHARE_C_TEST");
    test_pid = (int)getpid();
    for (size_t i = 0; i < n; i++) {
        if (only && *only && !strstr(tests[i].name, only))
            continue;
        int rc = tests[i].fn();
        printf("%s %s\n", rc ? "FAIL" : "ok  ", tests[i].name);
        rc ? failed++ : passed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* A segment name unique to this test run and test. */
static inline const char *test_segment(const char *tag)
{
    static char buf[48];
    snprintf(buf, sizeof buf, "ct-%d-%s", test_pid, tag);
    return buf;
}

#endif

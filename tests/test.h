/* Minimal test harness. Every test file registers its tests with TEST()
 * (single process), TEST_MPI() (run under mpirun by tests/run.sh at
 * several sizes) or TEST_GPU() (run by scripts/gpu-check.sh with --gpu). A test fails when any CHECK fails. Output lines are
 * "ok - name" and "FAIL - name: why"; tests/run.sh counts them. */
#ifndef TPGEN_TEST_H
#define TPGEN_TEST_H
#include <math.h>
#include <stdio.h>

typedef void (*test_fn)(void);
/* kind: 0 single process, 1 MPI (run at np 1, 2, 4), 2 GPU (only with --gpu) */
void test_register(const char *name, test_fn fn, int kind);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int test_failed(void);               /* has the current test failed so far */
const char *test_golden_dir(void);   /* $TPGEN_GOLDEN, else build/golden (tests/unpack-golden.sh) */
const char *test_tmp_dir(void);      /* a fresh per-process temporary folder */
unsigned test_seed(void);            /* per-run random seed (printed on failure) */

#define TEST_(name, mpi) \
    static void name(void); \
    __attribute__((constructor)) static void reg_##name(void) { test_register(#name, name, mpi); } \
    static void name(void)
#define TEST(name) TEST_(name, 0)
#define TEST_MPI(name) TEST_(name, 1)
#define TEST_GPU(name) TEST_(name, 2)

#define CHECK(cond, ...) do { if (!(cond)) { test_fail(__FILE__, __LINE__, __VA_ARGS__); } } while (0)
#define REQUIRE(cond, ...) do { if (!(cond)) { test_fail(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)

/* 1 in the ASan + UBSan build (make asan): its run is for memory errors, undefined behaviour and leaks, so a
 * randomised test may draw fewer cases there (every code path still runs); the release build draws them all */
#ifdef __SANITIZE_ADDRESS__
#define TEST_SANITIZED 1
#else
#define TEST_SANITIZED 0
#endif

/* relative L2 error ||a-b|| / ||b|| in double */
double rel_l2(const float *a, const float *b, size_t n);
double max_abs_diff(const float *a, const float *b, size_t n);

#endif

/* test_param.c — FLEXCOLL_* integer parameters (lib/param.c): what is accepted, what falls back
 * to the default, and that a value is read once.  Each value goes through fc_param_int_load
 * with its own cache, as FC_PARAM_INT gives every parameter. */
#define _GNU_SOURCE
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "param.h"

#define VAR "FLEXCOLL_TEST_PARAM"
#define DEFAULT_VALUE 12345

/* The value a fresh parameter with this environment string takes (NULL: unset). */
static int64_t load(const char *value) {
  if (value) setenv(VAR, value, 1);
  else unsetenv(VAR);
  int64_t cache = 0;
  int state = 0;
  return fc_param_int_load(VAR, DEFAULT_VALUE, &cache, &state);
}

START_TEST(test_plain_integers) {
  ck_assert_int_eq(load(NULL), DEFAULT_VALUE);
  ck_assert_int_eq(load(""), DEFAULT_VALUE);
  ck_assert_int_eq(load("0"), 0);
  ck_assert_int_eq(load("65536"), 65536);
  ck_assert_int_eq(load("-1"), -1);
  ck_assert_int_eq(load("0x10"), 16);
}
END_TEST

START_TEST(test_size_suffixes) {
  ck_assert_int_eq(load("64K"), 64 << 10);
  ck_assert_int_eq(load("64k"), 64 << 10);
  ck_assert_int_eq(load("1M"), 1 << 20);
  ck_assert_int_eq(load("8m"), 8 << 20);
  ck_assert_int_eq(load("2G"), (int64_t)2 << 30);
  ck_assert_int_eq(load("0x10K"), 16 << 10);
}
END_TEST

START_TEST(test_rejected_values_keep_the_default) {
  static const char *const bad[] = {"abc", "12X", "1MB", "K", "1 M", "99999999999G", "-99999999999G", "1.5M"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(load(bad[i]) == DEFAULT_VALUE, "%s=\"%s\" gave %lld, not the default", VAR, bad[i],
                  (long long)load(bad[i]));
}
END_TEST

START_TEST(test_read_once) {
  setenv(VAR, "7", 1);
  int64_t cache = 0;
  int state = 0;
  ck_assert_int_eq(fc_param_int_load(VAR, DEFAULT_VALUE, &cache, &state), 7);
  setenv(VAR, "8", 1); /* too late: the first read is kept */
  ck_assert_int_eq(fc_param_int_load(VAR, DEFAULT_VALUE, &cache, &state), 7);
}
END_TEST

int main(void) {
  Suite *s = suite_create("param");
  TCase *tc = tcase_create("integers");
  tcase_add_test(tc, test_plain_integers);
  tcase_add_test(tc, test_size_suffixes);
  tcase_add_test(tc, test_rejected_values_keep_the_default);
  tcase_add_test(tc, test_read_once);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_host_pages.c — the memory type cache (lib/gpu/host_pages.c): a page noted as host memory
 * is known as such until anything in the process is unmapped, then no page is; each thread has
 * its own; FLEXCOLL_MEM_TYPE_CACHE=0 keeps nothing.  Every test runs in its own forked process
 * (Check's default), so each starts with the cache not yet installed. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpu/gpu.h"

/* The cache needs UCM's unmap events; where a build's UCX gives none, every test checks only
 * that nothing is remembered. */
static int cache_on(void) {
  if (fc_host_pages_epoch() != UINT64_MAX) return 1;
  fprintf(stderr, "test_host_pages: UCM gives no unmap events here: only 'nothing is remembered' is checked\n");
  return 0;
}

static char *map_pages(size_t n) {
  char *p = mmap(NULL, n * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(p, MAP_FAILED);
  return p;
}

START_TEST(test_noted_page_is_known_until_an_unmap) {
  char *a = map_pages(4), *b = map_pages(1);
  ck_assert(!fc_host_pages_known(a));
  fc_host_pages_note(a + 100, fc_host_pages_epoch());
  if (!cache_on()) {
    ck_assert(!fc_host_pages_known(a + 100));
    munmap(a, 4 * 4096);
    munmap(b, 4096);
    return;
  }
  ck_assert(fc_host_pages_known(a + 100));
  ck_assert(fc_host_pages_known(a));          /* the same page */
  ck_assert(!fc_host_pages_known(a + 4096)); /* the next page was never asked about */
  ck_assert(!fc_host_pages_known(b));
  /* Unmapping other memory forgets every page: nothing says which address CUDA may take next. */
  munmap(b, 4096);
  ck_assert(!fc_host_pages_known(a));
  fc_host_pages_note(a, fc_host_pages_epoch());
  ck_assert(fc_host_pages_known(a));
  munmap(a, 4 * 4096);
  ck_assert(!fc_host_pages_known(a));
}
END_TEST

/* An answer taken under an older count (CUDA was asked, then something was unmapped before the
 * answer was noted) is not trusted. */
START_TEST(test_answer_noted_under_an_old_count_is_not_known) {
  if (!cache_on()) return;
  char *a = map_pages(1), *b = map_pages(1);
  const uint64_t before = fc_host_pages_epoch();
  munmap(b, 4096);
  ck_assert_uint_gt(fc_host_pages_epoch(), before);
  fc_host_pages_note(a, before);
  ck_assert(!fc_host_pages_known(a));
  munmap(a, 4096);
}
END_TEST

/* Freeing a large malloc'd buffer (glibc unmaps it) forgets too: a buffer freed and its address
 * reused must be asked about again. */
START_TEST(test_free_of_a_large_buffer_forgets) {
  if (!cache_on()) return;
  char *keep = malloc(64);
  char *big = malloc(64 << 20); /* above glibc's mmap threshold */
  ck_assert_ptr_nonnull(big);
  big[0] = 1;
  fc_host_pages_note(keep, fc_host_pages_epoch());
  ck_assert(fc_host_pages_known(keep));
  free(big);
  ck_assert(!fc_host_pages_known(keep));
  free(keep);
}
END_TEST

static void *other_thread(void *arg) {
  return (void *)(intptr_t)fc_host_pages_known(arg);
}

START_TEST(test_each_thread_has_its_own_pages) {
  if (!cache_on()) return;
  char *a = map_pages(1);
  fc_host_pages_note(a, fc_host_pages_epoch());
  ck_assert(fc_host_pages_known(a));
  pthread_t t;
  void *known = NULL;
  ck_assert_int_eq(pthread_create(&t, NULL, other_thread, a), 0);
  pthread_join(t, &known);
  ck_assert_int_eq((int)(intptr_t)known, 0);
  munmap(a, 4096);
}
END_TEST

/* Pages that land in the same slot replace each other; a page never noted is never known. */
START_TEST(test_many_pages_replace_each_other) {
  if (!cache_on()) return;
  const size_t n = 256;
  char *a = map_pages(n);
  const uint64_t e = fc_host_pages_epoch();
  for (size_t i = 0; i < n; i++) fc_host_pages_note(a + i * 4096, e);
  size_t known = 0;
  for (size_t i = 0; i < n; i++) known += (size_t)fc_host_pages_known(a + i * 4096);
  ck_assert_uint_ge(known, 1);
  ck_assert_uint_le(known, 16);
  ck_assert(fc_host_pages_known(a + (n - 1) * 4096)); /* the last one noted is there */
  munmap(a, n * 4096);
}
END_TEST

START_TEST(test_off_keeps_nothing) {
  setenv("FLEXCOLL_MEM_TYPE_CACHE", "0", 1);
  ck_assert_uint_eq(fc_host_pages_epoch(), UINT64_MAX);
  char *a = map_pages(1);
  fc_host_pages_note(a, fc_host_pages_epoch());
  fc_host_pages_note(a, 0);
  ck_assert(!fc_host_pages_known(a));
  munmap(a, 4096);
}
END_TEST

int main(void) {
  Suite *s = suite_create("host_pages");
  TCase *tc = tcase_create("cache");
  tcase_add_test(tc, test_noted_page_is_known_until_an_unmap);
  tcase_add_test(tc, test_answer_noted_under_an_old_count_is_not_known);
  tcase_add_test(tc, test_free_of_a_large_buffer_forgets);
  tcase_add_test(tc, test_each_thread_has_its_own_pages);
  tcase_add_test(tc, test_many_pages_replace_each_other);
  tcase_add_test(tc, test_off_keeps_nothing);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK); /* each test with the cache not yet installed */
  srunner_run_all(sr, CK_ENV);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

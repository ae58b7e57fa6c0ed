/* test_rcache.c — the rdma link's registration caches (lib/transports/rdma_rcache.c) on their own,
 * without a NIC or a GPU: the device cache's rules, which otherwise run only on a GPU node.
 *
 * rdma_rcache.c is compiled into this program with stand-ins for what it calls outside itself:
 * fc_gpu_alloc_of (CUDA's answer about an address: a table of pretend allocations that the
 * cases allocate, free and allocate again at the same address), fc_rdma_reg_device (a
 * registration that records its range and access, or fails on demand) and the verbs table's
 * reg_mr and dereg_mr (host registrations, and every deregistration counted).  The cases:
 *   - a device allocation registered once, whole, for every buffer carved from it;
 *   - freed and allocated again at the same address (a new buffer id): registered anew, never
 *     served from the old entry, which the next miss deregisters (not while a message holds it);
 *   - pool and virtual-memory allocations (not plain cudaMalloc), unknown memory and a bound of
 *     0: a registration per message, deregistered when given back;
 *   - an allocation larger than a quarter of the bound, or a request running past its
 *     allocation's end: the request's range only;
 *   - access: a receive's registration serves a send, not the other way round;
 *   - the bound: least recently used entries nobody holds deregistered beyond it;
 *   - a failed registration: NULL with the reason, nothing kept;
 *   - the host cache beside it: ranges by whole pages, keyed by address alone. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "transports/rdma_dev.h"
#include "transports/rdma_rcache.h"

/* ---- stand-ins ------------------------------------------------------------------------------- */

#define MAX_ALLOCS 16
static struct {
  fc_gpu_alloc_t a;
  int live;
} allocs[MAX_ALLOCS];
static unsigned long long next_id = 100;
static int regs, deregs, fail_next;
static uintptr_t last_lo;
static size_t last_len;
static int last_access;

static void reset(void) {
  memset(allocs, 0, sizeof allocs);
  regs = deregs = fail_next = 0;
  last_lo = 0;
  last_len = 0;
  last_access = -1;
}

/* A pretend allocation at base (a fresh buffer id each time, as CUDA gives). */
static int pretend_alloc(uintptr_t base, size_t size, int plain) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].live) {
      allocs[i].a = (fc_gpu_alloc_t){.base = base, .size = size, .id = next_id++, .plain = plain};
      allocs[i].live = 1;
      return i;
    }
  ck_abort_msg("too many pretend allocations");
  return -1;
}

static void pretend_free(int i) { allocs[i].live = 0; }

int fc_gpu_alloc_of(const void *ptr, fc_gpu_alloc_t *a) {
  const uintptr_t p = (uintptr_t)ptr;
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].live && p >= allocs[i].a.base && p < allocs[i].a.base + allocs[i].a.size) {
      *a = allocs[i].a;
      return 0;
    }
  return -1;
}

static struct ibv_mr *new_mr(void *addr, size_t length, int access) {
  if (fail_next) {
    fail_next = 0;
    errno = EFAULT;
    return NULL;
  }
  struct ibv_mr *mr = calloc(1, sizeof *mr);
  mr->addr = addr;
  mr->length = length;
  regs++;
  last_lo = (uintptr_t)addr;
  last_len = length;
  last_access = access;
  return mr;
}

struct ibv_mr *fc_rdma_reg_device(const fc_verbs_t *v, struct ibv_pd *pd, void *buf, size_t bytes, int access, int *how,
                                  char *why, size_t len) {
  (void)v, (void)pd;
  struct ibv_mr *mr = new_mr(buf, bytes, access);
  *how = mr ? FC_RDMA_REG_DMABUF : FC_RDMA_REG_NONE;
  if (!mr) snprintf(why, len, "pretend export failed");
  return mr;
}

static struct ibv_mr *host_reg(struct ibv_pd *pd, void *addr, size_t length, int access) {
  (void)pd;
  return new_mr(addr, length, access);
}

static int host_dereg(struct ibv_mr *mr) {
  deregs++;
  free(mr);
  return 0;
}

static fc_verbs_t verbs = {.reg_mr = host_reg, .dereg_mr = host_dereg};

/* ---- helpers --------------------------------------------------------------------------------- */

#define MiB ((size_t)1 << 20)
#define GPU_BASE ((uintptr_t)0x7f0000000000ull) /* never touched: the stand-ins only compare */
#define RECV (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct ibv_mr *get(fc_rcache_t *c, uintptr_t buf, size_t len, int access, fc_rc_ent_t **ent) {
  char why[100] = "";
  int how = 0;
  struct ibv_mr *mr = fc_rcache_get_device(c, (void *)buf, len, access, ent, &how, why, sizeof why);
  if (mr) ck_assert_int_eq(how, FC_RDMA_REG_DMABUF);
  return mr;
}

/* A message's registration: taken and given back. */
static void use(fc_rcache_t *c, uintptr_t buf, size_t len, int access) {
  fc_rc_ent_t *e;
  ck_assert_ptr_nonnull(get(c, buf, len, access, &e));
  fc_rcache_put(c, e, 0);
}

static fc_rcache_stats_t stats(fc_rcache_t *c) {
  fc_rcache_stats_t s;
  fc_rcache_stats(c, &s);
  return s;
}

/* ---- cases ----------------------------------------------------------------------------------- */

START_TEST(test_one_registration_per_allocation) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 8 * MiB + 3, 1);
  fc_rc_ent_t *e1, *e2;
  ck_assert_ptr_nonnull(get(c, GPU_BASE + 3, 1 * MiB, RECV, &e1));
  ck_assert_int_eq(regs, 1);
  ck_assert_msg(last_lo == GPU_BASE && last_len == 8 * MiB + 3, "registered %#lx + %zu, not the whole allocation",
                (unsigned long)last_lo, last_len);
  /* Held or given back, another buffer of the same allocation finds it. */
  ck_assert_ptr_nonnull(get(c, GPU_BASE + 5 * MiB, 3 * MiB + 3, RECV, &e2));
  fc_rcache_put(c, e1, 0);
  fc_rcache_put(c, e2, 0);
  use(c, GPU_BASE + 100, 17, 0);
  ck_assert_int_eq(regs, 1);
  ck_assert_int_eq(deregs, 0);
  ck_assert_uint_eq(stats(c).hits, 2);
  ck_assert_uint_eq(stats(c).misses, 1);
  fc_rcache_free(c);
  ck_assert_int_eq(deregs, 1);
}
END_TEST

START_TEST(test_reallocated_at_the_same_address) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  int a = pretend_alloc(GPU_BASE, 4 * MiB, 1);
  fc_rc_ent_t *e;
  use(c, GPU_BASE, MiB, 0);
  pretend_free(a);
  pretend_alloc(GPU_BASE, 4 * MiB, 1); /* the same address, other memory */
  ck_assert_ptr_nonnull(get(c, GPU_BASE, MiB, 0, &e));
  ck_assert_msg(regs == 2, "a reallocated buffer was served from the freed one's registration (%d registrations)", regs);
  ck_assert_msg(deregs == 1, "the freed allocation's entry is still registered (%d deregistrations)", deregs);
  ck_assert_uint_eq(stats(c).stale, 1);
  ck_assert_uint_eq(stats(c).entries, 1);
  fc_rcache_put(c, e, 0);
  fc_rcache_free(c);
  ck_assert_int_eq(deregs, 2);
}
END_TEST

START_TEST(test_freed_entry_held_by_a_message_stays) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  int a = pretend_alloc(GPU_BASE, 4 * MiB, 1);
  fc_rc_ent_t *held, *other;
  ck_assert_ptr_nonnull(get(c, GPU_BASE, MiB, 0, &held));
  pretend_free(a);
  pretend_alloc(GPU_BASE + 64 * MiB, 4 * MiB, 1);
  ck_assert_ptr_nonnull(get(c, GPU_BASE + 64 * MiB, MiB, 0, &other));
  ck_assert_msg(deregs == 0, "an entry a message still holds was deregistered");
  fc_rcache_put(c, held, 0);
  fc_rcache_put(c, other, 0);
  /* The next miss sweeps it. */
  pretend_alloc(GPU_BASE + 128 * MiB, 4 * MiB, 1);
  use(c, GPU_BASE + 128 * MiB, MiB, 0);
  ck_assert_int_eq(deregs, 1);
  fc_rcache_free(c);
  ck_assert_int_eq(deregs, 3);
}
END_TEST

START_TEST(test_per_message_where_nothing_tells_a_reallocation) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 4 * MiB, 0); /* a pool's piece, or a virtual-memory mapping */
  fc_rc_ent_t *e;
  for (int i = 0; i < 3; i++) {
    ck_assert_ptr_nonnull(get(c, GPU_BASE + 4096, MiB, 0, &e));
    ck_assert_msg(last_lo == GPU_BASE + 4096 && last_len == MiB, "not the request's range");
    fc_rcache_put(c, e, 0);
  }
  /* Memory CUDA does not know (the stand-in has no allocation there). */
  use(c, GPU_BASE + 512 * MiB, MiB, 0);
  ck_assert_int_eq(regs, 4);
  ck_assert_int_eq(deregs, 4);
  ck_assert_uint_eq(stats(c).entries, 0);
  fc_rcache_free(c);

  reset();
  c = fc_rcache_new_device(&verbs, NULL, 0); /* FLEXCOLL_RDMA_RCACHE_BYTES=0 */
  pretend_alloc(GPU_BASE, 4 * MiB, 1);
  for (int i = 0; i < 2; i++) {
    ck_assert_ptr_nonnull(get(c, GPU_BASE, MiB, 0, &e));
    ck_assert_msg(last_len == MiB, "with no bound, the whole allocation was registered");
    fc_rcache_put(c, e, 0);
  }
  ck_assert_int_eq(regs, 2);
  ck_assert_int_eq(deregs, 2);
  fc_rcache_free(c);
}
END_TEST

START_TEST(test_large_allocation_by_request) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 17 * MiB, 1); /* more than a quarter of the bound */
  fc_rc_ent_t *e;
  ck_assert_ptr_nonnull(get(c, GPU_BASE + MiB, 2 * MiB, 0, &e));
  ck_assert_msg(last_lo == GPU_BASE + MiB && last_len == 2 * MiB, "not the request's range");
  fc_rcache_put(c, e, 0);
  use(c, GPU_BASE + MiB + 5, MiB, 0); /* inside it: a hit */
  ck_assert_int_eq(regs, 1);
  use(c, GPU_BASE + 8 * MiB, MiB, 0); /* elsewhere: its own */
  ck_assert_int_eq(regs, 2);
  ck_assert_uint_eq(stats(c).entries, 2);
  fc_rcache_free(c);
}
END_TEST

START_TEST(test_request_beyond_its_allocation) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 4 * MiB, 1);
  fc_rc_ent_t *e;
  /* A buffer that runs past its allocation's end: the whole allocation would not cover it, so
   * the registration is the request's own (the export, not the cache, then refuses what it must). */
  ck_assert_ptr_nonnull(get(c, GPU_BASE + 3 * MiB, 2 * MiB, 0, &e));
  ck_assert_msg(last_lo == GPU_BASE + 3 * MiB && last_len == 2 * MiB, "registered %#lx + %zu, not the request",
                (unsigned long)last_lo, last_len);
  fc_rcache_put(c, e, 0);
  fc_rcache_free(c);
}
END_TEST

START_TEST(test_access) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 4 * MiB, 1);
  pretend_alloc(GPU_BASE + 64 * MiB, 4 * MiB, 1);
  fc_rc_ent_t *e;
  use(c, GPU_BASE, MiB, RECV); /* a receive's */
  use(c, GPU_BASE, MiB, 0); /* serves a send */
  ck_assert_int_eq(regs, 1);
  use(c, GPU_BASE + 64 * MiB, MiB, 0); /* a send's */
  ck_assert_ptr_nonnull(get(c, GPU_BASE + 64 * MiB, MiB, RECV, &e)); /* does not serve a receive */
  ck_assert_int_eq(last_access, RECV);
  fc_rcache_put(c, e, 0);
  ck_assert_int_eq(regs, 3);
  fc_rcache_free(c);
}
END_TEST

START_TEST(test_bound_evicts_least_recently_used) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 16 * MiB); /* whole allocations up to 4 MiB */
  for (int i = 0; i < 5; i++) pretend_alloc(GPU_BASE + (uintptr_t)i * 64 * MiB, 4 * MiB, 1);
  for (int i = 0; i < 4; i++) use(c, GPU_BASE + (uintptr_t)i * 64 * MiB, MiB, 0);
  use(c, GPU_BASE, MiB, 0); /* allocation 0 used again: most recent */
  use(c, GPU_BASE + 4 * 64 * MiB, MiB, 0); /* a fifth: 20 MiB > 16 */
  ck_assert_int_eq(deregs, 1);
  ck_assert_uint_eq(stats(c).evictions, 1);
  ck_assert_uint_eq(stats(c).bytes, 16 * MiB);
  use(c, GPU_BASE, MiB, 0); /* kept */
  ck_assert_int_eq(regs, 5);
  use(c, GPU_BASE + 64 * MiB, MiB, 0); /* allocation 1 was the one to go */
  ck_assert_int_eq(regs, 6);
  fc_rcache_free(c);
  ck_assert_int_eq(regs, deregs);
}
END_TEST

START_TEST(test_failed_registration) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 4 * MiB, 1);
  fc_rc_ent_t *e = (fc_rc_ent_t *)1;
  char why[100] = "";
  int how = 0;
  fail_next = 1;
  ck_assert_ptr_null(fc_rcache_get_device(c, (void *)GPU_BASE, MiB, 0, &e, &how, why, sizeof why));
  ck_assert_ptr_null(e);
  ck_assert_int_eq(how, FC_RDMA_REG_NONE);
  ck_assert_msg(strstr(why, "pretend export failed"), "the reason is lost: \"%s\"", why);
  ck_assert_uint_eq(stats(c).entries, 0);
  use(c, GPU_BASE, MiB, 0); /* the next one tries again */
  ck_assert_int_eq(regs, 1);
  fc_rcache_free(c);
  ck_assert_int_eq(deregs, 1);
}
END_TEST

START_TEST(test_invalidated_entry_goes_when_given_back) {
  reset();
  fc_rcache_t *c = fc_rcache_new_device(&verbs, NULL, 64 * MiB);
  pretend_alloc(GPU_BASE, 4 * MiB, 1);
  fc_rc_ent_t *a, *b;
  ck_assert_ptr_nonnull(get(c, GPU_BASE, MiB, RECV, &a));
  ck_assert_ptr_nonnull(get(c, GPU_BASE + MiB, MiB, RECV, &b));
  fc_rcache_put(c, a, 1); /* a receive given up: never handed out again */
  ck_assert_int_eq(deregs, 0); /* b still holds it */
  fc_rcache_put(c, b, 0);
  ck_assert_int_eq(deregs, 1);
  use(c, GPU_BASE, MiB, RECV);
  ck_assert_int_eq(regs, 2);
  fc_rcache_free(c);
}
END_TEST

START_TEST(test_host_cache_by_pages) {
  reset();
  fc_rcache_t *c = fc_rcache_new(&verbs, NULL, 64 * MiB, 0);
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t buf = 0x10000000 + 3;
  fc_rc_ent_t *e;
  ck_assert_ptr_nonnull(fc_rcache_get(c, (void *)buf, 10, 0, &e));
  ck_assert_msg(last_lo == (buf & ~(page - 1)) && last_len == page, "not whole pages");
  fc_rcache_put(c, e, 0);
  ck_assert_ptr_nonnull(fc_rcache_get(c, (void *)(buf + 100), 10, 0, &e)); /* the same page: a hit */
  fc_rcache_put(c, e, 0);
  ck_assert_int_eq(regs, 1);
  fc_rcache_free(c);
  ck_assert_int_eq(deregs, 1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rcache");
  TCase *tc = tcase_create("device");
  tcase_add_test(tc, test_one_registration_per_allocation);
  tcase_add_test(tc, test_reallocated_at_the_same_address);
  tcase_add_test(tc, test_freed_entry_held_by_a_message_stays);
  tcase_add_test(tc, test_per_message_where_nothing_tells_a_reallocation);
  tcase_add_test(tc, test_large_allocation_by_request);
  tcase_add_test(tc, test_request_beyond_its_allocation);
  tcase_add_test(tc, test_access);
  tcase_add_test(tc, test_bound_evicts_least_recently_used);
  tcase_add_test(tc, test_failed_registration);
  tcase_add_test(tc, test_invalidated_entry_goes_when_given_back);
  suite_add_tcase(s, tc);
  TCase *th = tcase_create("host");
  tcase_add_test(th, test_host_cache_by_pages);
  suite_add_tcase(s, th);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

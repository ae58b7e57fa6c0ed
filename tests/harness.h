/* harness.h — shared helpers of the API tests (test_coll, test_api, test_failure): run ranks as
 * forked processes or as threads of one process, reproducible random inputs, a float64 / exact
 * integer reference of every reduction, and buffer checks (poison, guards, tolerance).
 *
 * Ranks
 *   hx_run_procs   forks nranks processes, THEN creates the unique id(s) with
 *                  flexcoll_get_unique_id (the parent serves the rendezvous) and hands them to the
 *                  children through a pipe: no thread runs in the parent when it forks (a fork
 *                  while another thread holds a lock, as ASan's allocator is while a thread
 *                  starts, leaves the child hanging in ucp_init); each child sets
 *                  the environment (FLEXCOLL_ALGO, FLEXCOLL_TIMEOUT_MS, ...), calls
 *                  flexcoll_comm_init_rank with its rank, runs the callback, destroys its
 *                  communicators and exits 0 (success) or 1.
 *   hx_run_threads forks ONE process that calls flexcoll_comm_init_all(comms, nranks, NULL) and runs
 *                  the callback in one pthread per communicator, which then destroys its
 *                  communicator.  The process hides the GPUs
 *                  (CUDA_VISIBLE_DEVICES="") so that the ranks are host ranks on every machine.
 *   hx_run_process forks one process that runs a plain function (group tests, custom set-ups).
 *   By default each rank destroys its communicators as soon as its callback returns, as real
 *   programs do: a rank whose last calls only sent may leave while its peers still receive, which
 *   the library must tolerate (test_coll's early_destroy case checks it on purpose).
 *   hx_opts_t.exit_barrier makes the ranks wait for each other first (shared memory / a counter,
 *   never the library), for tests where an early exit must not be a factor.
 *   In all three the parent waits until a deadline (cut to the ranks' timeout + 15 s once one rank
 *   has failed), then prints the stacks of what is left (gdb, when installed; FC_TEST_BACKTRACE=0
 *   turns it off), SIGKILLs it, and returns 1 when every rank (process) succeeded, else 0, after
 *   printing why to stderr.  Children die with
 *   the parent (PR_SET_PDEATHSIG).  Environment variables are set in the children only, before any
 *   library call there: the library reads most of them once per process.
 *
 * Data
 *   Element j of the input of rank r in call c is a pure function of (seed, c, r, j): every rank can
 *   compute every other rank's inputs, hence the reference, without communication.  The seed comes
 *   from FC_TEST_SEED if set, else from the time and pid; it is printed with every failure so that
 *   `FC_TEST_SEED=0x... ./tests/test_xxx` reproduces the run.
 *   What the values look like depends on the reduction (hx_gen_t): random bits for data movement,
 *   [-4, 4] for float sums (float16 cannot overflow), [0.5, 1.5] and small integers for products.
 *
 * Checks print the first few mismatches of a call with the call's description (hx_rank_t.what),
 * the rank and the seed, and return the number of bad elements; hx_rank_t.errors counts them.
 * Never use ck_assert in a rank: ranks are other processes / threads.
 */
#ifndef FC_TEST_HARNESS_H
#define FC_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "flexcoll.h"

#define HX_MAX_COMMS 4
#define HX_GUARD 64         /* poisoned bytes before and after every hx_buf_t */
#define HX_POISON 0xA5      /* the poison byte */
#define HX_MAX_REPORTS 20   /* mismatch lines printed per rank before going quiet */

/* One rank, as the callback sees it. */
typedef struct hx_rank {
  int rank, nranks;
  flexcoll_comm_t comm;                  /* == comms[0] */
  flexcoll_comm_t comms[HX_MAX_COMMS];   /* hx_opts_t.ncomms communicators (procs mode) */
  int ncomms;
  int thread_mode;                       /* 1: a thread of hx_run_threads, 0: a process */
  uint64_t seed;                         /* the run's seed (hx_seed() ^ the case's salt) */
  const char *label;                     /* the case, for messages */
  const char *algo;                      /* FLEXCOLL_ALGO of this run, NULL: unset */
  void *arg;                             /* the caller's */
  char what[256];                        /* description of the current call, for messages */
  long errors;                           /* mismatches and failed calls so far */
  int reports;                           /* lines printed so far */
} hx_rank_t;

/* A rank's work: 0 on success, nonzero on failure.  (Any r->errors also counts as failure.) */
typedef int (*hx_rank_fn)(hx_rank_t *r);
/* A whole process's work (hx_run_process): 0 on success. */
typedef int (*hx_proc_fn)(void *arg);

typedef struct {
  const char *label;  /* the case's name in messages and timing lines (required) */
  const char *algo;   /* FLEXCOLL_ALGO for the ranks; NULL: leave unset */
  int ncomms;         /* procs mode: communicators per rank, created in order (0 means 1) */
  double deadline_s;  /* kill the ranks after this long (0: 300 s) */
  int timeout_ms;     /* FLEXCOLL_TIMEOUT_MS for the ranks (0: 60000; < 0: leave unset) */
  const char *const *env; /* more "NAME=value" settings for the children, NULL-terminated, or NULL */
  int expect_fail;    /* procs/threads: 1 when some rank is expected to fail (no failure banner) */
  int exit_barrier;   /* 1: ranks wait for each other (outside the library) before destroying */
  int hosts;          /* procs: > 1: rank r runs as host "hx-host-<r mod hosts>" (FLEXCOLL_HOSTID) */
} hx_opts_t;

/* The seed of this process: FC_TEST_SEED (any strtoull base) or time ^ pid; printed once. */
uint64_t hx_seed(void);
/* splitmix64's finaliser: a well-mixed 64-bit function of x, for draws every rank makes alike. */
uint64_t hx_mix64(uint64_t x);
/* A 64-bit hash of a string, to salt the seed per case. */
uint64_t hx_hash_str(const char *s);
/* Wall-clock seconds (monotonic). */
double hx_now(void);

/* Run nranks ranks; returns 1 when all succeeded (exit 0 in time), else 0.  Prints one timing
 * line per run to stderr ("[hx] label: N ranks ... s"). */
int hx_run_procs(int nranks, const hx_opts_t *opts, hx_rank_fn fn, void *arg);
int hx_run_threads(int nranks, const hx_opts_t *opts, hx_rank_fn fn, void *arg);
int hx_run_process(const hx_opts_t *opts, hx_proc_fn fn, void *arg);

/* Fill r as hx_run_* do for rank `rank` of nranks (seed salted by opts->label; no communicator):
 * for hx_proc_fn bodies that report through hx_fail and the checks. */
void hx_rank_init(hx_rank_t *r, const hx_opts_t *opts, int rank, int nranks, void *arg);

/* Destroy n communicators of this process at once, one thread each: a healthy communicator's
 * destroy may wait for its peers (up to its timeout), so ranks that live in one process must not be
 * destroyed one after the other from one thread.  Returns 1 when every destroy succeeded. */
int hx_destroy_concurrently(flexcoll_comm_t *comms, int n);

/* Apply opts' environment (FLEXCOLL_ALGO, FLEXCOLL_TIMEOUT_MS, env) to this process; for
 * hx_proc_fn bodies that fork further or for custom set-ups.  hx_run_* call it in their children. */
void hx_apply_env(const hx_opts_t *opts);

/* Report a failure of r (printf-like), with r->what, rank and seed; counts in r->errors.
 * Returns 1 so that `return hx_fail(...)` reads naturally. */
int hx_fail(hx_rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Check a library result; on failure report it with flexcoll_get_last_error(comm).  Returns 1 on
 * success, 0 on failure. */
int hx_ok(hx_rank_t *r, flexcoll_result_t res, flexcoll_comm_t comm, const char *call);

/* Results compared across runs (bitwise equality whatever the links carried): a digest of a
 * buffer (NULL: of nothing), and whether every rank's file of digests <dir>/<a>.rank<q> equals
 * <dir>/<b>.rank<q> line for line (not empty); the first difference goes to stderr, tagged. */
uint64_t hx_digest(const void *buf, size_t bytes);
int hx_same_digests(const char *tag, const char *dir, int nranks, const char *a, const char *b);

/* Which way a collective went, from what it sent: a float32 allgather (rs 0) or sum reduce_scatter
 * (rs 1) of `block` elements per rank on small integers ((i * 3 + rank * 5) % 11 at element i of
 * send: exact whatever the order of the sums), every element checked, and the bytes this rank sent
 * to each peer during the call (the link statistics) into sent[nranks] (nranks <= 64).  send holds
 * nranks * block floats (the allgather reads the first block), recv max(nranks, 2) * block.
 * 0 on success, else 1 with why filled. */
int hx_small_ints_call(flexcoll_comm_t comm, int rank, int nranks, int rs, size_t block, float *send, float *recv,
                       unsigned long long *sent, char *why, size_t len);

/* ---- what a process holds (leak checks) ---------------------------------------------------- */

/* Entries of a directory whose names start with prefix ("" for all), without "." and ".."; -1
 * when it cannot be read. */
int hx_count_entries(const char *dir, const char *prefix);
/* An idle link's progress threads park: two host ranks as threads of this process (GPUs hidden;
 * the links as the environment says) run a checked allreduce, which starts the link's threads,
 * named prefix... (flexcoll-tcp, flexcoll-rdma); then their wake-ups (voluntary context switches)
 * in the quietest of up to eight idle seconds (fewer once a second stays under most / 10) are
 * printed and must be at most `most` (threads park after about a second, later on a loaded
 * machine), with one thread per rank; a second allreduce checks the link still works, and both
 * ranks are destroyed.  1 when all holds, else 0 with what failed on stderr. */
int hx_threads_park(const char *prefix, long most);
/* Open file descriptors of this process (without the one that counts them); -1 unreadable. */
int hx_open_fds(void);
/* The names in dir starting with prefix, each allocated, *n of them (NULL and 0 when none or
 * unreadable); hx_names_free releases them. */
char **hx_list_names(const char *dir, const char *prefix, int *n);
void hx_names_free(char **names, int n);

/* ---- data --------------------------------------------------------------------------------- */

typedef enum {
  HX_GEN_BITS,   /* random bits (data movement: allgather, broadcast); compared bitwise */
  HX_GEN_SUM,    /* integers: random bits (wrap-around is part of the test); floats: [-4, 4] */
  HX_GEN_PROD,   /* integers: +-1..4 (signed) or 1..4; floats: [0.5, 1.5] */
  HX_GEN_MAXMIN  /* integers: random bits; floats: [-1000, 1000] */
} hx_gen_t;

/* The generator that suits op (SUM and AVG: HX_GEN_SUM, ...). */
hx_gen_t hx_gen_for_op(flexcoll_op_t op);

/* The inputs of one call. */
typedef struct {
  flexcoll_datatype_t dtype;
  hx_gen_t gen;
  uint64_t seed;  /* hx_rank_t.seed */
  uint64_t call;  /* the call's index: every rank numbers its calls the same way */
  int nranks;
} hx_data_t;

/* Element j of rank's input: its bits into out (the element's size) and its value in *val
 * (floats: the value after rounding to dtype; integers: the value as a double, unused). */
void hx_elem(const hx_data_t *d, int rank, size_t j, void *out, double *val);
/* buf[i] = element first+i of rank's input, i < count. */
void hx_fill(const hx_data_t *d, int rank, void *buf, size_t first, size_t count);
/* Check buf[i] == element first+i of src_rank's input, bitwise.  Returns the mismatches. */
size_t hx_check_input(hx_rank_t *r, const char *where, const hx_data_t *d, int src_rank, const void *buf,
                      size_t first, size_t count);
/* Check buf[i] == op over all ranks of element first+i: integers exactly (wrapping in the type;
 * AVG = wrapped sum / nranks truncated toward zero), floats against a float64 reference within
 * hx_tolerance relative to the magnitude (sum of |x| for SUM/AVG, |result| for PROD), MAX/MIN
 * exactly.  Returns the mismatches. */
size_t hx_check_reduced(hx_rank_t *r, const char *where, const hx_data_t *d, flexcoll_op_t op, const void *buf,
                        size_t first, size_t count);
/* Check buf[q*count + i] == element i of rank q's input for every rank q (allgather). */
size_t hx_check_gathered(hx_rank_t *r, const char *where, const hx_data_t *d, const void *buf, size_t count);
/* Relative tolerance of a float reduction over nranks values (0 for integers): 2 (nranks+1) u,
 * u the unit roundoff of dtype: a rigorous bound on recursive or tree summation, products and
 * AVG's final division, with a factor 2 to spare. */
double hx_tolerance(flexcoll_datatype_t dtype, int nranks);

/* ---- buffers ------------------------------------------------------------------------------- */

/* A heap buffer of `bytes` (64-byte aligned) with HX_GUARD poisoned bytes on both sides. */
typedef struct {
  unsigned char *base;
  size_t bytes;
} hx_buf_t;

/* Allocate, poison everything (guards included) and return the user pointer; NULL (after
 * reporting) when out of memory.  bytes may be 0. */
void *hx_buf_new(hx_rank_t *r, hx_buf_t *b, size_t bytes);
void *hx_buf_ptr(const hx_buf_t *b);
void hx_buf_free(hx_buf_t *b);
/* Poison the user bytes [off, off+len) of b. */
void hx_buf_poison(hx_buf_t *b, size_t off, size_t len);
/* Check the guards of b are intact (nothing was written outside it).  Returns bad bytes. */
size_t hx_buf_check_guards(hx_rank_t *r, const char *where, const hx_buf_t *b);
/* Check buf[0, bytes) is all HX_POISON.  Returns bad bytes. */
size_t hx_check_poisoned(hx_rank_t *r, const char *where, const void *buf, size_t bytes);

#endif

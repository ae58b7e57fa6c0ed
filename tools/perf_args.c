/* perf_args.c — flexcoll-perf's command line.  Its users know nccl-tests, so a flag both tools have
 * means what it means in nccl-tests, and an nccl-tests flag that flexcoll-perf cannot honour is
 * refused by name rather than read as something else.  Every value is read strictly (the library's
 * fc_parse_int, K/M/G suffixes) and a bad one ends the run with its flag named and exit status 2. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "param.h"
#include "perf.h"

/* Long-only options: keys above any character. */
enum { OPT_COLL = 256, OPT_NRANKS, OPT_BASELINE, OPT_LINKS, OPT_PLOT, OPT_HIDDEN, OPT_TOP_K, OPT_EXPERTS, OPT_TOKENS, OPT_MOE_SYNC };

typedef struct {
  int key;          /* the short flag, or an OPT_* key */
  const char *name; /* the long name (nccl-tests' where it has the option) */
  const char *arg;  /* the value's name in --help; NULL: the option takes none */
  const char *help;
} perf_flag_t;

/* One table for getopt, for --help and for the names in error messages. */
static const perf_flag_t flags[] = {
    {OPT_COLL, "coll", "NAME", "allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, moe_dispatch or moe_combine (allreduce)"},
    {'b', "minbytes", "SIZE", "smallest size in bytes, K/M/G: binary multiples (8)"},
    {'e', "maxbytes", "SIZE", "largest size (64M)"},
    {'f', "stepfactor", "F", "multiply the size by F (> 1) from one size to the next (2)"},
    {'i', "stepbytes", "SIZE", "add SIZE from one size to the next, instead of -f"},
    {'n', "iters", "N", "timed iterations per size (20)"},
    {'w', "warmup_iters", "N", "untimed iterations before them (5)"},
    {'c', "check", "0|1", "check the results of each size's first calls (1)"},
    {'d', "datatype", "TYPE", "int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64 (float32)"},
    {'o', "op", "OP", "sum, prod, max, min or avg (sum)"},
    {'r', "root", "RANK", "root of broadcast and reduce (0)"},
    {'t', "nthreads", "N", "ranks as threads of this process: N threads (host memory: 2)"},
    {'g', "ngpus", "N", "device memory: N GPUs per thread, one rank each (all GPUs)"},
    {OPT_NRANKS, "nranks", "N", "N ranks in this process, instead of -t and -g"},
    {'m', "memory", "host|device", "the buffers' memory (device when a GPU is visible)"},
    {'a', "algo", "ring|tree|exchange|auto", "force an algorithm through FLEXCOLL_ALGO (auto)"},
    {'R', "local_register", "0|1|2", "buffers as symmetric windows (1; 2 is the same) or not (0); default 1 on device memory, 0 on host"},
    {'G', "cudagraph", "0", "launch N times a CUDA graph of the -n calls captured (device memory)"},
    {'J', "json", "FILE", "also write the results to FILE as JSON"},
    {OPT_BASELINE, "baseline", "nccl", "also run every size through NCCL (dlopen)"},
    {OPT_PLOT, "plot", "FILE.png", "draw busbw against size (and the links' shares) into FILE.png (needs zlib)"},
    {OPT_LINKS, "links", "LIST", "the links to use (FLEXCOLL_LINKS): nvlink,pcie,rdma,shm,tcp (all that work)"},
    {OPT_HIDDEN, "hidden", "N", "moe: elements per token (7168)"},
    {OPT_TOP_K, "top_k", "K", "moe: experts per token, 1..15 (8)"},
    {OPT_EXPERTS, "experts", "E", "moe: experts over all ranks, a multiple of the rank count (256)"},
    {OPT_TOKENS, "tokens", "N", "moe: tokens per rank, swept 1, f, f^2 ... up to N, f from -f (4096)"},
    {OPT_MOE_SYNC, "moe_sync", "MODE", "moe: fence, sentinel or auto (auto)"},
    {'h', "help", NULL, "print this help and exit"},
};
#define NFLAGS (sizeof flags / sizeof flags[0])

/* nccl-tests flags without a counterpart here: refused with what they are, never misread. */
static const struct {
  int key;
  const char *what;
} nccl_only[] = {
    {'p', "-p (nccl-tests' parallel init) is not supported"},
    {'z', "-z (nccl-tests' blocking collectives) is not supported"},
    {'y', "-y (nccl-tests' stream choice) is not supported"},
    {'T', "-T (nccl-tests' timeout) is not supported: set FLEXCOLL_TIMEOUT_MS"},
    {'C', "-C (nccl-tests' CPU time report) is not supported; the result check is -c 0|1"},
    {'F', "-F (nccl-tests' CSV file) is not supported; -J FILE writes JSON"},
};

void perf_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("flexcoll-perf: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n(flexcoll-perf --help lists the options)\n", stderr);
  exit(2);
}

/* "-n (--iters)" or "--coll": how an error names the option, whichever form was typed. */
static const char *flag_str(int key) {
  static char buf[64];
  for (size_t i = 0; i < NFLAGS; i++)
    if (flags[i].key == key) {
      if (key < 256) snprintf(buf, sizeof buf, "-%c (--%s)", key, flags[i].name);
      else snprintf(buf, sizeof buf, "--%s", flags[i].name);
      return buf;
    }
  snprintf(buf, sizeof buf, "-%c", key);
  return buf;
}

static void usage(void) {
  printf("usage: flexcoll-perf [options]   (see flexcoll-perf(1); defaults in parentheses)\n");
  for (size_t i = 0; i < NFLAGS; i++) {
    char left[48];
    const perf_flag_t *f = &flags[i];
    if (f->key < 256) snprintf(left, sizeof left, "-%c, --%s%s%s", f->key, f->name, f->arg ? " " : "", f->arg ? f->arg : "");
    else snprintf(left, sizeof left, "    --%s%s%s", f->name, f->arg ? " " : "", f->arg ? f->arg : "");
    printf("  %-32s %s\n", left, f->help);
  }
  exit(0);
}

/* what names the value; a size (in bytes) may end in K, M or G, which the message says. */
static int64_t int_value(int key, const char *v, int64_t min, int64_t max, const char *what) {
  int64_t x;
  if (fc_parse_int(v, &x))
    perf_usage_error("%s %s: %s must be an integer%s", flag_str(key), v, what,
                     strstr(what, "size") || strstr(what, "step") ? " of bytes, optionally with K, M or G" : "");
  if (x < min || x > max)
    perf_usage_error("%s %s: %s must be between %lld and %lld", flag_str(key), v, what, (long long)min, (long long)max);
  return x;
}

static double factor_value(int key, const char *v) {
  char *end = NULL;
  double x = strtod(v, &end);
  if (end == v || *end || !(x > 1) || x > 1e6)
    perf_usage_error("%s %s: the step factor must be a number above 1", flag_str(key), v);
  return x;
}

static int is_number(const char *v) {
  int64_t x;
  return fc_parse_int(v, &x) == 0;
}

/* Options whose value is a word; returns 0 when key is not one of them. */
/* --links: a comma list of link names, each known, handed to the library as FLEXCOLL_LINKS. */
static void links_option(const char *v) {
  static const char *const known[] = {"nvlink", "pcie", "rdma", "shm", "tcp"};
  char buf[128];
  if (!*v || strlen(v) >= sizeof buf) perf_usage_error("--links %s: a comma list of nvlink, pcie, rdma, shm, tcp", v);
  snprintf(buf, sizeof buf, "%s", v);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    size_t i = 0;
    while (i < sizeof known / sizeof known[0] && strcmp(known[i], tok)) i++;
    if (i == sizeof known / sizeof known[0]) perf_usage_error("--links %s: \"%s\" is not a link (nvlink, pcie, rdma, shm, tcp)", v, tok);
  }
  setenv("FLEXCOLL_LINKS", v, 1);
}

static int word_option(perf_opts_t *o, int key, const char *v) {
  switch (key) {
    case OPT_COLL:
      if (perf_coll_from_name(v) < 0)
        perf_usage_error("--coll %s: unknown collective; one of allreduce, allgather, reduce_scatter, broadcast, "
                         "reduce, alltoall, moe_dispatch, moe_combine", v);
      o->coll = v;
      return 1;
    case 'd':
      if (fc_dtype_from_name(v) < 0)
        perf_usage_error("%s %s: unknown type; one of int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 "
                         "float32 float64", flag_str(key), v);
      o->dtype = (flexcoll_datatype_t)fc_dtype_from_name(v);
      o->dtype_given = 1;
      return 1;
    case 'o':
      if (fc_op_from_name(v) < 0) perf_usage_error("%s %s: unknown reduction; one of sum prod max min avg", flag_str(key), v);
      o->op = (flexcoll_op_t)fc_op_from_name(v);
      return 1;
    case 'm':
      if (strcmp(v, "host") && strcmp(v, "device"))
        perf_usage_error("%s %s: the memory is host or device%s", flag_str(key), v,
                         is_number(v) ? " (nccl-tests' -m, aggregated iterations, is not supported)" : "");
      o->memory = v;
      return 1;
    case 'a':
      if (strcmp(v, "ring") && strcmp(v, "tree") && strcmp(v, "exchange") && strcmp(v, "auto"))
        perf_usage_error("%s %s: the algorithm is ring, tree, exchange or auto%s", flag_str(key), v,
                         is_number(v) ? " (nccl-tests' -a, averaging over ranks, is not supported)" : "");
      if (strcmp(v, "auto")) setenv("FLEXCOLL_ALGO", v, 1);
      return 1;
    case 'J': o->json = v; return 1;
    case OPT_BASELINE:
      if (strcmp(v, "nccl")) perf_usage_error("--baseline %s: the only baseline is nccl", v);
      o->baseline = v;
      return 1;
    case OPT_LINKS:
      links_option(v);
      return 1;
    case OPT_MOE_SYNC:
      if (!strcmp(v, "fence")) o->moe_sync = FLEXCOLL_MOE_FENCE;
      else if (!strcmp(v, "sentinel")) o->moe_sync = FLEXCOLL_MOE_SENTINEL;
      else if (!strcmp(v, "auto")) o->moe_sync = FLEXCOLL_MOE_AUTO;
      else perf_usage_error("--moe_sync %s: the mode is fence, sentinel or auto", v);
      return 1;
    case OPT_PLOT:
      /* Refused before the run rather than after it: the user wants the picture. */
      if (!perf_plot_available())
        perf_usage_error("--plot %s: this flexcoll-perf was built without zlib, which --plot needs to write PNG "
                         "(apt-get install zlib1g-dev, then configure and build again)", v);
      o->plot = v;
      return 1;
    default: return 0;
  }
}

/* Options whose value is a number. */
static void number_option(perf_opts_t *o, int key, const char *v) {
  const int64_t big = (int64_t)1 << 40, ranks = 1 << 16;
  switch (key) {
    case 'b': o->minbytes = (size_t)int_value(key, v, 1, big, "the smallest size"); break;
    case 'e': o->maxbytes = (size_t)int_value(key, v, 1, big, "the largest size"); break;
    case 'f': o->step = factor_value(key, v); o->step_given = 1; break;
    case 'i': o->stepbytes = (size_t)int_value(key, v, 1, big, "the step"); break;
    case 'n': o->iters = (int)int_value(key, v, 1, 1 << 30, "the iteration count"); break;
    case 'w': o->warmup = (int)int_value(key, v, 0, 1 << 30, "the warm-up count"); break;
    case 'r': o->root = (int)int_value(key, v, 0, ranks, "the root"); break;
    case 't': o->nthreads = (int)int_value(key, v, 1, ranks, "the thread count"); break;
    case 'g': o->ngpus = (int)int_value(key, v, 1, ranks, "the GPU count"); break;
    case OPT_NRANKS: o->nranks = (int)int_value(key, v, 1, ranks, "the rank count"); break;
    case 'R': o->windows = (int)int_value(key, v, 0, 2, "the registration") != 0; break;
    case 'c':
      if (perf_coll_from_name(v) >= 0)
        perf_usage_error("-c %s: -c is the result check (0|1), as in nccl-tests; the collective is --coll %s", v, v);
      o->check = (int)int_value(key, v, 0, 1, "the check (nccl-tests' check count: 0 or 1 here)");
      break;
    case 'G': o->graph = (int)int_value(key, v, 0, 1 << 30, "the graph launch count"); break;
    case OPT_HIDDEN: o->moe_hidden = (int)int_value(key, v, 1, 1 << 24, "the hidden size"); break;
    case OPT_TOP_K: o->moe_top_k = (int)int_value(key, v, 1, 15, "the experts per token"); break;
    case OPT_EXPERTS: o->moe_experts = (int)int_value(key, v, 1, 1 << 20, "the expert count"); break;
    case OPT_TOKENS: o->moe_tokens = (int)int_value(key, v, 1, 65536, "the largest token count"); break;
    default: perf_usage_error("option %s is not handled", flag_str(key));
  }
}

/* getopt's error: the option as typed, and what it is when nccl-tests has it. */
static void bad_option(char **argv, int key) {
  if (key == ':') perf_usage_error("%s needs a value", argv[optind - 1]);
  for (size_t i = 0; i < sizeof nccl_only / sizeof nccl_only[0]; i++)
    if (optopt == nccl_only[i].key) perf_usage_error("%s", nccl_only[i].what);
  if (optopt && optopt < 256) perf_usage_error("unknown option -%c", optopt);
  perf_usage_error("unknown option %s", argv[optind - 1]);
}

/* Settings that are wrong together, each alone being valid. */
static void check_combinations(const perf_opts_t *o) {
  if (o->stepbytes && o->step_given) perf_usage_error("-i (--stepbytes) and -f (--stepfactor): give one of them, not both");
  if (o->minbytes > o->maxbytes)
    perf_usage_error("-b (--minbytes) %zu is above -e (--maxbytes) %zu", o->minbytes, o->maxbytes);
  if (o->nranks && (o->nthreads || o->ngpus)) perf_usage_error("--nranks replaces -t and -g: give one or the other");
  const int coll = perf_coll_from_name(o->coll);
  if (perf_coll_is_moe(coll)) {
    const flexcoll_datatype_t dt = o->dtype_given ? o->dtype : FLEXCOLL_BFLOAT16;
    if (dt != FLEXCOLL_BFLOAT16 && dt != FLEXCOLL_FLOAT16 && dt != FLEXCOLL_FLOAT32 && dt != FLEXCOLL_INT8)
      perf_usage_error("-d (--datatype) %s: MoE payloads are bfloat16, float16, float32 or int8", fc_dtype_name(dt));
    if (coll == PERF_MOE_COMBINE && dt == FLEXCOLL_INT8)
      perf_usage_error("-d (--datatype) int8: combine sums into a float type; int8 is for --coll moe_dispatch");
    if (o->moe_sync == FLEXCOLL_MOE_SENTINEL && dt == FLEXCOLL_INT8)
      perf_usage_error("--moe_sync sentinel: int8 has no value to spare as a sentinel; fence or auto");
    if (o->baseline) perf_usage_error("--baseline nccl: --coll %s compares with flexcoll's own alltoall, always", o->coll);
    if (o->json || o->plot) perf_usage_error("-J and --plot are not written for --coll %s (its table is on stdout)", o->coll);
  }
}

void perf_parse_args(int argc, char **argv, perf_opts_t *o) {
  struct option longopts[NFLAGS + 1];
  char shortopts[2 * NFLAGS + 2 * (sizeof nccl_only / sizeof nccl_only[0]) + 2];
  size_t n = 0;
  shortopts[n++] = ':'; /* a missing value returns ':' */
  for (size_t i = 0; i < NFLAGS; i++) {
    longopts[i] = (struct option){flags[i].name, flags[i].arg ? required_argument : no_argument, NULL, flags[i].key};
    if (flags[i].key < 256) {
      shortopts[n++] = (char)flags[i].key;
      if (flags[i].arg) shortopts[n++] = ':';
    }
  }
  longopts[NFLAGS] = (struct option){0, 0, 0, 0};
  for (size_t i = 0; i < sizeof nccl_only / sizeof nccl_only[0]; i++) shortopts[n++] = (char)nccl_only[i].key;
  shortopts[n] = '\0';
  opterr = 0;
  int key;
  while ((key = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
    if (key == 'h') usage();
    if (key == '?' || key == ':') bad_option(argv, key);
    for (size_t i = 0; i < sizeof nccl_only / sizeof nccl_only[0]; i++)
      if (key == nccl_only[i].key) perf_usage_error("%s", nccl_only[i].what);
    if (!word_option(o, key, optarg)) number_option(o, key, optarg);
  }
  if (optind < argc)
    perf_usage_error("unexpected argument '%s': every value follows its option (-x VALUE or --name VALUE)", argv[optind]);
  check_combinations(o);
}

/* param.h — every FLEXCOLL_* environment variable goes through here: read once, cached, logged
 * at INFO when it is set.  FC_PARAM_INT(name, "ENV", default) defines fc_param_<name>(). */
#ifndef FC_PARAM_H
#define FC_PARAM_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flexcoll.h"

/* Strict integer: the whole string, in C notation (0x.. hex, 0.. octal), optionally followed by one
 * K, M or G (binary multiples) for byte sizes.  Returns 0 and sets *out, or -1 (nothing to read,
 * trailing text, out of range).  Inline so that flexcoll-perf, which links only the public library,
 * reads its options exactly as the library reads FLEXCOLL_* variables. */
static inline int fc_parse_int(const char *s, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  long long unit = 1;
  if (end != s && *end && !end[1] && strchr("kKmMgG", *end))
    unit = (*end == 'k' || *end == 'K') ? 1LL << 10 : (*end == 'm' || *end == 'M') ? 1LL << 20 : 1LL << 30, end++;
  if (!errno && (v > INT64_MAX / unit || v < INT64_MIN / unit)) errno = ERANGE;
  if (errno || end == s || *end != '\0') return -1;
  *out = v * unit;
  return 0;
}

/* The registry: every FLEXCOLL_* variable the library reads, with its default and meaning, in one
 * table (param.c) that the rank-0 consistency check (comm.c), flexcoll-info and the tests use, so
 * that a new variable is documented and checked where it is added. */
typedef enum {
  FC_PK_INT,    /* an integer (K/M/G allowed) in [min, max], or one of choices ("512|1024") */
  FC_PK_WORD,   /* one of choices, case as written ("ring|tree") */
  FC_PK_WORDI,  /* one of choices, any case (FLEXCOLL_DEBUG) */
  FC_PK_WORDS,  /* a comma list of distinct choices ("pcie,rdma") */
  FC_PK_LINKS,  /* a comma list of link names */
  FC_PK_SHARES, /* a comma list of link:fraction */
  FC_PK_HOSTPORT,
  FC_PK_TEXT,   /* any text: a path, an interface list */
  FC_PK_SECRET  /* any text, never printed */
} fc_param_kind_t;

typedef struct {
  const char *name;   /* FLEXCOLL_... */
  fc_param_kind_t kind;
  const char *dflt;   /* the default as users read it */
  const char *help;
  int shared;         /* must be the same on every rank (checked at init) */
  int64_t min, max;   /* FC_PK_INT without choices */
  const char *choices;
} fc_param_def_t;

/* The table, and its length in *n. */
const fc_param_def_t *fc_param_table(size_t *n);
const fc_param_def_t *fc_param_find(const char *name);
/* 0 when value is valid for p; else -1 with the reason in why. */
int fc_param_validate(const fc_param_def_t *p, const char *value, char *why, size_t len);
/* The variable's value as its registry entry allows (range, integer, choices), else
 * FLEXCOLL_INVALID_ARGUMENT naming it and why (comm's last error too): a setting that is not
 * valid should not silently become the default.  Unset or empty: valid. */
flexcoll_result_t fc_param_check(flexcoll_comm_t comm, const char *name);

/* Parse once into *cache (guarded by *state); returns the value. */
int64_t fc_param_int_load(const char *env, int64_t dflt, int64_t *cache, int *state);
/* String parameter: the value, or dflt when unset/empty; the pointer stays valid. */
const char *fc_param_str(const char *env, const char *dflt);

#define FC_PARAM_INT(name, env, dflt)                                         \
  static inline int64_t fc_param_##name(void) {                               \
    static int64_t cache_;                                                    \
    static int state_;                                                        \
    return fc_param_int_load("FLEXCOLL_" env, (dflt), &cache_, &state_);      \
  }

#endif

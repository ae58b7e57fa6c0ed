/* param.c — FLEXCOLL_* environment parameters, read once and logged. */
#define _GNU_SOURCE
#include "param.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int64_t fc_param_int_load(const char *env, int64_t dflt, int64_t *cache, int *state) {
  if (__atomic_load_n(state, __ATOMIC_ACQUIRE) == 2) return *cache;
  int64_t value = dflt;
  const char *s = getenv(env);
  if (s && *s) {
    int64_t v = 0;
    if (fc_parse_int(s, &v)) {
      FC_WARN("%s=\"%s\" is not an integer; using the default %lld", env, s, (long long)dflt);
    } else {
      value = v;
      FC_INFO(FC_SUB_ENV, "%s set to %lld", env, (long long)v);
    }
  }
  /* Racing first readers compute the same value; publishing it twice is harmless. */
  *cache = value;
  __atomic_store_n(state, 2, __ATOMIC_RELEASE);
  return value;
}

const char *fc_param_str(const char *env, const char *dflt) {
  const char *s = getenv(env);
  if (s && *s) {
    FC_INFO(FC_SUB_ENV, "%s set to %s", env, s);
    return s;
  }
  return dflt;
}

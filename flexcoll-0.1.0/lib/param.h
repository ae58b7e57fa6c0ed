/* param.h — every FLEXCOLL_* environment variable goes through here: read once, cached, logged
 * at INFO when it is set.  FC_PARAM_INT(name, "ENV", default) defines fc_param_<name>(). */
#ifndef FC_PARAM_H
#define FC_PARAM_H

#include <stdint.h>

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

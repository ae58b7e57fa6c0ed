/* clock.h — the monotonic clock as the library's waits, timeouts and measurements read it. */
#ifndef FC_CLOCK_H
#define FC_CLOCK_H

#include <time.h>

static inline double fc_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static inline double fc_now_us(void) { return fc_now_ms() * 1e3; }

#endif

/* log.h — flexcoll's logging: FLEXCOLL_DEBUG=VERSION|WARN|INFO|TRACE, FLEXCOLL_DEBUG_SUBSYS=INIT,COLL,...,
 * FLEXCOLL_DEBUG_FILE=path (%h host, %p pid).  Every line starts with host:pid:tid [rank]. */
#ifndef FC_LOG_H
#define FC_LOG_H

#include <stdarg.h>

typedef enum { FC_LOG_NONE = 0, FC_LOG_WARN = 1, FC_LOG_INFO = 2, FC_LOG_TRACE = 3 } fc_log_level_t;

/* Subsystems, selectable by FLEXCOLL_DEBUG_SUBSYS (comma list, ALL, ^X to exclude). */
enum {
  FC_SUB_INIT = 1 << 0,
  FC_SUB_BOOT = 1 << 1,
  FC_SUB_COLL = 1 << 2,
  FC_SUB_NET = 1 << 3,
  FC_SUB_ENV = 1 << 4,
  FC_SUB_TUNE = 1 << 5,
  FC_SUB_GPU = 1 << 6,
  FC_SUB_SCHED = 1 << 7, /* link models, calibration and shares */
  FC_SUB_ALL = ~0
};

/* The level in force (reads the environment on first use). */
fc_log_level_t fc_log_level(void);
void fc_log(fc_log_level_t level, int subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* "flexcoll version X.Y.Z" once per process when FLEXCOLL_DEBUG is VERSION, INFO or TRACE. */
void fc_log_version(const char *version);
/* The rank printed on this thread's log lines (-1: none). */
void fc_log_set_rank(int rank);

#define FC_LOG_(lvl, sub, ...)                                               \
  do {                                                                       \
    if (fc_log_level() >= (lvl)) fc_log((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define FC_WARN(...) FC_LOG_(FC_LOG_WARN, FC_SUB_ALL, __VA_ARGS__)
#define FC_INFO(sub, ...) FC_LOG_(FC_LOG_INFO, (sub), __VA_ARGS__)
#define FC_TRACE(sub, ...) FC_LOG_(FC_LOG_TRACE, (sub), __VA_ARGS__)

#endif

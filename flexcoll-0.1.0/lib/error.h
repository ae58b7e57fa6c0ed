/* error.h — result propagation and the last-error strings.
 * fc_error() records a message for the calling thread (and for comm when not NULL) and returns
 * the code, so that `return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "count ...")` is one line.
 * FC_CHECK propagates a failure upwards and logs "-> code" per frame at INFO: a free backtrace. */
#ifndef FC_ERROR_H
#define FC_ERROR_H

#include "flexcoll.h"
#include "log.h"

typedef flexcoll_result_t fc_result_t;

fc_result_t fc_error(flexcoll_comm_t comm, fc_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The thread's last message ("" if none); fc_error_clear() empties it. */
const char *fc_thread_last_error(void);
void fc_error_clear(void);

#define FC_CHECK(call)                                                          \
  do {                                                                          \
    fc_result_t fc_res_ = (call);                                               \
    if (fc_res_ != FLEXCOLL_SUCCESS) {                                          \
      FC_INFO(FC_SUB_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)fc_res_);     \
      return fc_res_;                                                           \
    }                                                                           \
  } while (0)

#define FC_CHECK_GOTO(call, res, label)                                         \
  do {                                                                          \
    (res) = (call);                                                             \
    if ((res) != FLEXCOLL_SUCCESS) {                                            \
      FC_INFO(FC_SUB_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(res));       \
      goto label;                                                               \
    }                                                                           \
  } while (0)

#endif

/* error.c — last-error strings, per thread and per communicator. */
#define _GNU_SOURCE
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"

static _Thread_local char thread_last_error[FC_ERROR_MSG_LEN];

fc_result_t fc_error(flexcoll_comm_t comm, fc_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(thread_last_error, sizeof thread_last_error, fmt, ap);
  va_end(ap);
  if (comm) {
    pthread_mutex_lock(&comm->error_lock);
    memcpy(comm->last_error, thread_last_error, sizeof comm->last_error);
    pthread_mutex_unlock(&comm->error_lock);
  }
  /* WARN only for what is not the caller's mistake; argument errors are the caller's to report. */
  if (code != FLEXCOLL_INVALID_ARGUMENT && code != FLEXCOLL_INVALID_USAGE && code != FLEXCOLL_IN_PROGRESS)
    FC_WARN("%s (%s)", thread_last_error, flexcoll_get_error_string(code));
  else
    FC_INFO(FC_SUB_ALL, "%s (%s)", thread_last_error, flexcoll_get_error_string(code));
  return code;
}

const char *fc_thread_last_error(void) { return thread_last_error; }

void fc_error_clear(void) { thread_last_error[0] = '\0'; }

const char *flexcoll_get_error_string(flexcoll_result_t result) {
  switch (result) {
    case FLEXCOLL_SUCCESS: return "no error";
    case FLEXCOLL_UNHANDLED_CUDA_ERROR: return "unhandled CUDA error";
    case FLEXCOLL_SYSTEM_ERROR: return "system error (a system call or library failed)";
    case FLEXCOLL_INTERNAL_ERROR: return "internal error (a bug in flexcoll)";
    case FLEXCOLL_INVALID_ARGUMENT: return "invalid argument";
    case FLEXCOLL_INVALID_USAGE: return "invalid usage";
    case FLEXCOLL_REMOTE_ERROR: return "remote process exited or failed";
    case FLEXCOLL_IN_PROGRESS: return "operation in progress";
    case FLEXCOLL_TIMEOUT: return "timed out waiting for a peer";
    default: return "unknown result code";
  }
}

/* log.c — FLEXCOLL_DEBUG logging with host:pid:tid [rank] prefixes; WARN lines carry file:line. */
#define _GNU_SOURCE
#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static fc_log_level_t log_level_value = FC_LOG_NONE;
static int log_subsys_mask = FC_SUB_ALL;
static FILE *log_file;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int log_rank = -1;
static int log_version; /* FLEXCOLL_DEBUG=VERSION, INFO or TRACE: the version line at the first init */

static const struct { const char *name; int bit; } subsys_names[] = {
    {"INIT", FC_SUB_INIT}, {"BOOT", FC_SUB_BOOT}, {"COLL", FC_SUB_COLL}, {"NET", FC_SUB_NET},
    {"ENV", FC_SUB_ENV},   {"TUNE", FC_SUB_TUNE}, {"GPU", FC_SUB_GPU},   {"SCHED", FC_SUB_SCHED}, {"ALL", FC_SUB_ALL}};

static int parse_subsys(const char *s) {
  int exclude = (s[0] == '^');
  int mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s + exclude);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0) mask |= subsys_names[i].bit;
  return exclude ? ~mask : mask;
}

/* FLEXCOLL_DEBUG_FILE may hold %h (host) and %p (pid) so that ranks write separate files. */
static FILE *open_log_file(const char *pattern) {
  char path[1024];
  size_t n = 0;
  for (const char *p = pattern; *p && n + 64 < sizeof path; p++) {
    if (p[0] == '%' && p[1] == 'h') { n += (size_t)snprintf(path + n, sizeof path - n, "%s", log_host); p++; }
    else if (p[0] == '%' && p[1] == 'p') { n += (size_t)snprintf(path + n, sizeof path - n, "%d", (int)getpid()); p++; }
    else path[n++] = *p;
  }
  path[n] = '\0';
  FILE *f = fopen(path, "a");
  if (f) setvbuf(f, NULL, _IOLBF, 0);
  return f;
}

static void log_init(void) {
  gethostname(log_host, sizeof log_host - 1);
  char *dot = strchr(log_host, '.');
  if (dot) *dot = '\0';
  const char *lvl = getenv("FLEXCOLL_DEBUG");
  if (lvl) {
    if (strcasecmp(lvl, "WARN") == 0) log_level_value = FC_LOG_WARN;
    else if (strcasecmp(lvl, "INFO") == 0) log_level_value = FC_LOG_INFO;
    else if (strcasecmp(lvl, "TRACE") == 0) log_level_value = FC_LOG_TRACE;
    else if (strcasecmp(lvl, "VERSION") == 0) log_version = 1;
    else if (strcasecmp(lvl, "NONE") == 0) log_level_value = FC_LOG_NONE;
    else { log_level_value = FC_LOG_WARN; fprintf(stderr, "flexcoll: FLEXCOLL_DEBUG=%s unknown, using WARN\n", lvl); }
  }
  const char *sub = getenv("FLEXCOLL_DEBUG_SUBSYS");
  if (sub && *sub) log_subsys_mask = parse_subsys(sub);
  const char *file = getenv("FLEXCOLL_DEBUG_FILE");
  if (file && *file) log_file = open_log_file(file);
  if (!log_file) log_file = stderr;
  if (log_level_value >= FC_LOG_INFO) log_version = 1;
}

fc_log_level_t fc_log_level(void) {
  pthread_once(&log_once, log_init);
  return log_level_value;
}

void fc_log_set_rank(int rank) { log_rank = rank; }

void fc_log(fc_log_level_t level, int subsys, const char *file, int line, const char *fmt, ...) {
  if (fc_log_level() < level) return;
  if (level != FC_LOG_WARN && !(subsys & log_subsys_mask)) return;
  char msg[1024];
  int n;
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  long tid = (long)syscall(SYS_gettid);
  if (log_rank >= 0)
    n = snprintf(msg, sizeof msg, "%s:%d:%ld [%d] ", log_host, (int)getpid(), tid, log_rank);
  else
    n = snprintf(msg, sizeof msg, "%s:%d:%ld [-] ", log_host, (int)getpid(), tid);
  if (level == FC_LOG_WARN)
    n += snprintf(msg + n, sizeof msg - (size_t)n, "%s:%d flexcoll WARN ", base, line);
  else
    n += snprintf(msg + n, sizeof msg - (size_t)n, "flexcoll %s ", level == FC_LOG_INFO ? "INFO" : "TRACE");
  if (n < (int)sizeof msg) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_lock(&log_lock);
  fprintf(log_file, "%s\n", msg);
  pthread_mutex_unlock(&log_lock);
}

static pthread_once_t version_once = PTHREAD_ONCE_INIT;
static const char *version_text;

static void print_version(void) {
  pthread_mutex_lock(&log_lock);
  fprintf(log_file, "%s:%d:%ld [%d] flexcoll INFO flexcoll version %s\n", log_host, (int)getpid(),
          (long)syscall(SYS_gettid), log_rank, version_text);
  pthread_mutex_unlock(&log_lock);
}

/* As NCCL_DEBUG=VERSION does: one line per process, whichever communicator comes first. */
void fc_log_version(const char *version) {
  fc_log_level();
  if (!log_version) return;
  version_text = version;
  pthread_once(&version_once, print_version);
}

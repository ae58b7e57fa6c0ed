/* crash_report.h — a test process that crashes says where and what it was doing.
 *
 * crash_report_install(tag, context) makes SIGSEGV, SIGBUS, SIGFPE and SIGABRT print the signal,
 * the faulting address and a backtrace (addresses for addr2line -f -e on the test or the
 * library), then call context (async-signal-safe writes of what the test was running; may be
 * NULL), then die of the same signal, which the parent reports.  Header only: each test that
 * forks its cases includes it once. */
#ifndef FC_TEST_CRASH_REPORT_H
#define FC_TEST_CRASH_REPORT_H

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static const char *crash_report_tag = "[test]";
static void (*crash_report_context)(void);

/* write(2) of a string, for signal handlers. */
static void crash_report_write(const char *s) {
  if (write(2, s, strlen(s)) < 0) _exit(125);
}

/* An unsigned number in base 10 or 16, for signal handlers. */
static void crash_report_write_number(unsigned long v, unsigned base) {
  char buf[24];
  int i = (int)sizeof buf;
  buf[--i] = '\0';
  do buf[--i] = "0123456789abcdef"[v % base]; while ((v /= base) && i > 0);
  crash_report_write(buf + i);
}

static void crash_report_on_signal(int sig, siginfo_t *info, void *ctx) {
  (void)ctx;
  void *frames[64];
  const int n = backtrace(frames, 64);
  crash_report_write(crash_report_tag);
  crash_report_write(" crashed (signal ");
  crash_report_write_number((unsigned long)sig, 10);
  crash_report_write(" at address 0x");
  crash_report_write_number(info ? (unsigned long)info->si_addr : 0ul, 16);
  crash_report_write("); backtrace:\n");
  backtrace_symbols_fd(frames, n, 2);
  if (crash_report_context) crash_report_context();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void crash_report_install(const char *tag, void (*context)(void)) {
  crash_report_tag = tag;
  crash_report_context = context;
  void *warm[1];
  backtrace(warm, 1); /* loads what backtrace needs now, not inside the handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = crash_report_on_signal;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  sigaction(SIGFPE, &sa, NULL);
  sigaction(SIGABRT, &sa, NULL);
}

#endif

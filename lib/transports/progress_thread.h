/* progress_thread.h — a link's progress between calls.
 *
 * A transport whose peers may need this rank to act while no call of it runs (receive credits to
 * return, the tail of a message that UCX over TCP keeps until the socket takes it) drives itself
 * from a thread: it progresses the link whenever the link's lock is free (a call in progress
 * drives the link itself), yielding while things move, then sleeping longer and longer, at most
 * a millisecond.  Every entry point of the link's table holds the lock while the thread runs and
 * counts itself (fc_progress_thread_used): the thread stands back while calls use the link, so
 * that it never competes with a collective's own progress for the lock or a core.  A link that
 * can wake a thread through a file descriptor (UCX's wakeup) lets it park once idle a second:
 * it then sleeps in poll until the link has something to do, or 200 ms at most, instead of
 * waking a thousand times a second. */
#ifndef FC_TRANSPORTS_PROGRESS_THREAD_H
#define FC_TRANSPORTS_PROGRESS_THREAD_H

#include <pthread.h>
#include <stdatomic.h>

typedef struct {
  pthread_t tid;
  atomic_int stop;
  int on;                           /* the thread runs */
  pthread_mutex_t *lock;            /* the link's */
  int (*progress_locked)(void *);   /* called with lock held: nonzero when something moved */
  /* Optional, with lock held: ready the link to signal its descriptor and return it, or -1 when
   * something is pending already (progress instead of sleeping). */
  int (*arm_locked)(void *);
  void *arg;
  int stop_fd;                      /* an eventfd: wakes a parked thread to stop */
  int park_ms;                      /* longest sleep parked (0: FC_PROGRESS_PARK_MS; tests set more) */
  atomic_ulong uses;                /* entry points' calls so far */
  char name[16];
  /* What parking did (the thread's own; logged at stop): to tell a link that keeps its
   * descriptor signalled, or cannot be armed, from one that sleeps. */
  unsigned long parks, arms_refused, woken, slept_out;
} fc_progress_thread_t;

/* An entry point of the link's table ran (any thread). */
static inline void fc_progress_thread_used(fc_progress_thread_t *t) {
  atomic_fetch_add_explicit(&t->uses, 1, memory_order_relaxed);
}

/* Start the thread (named name, as top -H shows it): 0, or the pthread_create error (t->on
 * stays 0: progress in calls only).  arm_locked may be NULL: the thread never parks. */
int fc_progress_thread_start(fc_progress_thread_t *t, const char *name, pthread_mutex_t *lock,
                             int (*progress_locked)(void *), int (*arm_locked)(void *), void *arg);
/* Stop and join it (nothing when it does not run); an INFO line (NET) says how it parked. */
void fc_progress_thread_stop(fc_progress_thread_t *t);

#endif

/* progress_thread.c — a link's progress between calls (progress_thread.h). */
#define _GNU_SOURCE
#include "progress_thread.h"

#include "clock.h"
#include "log.h"

#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Idle rounds: yield for the first few, then sleep 50 us, then a millisecond; a link that can
 * wake the thread parks after PARK rounds (about a second without anything moving). */
#define FC_PROGRESS_YIELD 16u
#define FC_PROGRESS_SLOW 1024u
#define FC_PROGRESS_PARK (FC_PROGRESS_SLOW + 1000u)
#define FC_PROGRESS_PARK_MS 200
/* The link's own housekeeping moves something now and then (UCX's keepalive, every second with
 * peer-failure handling): were every move to start the idle second again, a thread whose link
 * keeps alive that often would never park, napping a thousand times a second.  So a move brings
 * the yields back only in the first TAIL rounds of the slow naps (a call's tail: it just ended)
 * or as the MOVING_AGAIN-th within FLOW_MS of the first (things flow again: a peer sends); a lone
 * one later leaves the count toward parking where it was.  In time, not rounds: a parked round
 * lasts up to the park bound. */
#define FC_PROGRESS_TAIL 64u
#define FC_PROGRESS_MOVING_AGAIN 4u
#define FC_PROGRESS_FLOW_MS 20.0

static void nap(long ns) { nanosleep(&(struct timespec){0, ns}, NULL); }

/* Parked: arm the link and sleep in poll until its descriptor says something came (or the
 * bound, so that what no event announces, UCX's keepalive, still runs).  Where it cannot be armed
 * (a call holds the link, or the link has something pending that progress did not move) the
 * thread naps a millisecond as before parking: never a loop without a sleep. */
static void park(fc_progress_thread_t *t) {
  int fd = -1;
  if (pthread_mutex_trylock(t->lock) == 0) {
    fd = t->arm_locked(t->arg);
    pthread_mutex_unlock(t->lock);
  }
  t->parks++;
  if (fd < 0) {
    t->arms_refused++;
    nap(1000000);
    return;
  }
  struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = t->stop_fd, .events = POLLIN}};
  const int ready = poll(p, 2, t->park_ms > 0 ? t->park_ms : FC_PROGRESS_PARK_MS);
  if (ready == 0) t->slept_out++;
  else if (ready > 0 && (p[0].revents & POLLIN)) t->woken++;
}

/* Yield while something moves, then sleep longer and longer (at most a millisecond); while the
 * entry points are in use, only sleep. */
static void *progress_main(void *arg) {
  fc_progress_thread_t *t = arg;
  unsigned idle = 0, recent_moves = 0;
  double first_move_ms = 0; /* of the recent ones */
  unsigned long seen = atomic_load_explicit(&t->uses, memory_order_relaxed);
  while (!atomic_load_explicit(&t->stop, memory_order_acquire)) {
    const unsigned long uses = atomic_load_explicit(&t->uses, memory_order_relaxed);
    int moved = 0;
    if (uses != seen) {
      seen = uses;
      idle = FC_PROGRESS_SLOW; /* a call drives the link: look again in a millisecond, not
                                  sooner (on few cores, waking more often took time from the
                                  spinning caller) */
    } else if (pthread_mutex_trylock(t->lock) == 0) {
      moved = t->progress_locked(t->arg);
      pthread_mutex_unlock(t->lock);
    }
    if (moved && idle >= FC_PROGRESS_SLOW + FC_PROGRESS_TAIL) {
      const double now = fc_now_ms();
      if (!recent_moves || now - first_move_ms > FC_PROGRESS_FLOW_MS) first_move_ms = now, recent_moves = 0;
      if (++recent_moves >= FC_PROGRESS_MOVING_AGAIN) idle = 0, recent_moves = 0;
    } else if (moved) {
      idle = 0;
    } else if (idle < FC_PROGRESS_PARK) {
      idle++;
    }
    if (idle < FC_PROGRESS_YIELD) sched_yield();
    else if (idle >= FC_PROGRESS_PARK && t->arm_locked) park(t);
    else nap(idle < FC_PROGRESS_SLOW ? 50000 : 1000000);
  }
  return NULL;
}

int fc_progress_thread_start(fc_progress_thread_t *t, const char *name, pthread_mutex_t *lock,
                             int (*progress_locked)(void *), int (*arm_locked)(void *), void *arg) {
  t->lock = lock;
  t->progress_locked = progress_locked;
  t->arm_locked = arm_locked;
  t->arg = arg;
  atomic_store(&t->stop, 0);
  atomic_store(&t->uses, 0);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->parks = t->arms_refused = t->woken = t->slept_out = 0;
  /* Without it the thread only sleeps: a parked one would make stop wait out its poll. */
  t->stop_fd = arm_locked ? eventfd(0, EFD_CLOEXEC) : -1;
  if (t->stop_fd < 0) t->arm_locked = NULL;
  const int e = pthread_create(&t->tid, NULL, progress_main, t);
  t->on = e == 0;
  if (e && t->stop_fd >= 0) close(t->stop_fd), t->stop_fd = -1;
  if (t->on) pthread_setname_np(t->tid, name);
  return e;
}

void fc_progress_thread_stop(fc_progress_thread_t *t) {
  if (!t->on) return;
  atomic_store_explicit(&t->stop, 1, memory_order_release);
  if (t->stop_fd >= 0) {
    const ssize_t w = write(t->stop_fd, &(uint64_t){1}, sizeof(uint64_t)); /* cannot fail: one add */
    (void)w;
  }
  pthread_join(t->tid, NULL);
  if (t->arm_locked)
    FC_INFO(FC_SUB_NET, "%s thread: parked %lu times: %lu woken by the link, %lu slept the whole bound, %lu arms refused",
            t->name, t->parks, t->woken, t->slept_out, t->arms_refused);
  if (t->stop_fd >= 0) close(t->stop_fd);
  t->stop_fd = -1;
  t->on = 0;
}

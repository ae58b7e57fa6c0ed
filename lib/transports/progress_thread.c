/* progress_thread.c — a link's progress between calls (progress_thread.h). */
#include "progress_thread.h"

#include <sched.h>
#include <time.h>

/* Yield while something moves, then sleep longer and longer (at most a millisecond, so an idle
 * link costs a thousand wake-ups a second); while the entry points are in use, only sleep. */
static void *progress_main(void *arg) {
  fc_progress_thread_t *t = arg;
  unsigned idle = 0;
  unsigned long seen = atomic_load_explicit(&t->uses, memory_order_relaxed);
  while (!atomic_load_explicit(&t->stop, memory_order_acquire)) {
    const unsigned long uses = atomic_load_explicit(&t->uses, memory_order_relaxed);
    int moved = 0;
    if (uses != seen) {
      seen = uses;
      idle = 1024; /* a call drives the link: look again in a millisecond, not sooner (on few
                      cores, waking more often took time from the spinning caller) */
    } else if (pthread_mutex_trylock(t->lock) == 0) {
      moved = t->progress_locked(t->arg);
      pthread_mutex_unlock(t->lock);
    }
    idle = moved ? 0 : idle + 1;
    if (idle < 16) sched_yield();
    else nanosleep(&(struct timespec){0, idle < 1024 ? 50000 : 1000000}, NULL);
  }
  return NULL;
}

int fc_progress_thread_start(fc_progress_thread_t *t, pthread_mutex_t *lock, int (*progress_locked)(void *), void *arg) {
  t->lock = lock;
  t->progress_locked = progress_locked;
  t->arg = arg;
  atomic_store(&t->stop, 0);
  atomic_store(&t->uses, 0);
  const int e = pthread_create(&t->tid, NULL, progress_main, t);
  t->on = e == 0;
  return e;
}

void fc_progress_thread_stop(fc_progress_thread_t *t) {
  if (!t->on) return;
  atomic_store_explicit(&t->stop, 1, memory_order_release);
  pthread_join(t->tid, NULL);
  t->on = 0;
}

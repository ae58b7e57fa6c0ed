/* pcall.c — one checked collective call of the API tests: see pcall.h. */
#define _GNU_SOURCE
#include "pcall.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"

const char *const coll_names[NCOLLS] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"};

/* ---- one call: prepare the buffers, issue, check ---------------------------------------------- */


void pcall_describe(char *buf, size_t n, const pcall_t *p) {
  char root[32] = "";
  if (coll_rooted(p->coll)) snprintf(root, sizeof root, " root %d", p->root);
  snprintf(buf, n, "%s %s%s%s count %zu%s %s (call %" PRIu64 ")", coll_names[p->coll], fc_dtype_name(p->dtype),
           coll_reduces(p->coll) ? " " : "", coll_reduces(p->coll) ? fc_op_name(p->op) : "", p->count, root,
           p->inplace ? "in place" : "out of place", p->d.call);
  if (p->place && p->place->what) {
    size_t used = strlen(buf);
    if (used + 1 < n) snprintf(buf + used, n - used, "; %s", p->place->what);
  }
}

/* The region that p->place gives buffer b (p->sb or p->rb), NULL: the heap; its size in *cap. */
static unsigned char *region(const pcall_t *p, const hx_buf_t *b, size_t *cap) {
  if (!p->place) return NULL;
  const int send = b == &p->sb;
  *cap = send ? p->place->send_cap : p->place->recv_cap;
  return send ? p->place->send : p->place->recv;
}

/* A new poisoned buffer of `bytes` in b (p->sb or p->rb): on the heap (hx_buf_new) or in its
 * region of p->place.  NULL (after reporting) when out of memory or too large for the region. */
static void *buf_new(hx_rank_t *r, pcall_t *p, hx_buf_t *b, size_t bytes) {
  size_t cap = 0;
  unsigned char *at = region(p, b, &cap);
  if (!at) return hx_buf_new(r, b, bytes);
  if (bytes > cap || 2 * HX_GUARD > cap - bytes) {
    hx_fail(r, "a %zu-byte %s buffer (+ %d bytes of guards) does not fit its %zu-byte region", bytes,
            b == &p->sb ? "send" : "recv", 2 * HX_GUARD, cap);
    return NULL;
  }
  b->base = at;
  b->bytes = bytes;
  memset(at, HX_POISON, 2 * HX_GUARD + bytes);
  return at + HX_GUARD;
}

/* Forget b (p->sb or p->rb): free it when it is a heap buffer. */
static void buf_release(const pcall_t *p, hx_buf_t *b) {
  size_t cap = 0;
  unsigned char *at = region(p, b, &cap);
  if (at && b->base == at) {
    b->base = NULL;
    b->bytes = 0;
    return;
  }
  hx_buf_free(b);
}

/* A new buffer of `elems` elements in b holding this rank's inputs (fill 0: left unfilled); NULL
 * when out of memory. */
static void *own_data(hx_rank_t *r, pcall_t *p, hx_buf_t *b, size_t elems, int fill) {
  void *buf = buf_new(r, p, b, elems * fc_dtype_size(p->dtype));
  if (buf && fill) hx_fill(&p->d, p->rank, buf, 0, elems);
  return buf;
}

/* Allocate and fill the buffers of p for rank p->rank.  Returns 0, or -1 when out of memory. */
int pcall_prepare(hx_rank_t *r, pcall_t *p, uint64_t seed, uint64_t call) {
  const int n = p->nranks, me = p->rank, c = p->coll;
  const size_t es = fc_dtype_size(p->dtype), cnt = p->count;
  hx_data_t d = {p->dtype, coll_reduces(c) ? hx_gen_for_op(p->op) : HX_GEN_BITS, seed, call, n};
  p->d = d;
  memset(&p->sb, 0, sizeof p->sb);
  memset(&p->rb, 0, sizeof p->rb);
  p->send = p->recv = NULL;
  const int is_root = me == p->root;
  switch (c) {
    case C_ALLREDUCE:
    case C_REDUCE:
      if (p->inplace) {
        if (!(p->recv = own_data(r, p, &p->rb, cnt, 1))) return -1;
        p->send = p->recv;
        break;
      }
      if (!(p->send = own_data(r, p, &p->sb, cnt, 1))) return -1;
      /* Reduce's non-roots: NULL when the root is the last rank, else a poisoned buffer that must
       * stay so. */
      if (c == C_ALLREDUCE || is_root || p->root != n - 1)
        if (!(p->recv = buf_new(r, p, &p->rb, cnt * es))) return -1;
      break;
    case C_ALLGATHER:
      if (!(p->recv = buf_new(r, p, &p->rb, (size_t)n * cnt * es))) return -1;
      if (p->inplace) {
        void *slot = (char *)p->recv + (size_t)me * cnt * es;
        hx_fill(&p->d, me, slot, 0, cnt);
        p->send = slot;
      } else if (!(p->send = own_data(r, p, &p->sb, cnt, 1))) {
        return -1;
      }
      break;
    case C_REDUCE_SCATTER: {
      char *s = own_data(r, p, &p->sb, (size_t)n * cnt, 1);
      if (!s) return -1;
      p->send = s;
      if (p->inplace) p->recv = s + (size_t)me * cnt * es;
      else if (!(p->recv = buf_new(r, p, &p->rb, cnt * es))) return -1;
      break;
    }
    case C_BROADCAST:
      if (p->inplace) {
        if (!(p->recv = own_data(r, p, &p->rb, cnt, is_root))) return -1;
        p->send = p->recv;
        break;
      }
      if (!(p->recv = buf_new(r, p, &p->rb, cnt * es))) return -1;
      /* Non-roots: NULL when the root is the last rank (unless p->place puts sendbufs in a region:
       * see pcall_place_t), else a buffer of their own data that must be ignored (and left alone). */
      if ((is_root || p->root != n - 1 || (p->place && p->place->send)) && !(p->send = own_data(r, p, &p->sb, cnt, 1)))
        return -1;
      break;
    case C_ALLTOALL:
      /* In place: sendbuf == recvbuf, the whole buffer (the library sends from a copy). */
      if (p->inplace) {
        if (!(p->recv = own_data(r, p, &p->rb, (size_t)n * cnt, 1))) return -1;
        p->send = p->recv;
        break;
      }
      if (!(p->send = own_data(r, p, &p->sb, (size_t)n * cnt, 1)) ||
          !(p->recv = buf_new(r, p, &p->rb, (size_t)n * cnt * es)))
        return -1;
      break;
  }
  return 0;
}

flexcoll_result_t pcall_issue(const pcall_t *p, flexcoll_comm_t comm) {
  switch (p->coll) {
    case C_ALLREDUCE: return flexcoll_allreduce(p->send, p->recv, p->count, p->dtype, p->op, comm, NULL);
    case C_ALLGATHER: return flexcoll_allgather(p->send, p->recv, p->count, p->dtype, comm, NULL);
    case C_REDUCE_SCATTER: return flexcoll_reduce_scatter(p->send, p->recv, p->count, p->dtype, p->op, comm, NULL);
    case C_BROADCAST: return flexcoll_broadcast(p->send, p->recv, p->count, p->dtype, p->root, comm, NULL);
    case C_REDUCE: return flexcoll_reduce(p->send, p->recv, p->count, p->dtype, p->op, p->root, comm, NULL);
    default: return flexcoll_alltoall(p->send, p->recv, p->count, p->dtype, comm, NULL);
  }
}

/* Check the results of p (reported as rank p->rank), then free its buffers. */
void pcall_check(hx_rank_t *r, pcall_t *p) {
  const int n = p->nranks, me = p->rank, c = p->coll;
  const size_t es = fc_dtype_size(p->dtype), cnt = p->count;
  const int is_root = me == p->root;
  const int saved_rank = r->rank;
  r->rank = me;
  pcall_describe(r->what, sizeof r->what, p);
  switch (c) {
    case C_ALLREDUCE:
      hx_check_reduced(r, "recvbuf", &p->d, p->op, p->recv, 0, cnt);
      if (!p->inplace) hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, cnt);
      break;
    case C_ALLGATHER:
      hx_check_gathered(r, "recvbuf", &p->d, p->recv, cnt);
      if (!p->inplace) hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, cnt);
      break;
    case C_REDUCE_SCATTER:
      hx_check_reduced(r, "recvbuf", &p->d, p->op, p->recv, (size_t)me * cnt, cnt);
      if (!p->inplace) {
        hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, (size_t)n * cnt);
      } else {
        hx_check_input(r, "sendbuf before this rank's block (must not change)", &p->d, me, p->send, 0, (size_t)me * cnt);
        hx_check_input(r, "sendbuf after this rank's block (must not change)", &p->d, me,
                       (const char *)p->send + (size_t)(me + 1) * cnt * es, (size_t)(me + 1) * cnt,
                       (size_t)(n - me - 1) * cnt);
      }
      break;
    case C_BROADCAST:
      hx_check_input(r, "recvbuf", &p->d, p->root, p->recv, 0, cnt);
      if (!p->inplace && p->send) hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, cnt);
      break;
    case C_REDUCE:
      if (is_root) {
        hx_check_reduced(r, "root's recvbuf", &p->d, p->op, p->recv, 0, cnt);
        if (!p->inplace) hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, cnt);
      } else if (p->inplace) {
        hx_check_input(r, "non-root's buffer (in place: its input, must not change)", &p->d, me, p->recv, 0, cnt);
      } else {
        hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, cnt);
        if (p->recv) hx_check_poisoned(r, "non-root's recvbuf", p->recv, cnt * es);
      }
      break;
    case C_ALLTOALL:
      for (int q = 0; q < n; q++) {
        char w[64];
        snprintf(w, sizeof w, "recvbuf block %d", q);
        hx_check_input(r, w, &p->d, q, (const char *)p->recv + (size_t)q * cnt * es, (size_t)me * cnt, cnt);
      }
      if (!p->inplace) hx_check_input(r, "sendbuf (must not change)", &p->d, me, p->send, 0, (size_t)n * cnt);
      break;
  }
  if (p->sb.base) hx_buf_check_guards(r, p->inplace && c == C_REDUCE_SCATTER ? "sendbuf/recvbuf" : "sendbuf", &p->sb);
  if (p->rb.base) hx_buf_check_guards(r, p->inplace ? "recvbuf/sendbuf" : "recvbuf", &p->rb);
  buf_release(p, &p->sb);
  buf_release(p, &p->rb);
  r->rank = saved_rank;
}

void pcall_free(pcall_t *p) {
  buf_release(p, &p->sb);
  buf_release(p, &p->rb);
}

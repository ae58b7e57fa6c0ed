/* verbs.h — libibverbs through a table of function pointers (lib/transports/rdma.c).
 *
 * The library never links libibverbs for the rdma link: the table is filled by dlopen/dlsym at the
 * first rdma open, from libibverbs.so.1 or from the provider FLEXCOLL_VERBS_PROVIDER names (a
 * library path, or `fake`: the test suite's shared-memory provider, tests/fake_verbs.c, at the
 * path FLEXCOLL_VERBS_FAKE_LIB).  So a machine without rdma-core runs the other links as before,
 * and the tests can put a provider of their own under the very code that drives real NICs.
 *
 * Only the functions libibverbs exports are in the table.  Posting and polling (ibv_post_send,
 * ibv_post_recv, ibv_poll_cq) are inline in <infiniband/verbs.h> and go through the context's own
 * ops, which every provider (a real one or the fake) fills. */
#ifndef FC_VERBS_H
#define FC_VERBS_H

#include <stdio.h>
#include <infiniband/verbs.h>

typedef struct {
  struct ibv_device **(*get_device_list)(int *num);
  void (*free_device_list)(struct ibv_device **list);
  const char *(*get_device_name)(struct ibv_device *dev);
  struct ibv_context *(*open_device)(struct ibv_device *dev);
  int (*close_device)(struct ibv_context *ctx);
  int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
  /* libibverbs' exported ibv_query_port fills the prefix of struct ibv_port_attr it knows. */
  int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
  int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
  int (*dealloc_pd)(struct ibv_pd *pd);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
  int (*dereg_mr)(struct ibv_mr *mr);
  struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
                              int comp_vector);
  int (*destroy_cq)(struct ibv_cq *cq);
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
  int (*destroy_qp)(struct ibv_qp *qp);
  int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *event);
  void (*ack_async_event)(struct ibv_async_event *event);
  const char *(*wc_status_str)(enum ibv_wc_status status);
  /* Optional (a provider without them: the progress thread never parks). */
  struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
  int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
  int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
  void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
  /* Optional: fork safety of registered memory (fc_verbs_load calls them once per provider). */
  int (*fork_init)(void);
  enum ibv_fork_status (*is_fork_initialized)(void);
  /* Optional (rdma-core 34 and later): device memory through a dma-buf (GPUDirect RDMA). */
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
  const char *path; /* what was opened */
} fc_verbs_t;

/* The table of the provider this process's environment selects (loaded once per provider, and
 * made fork-safe then where the kernel needs it: rdma.c, fork_safety).  NULL with the reason in
 * why when it cannot be loaded: no rdma link, which is not an error. */
const fc_verbs_t *fc_verbs_load(char *why, size_t len);

#endif

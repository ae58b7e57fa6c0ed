/* launch.c — flexcoll_comm_init_from_env: rank, size and root address from the launcher.
 * Order: FLEXCOLL_RANK/NRANKS/ROOT; torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
 * Open MPI, PMI (MPICH, Intel MPI), Slurm — with the root address from FLEXCOLL_ROOT.
 * Rank 0 serves the rendezvous at the root address; every rank derives the same unique id
 * from that address and the job's secret (fc_launch_secret), so no other channel is needed. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "error.h"
#include "log.h"
#include "param.h"

typedef struct {
  const char *name, *rank_var, *size_var;
  const char *job_vars[3]; /* the same on every rank of one job, different between jobs; first set wins */
} fc_launcher_t;

/* Not PMI_ID: it names a process, not the job. */
static const fc_launcher_t launchers[] = {
    {"flexcoll", "FLEXCOLL_RANK", "FLEXCOLL_NRANKS", {NULL}},
    {"torchrun", "RANK", "WORLD_SIZE", {"TORCHELASTIC_RUN_ID"}},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     {"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid"}},
    {"PMI", "PMI_RANK", "PMI_SIZE", {"PMIX_NAMESPACE", "PMI_JOBID"}},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_JOB_ID"}}};

/* What keeps a stranger who knows host:port and the rank count out of the job.  Job ids are no
 * secret from other users of the cluster (squeue, ps); they keep out other jobs and the outside. */
const char *fc_launch_secret(const char *launcher, const char **source) {
  const char *v = getenv("FLEXCOLL_BOOTSTRAP_SECRET"); /* not fc_param_str: it logs the value */
  *source = "FLEXCOLL_BOOTSTRAP_SECRET";
  if (v && *v) return v;
  for (size_t i = 0; launcher && i < sizeof launchers / sizeof launchers[0]; i++) {
    if (strcmp(launchers[i].name, launcher) != 0) continue;
    for (int k = 0; k < 3 && launchers[i].job_vars[k]; k++) {
      v = getenv(launchers[i].job_vars[k]);
      *source = launchers[i].job_vars[k];
      if (v && *v) return v;
    }
  }
  *source = NULL;
  return NULL;
}

static int parse_int_env(const char *var, int *out) {
  const char *s = getenv(var);
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > 1 << 30) return -2;
  *out = (int)v;
  return 0;
}

static flexcoll_result_t root_address(const fc_launcher_t *l, char *buf, size_t len) {
  const char *root = fc_param_str("FLEXCOLL_ROOT", NULL);
  if (root) { snprintf(buf, len, "%s", root); return FLEXCOLL_SUCCESS; }
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (addr && *addr && port && *port) {
    /* IPv6 literals need brackets to keep the port apart. */
    snprintf(buf, len, strchr(addr, ':') ? "[%s]:%s" : "%s:%s", addr, port);
    return FLEXCOLL_SUCCESS;
  }
  return fc_error(NULL, FLEXCOLL_INVALID_USAGE,
                  "flexcoll_comm_init_from_env: launcher %s found but no root address: set FLEXCOLL_ROOT=host:port "
                  "(or MASTER_ADDR and MASTER_PORT) reachable from every rank", l->name);
}

flexcoll_result_t flexcoll_comm_init_from_env(flexcoll_comm_t *comm, const flexcoll_config_t *config) {
  const char *fn = "flexcoll_comm_init_from_env";
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  *comm = NULL;
  /* Check everything before rank 0 starts serving the root: a refused call must leave no listener. */
  FC_CHECK(fc_check_config(config, fn));
  for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
    const fc_launcher_t *l = &launchers[i];
    int rank, size;
    int rr = parse_int_env(l->rank_var, &rank), rs = parse_int_env(l->size_var, &size);
    if (rr == -1 && rs == -1) continue;
    if (rr || rs)
      return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: %s=%s and %s=%s must both be non-negative integers", fn,
                      l->rank_var, getenv(l->rank_var) ? getenv(l->rank_var) : "(unset)", l->size_var,
                      getenv(l->size_var) ? getenv(l->size_var) : "(unset)");
    if (size < 1 || rank >= size)
      return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: %s=%d is not below %s=%d", fn, l->rank_var, rank, l->size_var, size);
    char addr[256];
    FC_CHECK(root_address(l, addr, sizeof addr));
    flexcoll_unique_id_t id;
    const char *source, *secret = fc_launch_secret(l->name, &source);
    FC_CHECK(fc_bootstrap_id_from_address(&id, addr, size, secret));
    FC_INFO(FC_SUB_INIT, "%s launcher: rank %d of %d, root %s, secret %s", l->name, rank, size, addr,
            secret ? source : "none (set FLEXCOLL_BOOTSTRAP_SECRET)");
    /* The communicator owns the root: a failed initialisation stops it and frees the port. */
    fc_bootstrap_root_t *root = NULL;
    if (rank == 0) FC_CHECK(fc_bootstrap_start_root(&id, addr, &root));
    return fc_comm_init_rank(comm, size, id, rank, config, root);
  }
  return fc_error(NULL, FLEXCOLL_INVALID_USAGE,
                  "%s: no launcher environment found (FLEXCOLL_RANK/FLEXCOLL_NRANKS, RANK/WORLD_SIZE, "
                  "OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE or SLURM_PROCID/NTASKS)", fn);
}

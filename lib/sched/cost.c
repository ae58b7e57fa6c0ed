/* cost.c — the per-link cost model t(b) = alpha + b / beta: fitted from calibration samples,
 * nudged by measured collectives, and kept on disk between runs so that a communicator on a known
 * topology starts from the last models instead of calibrating again. */
#define _GNU_SOURCE
#include "sched.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "param.h"
#include "topo.h"

double fc_cost_predict(const fc_link_model_t *m, double bytes) {
  if (!(m->beta > 0)) return INFINITY;
  return m->alpha_us + bytes / m->beta;
}

flexcoll_result_t fc_cost_fit(fc_link_model_t *m, const double *bytes, const double *us, int n) {
  if (!m || !bytes || !us || n < 2)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_cost_fit: %d samples (at least 2) or a NULL array", n);
  /* Centred sums: calibration sizes span 2^10..2^30, where the textbook n*Sxx - Sx^2 cancels. */
  double mx = 0, my = 0;
  for (int i = 0; i < n; i++) {
    if (!isfinite(bytes[i]) || !isfinite(us[i]))
      return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_cost_fit: sample %d is not finite", i);
    mx += bytes[i], my += us[i];
  }
  mx /= n, my /= n;
  double sxx = 0, sxy = 0;
  for (int i = 0; i < n; i++) {
    sxx += (bytes[i] - mx) * (bytes[i] - mx);
    sxy += (bytes[i] - mx) * (us[i] - my);
  }
  const double slope = sxy / sxx;
  if (!(sxx > 0) || !(slope > 0) || !isfinite(slope) || !isfinite(1 / slope))
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "fc_cost_fit: the samples give no positive bandwidth (slope %g us/byte)", slope);
  const double intercept = my - slope * mx;
  /* A negative intercept is noise around a latency too small to measure, not a time gained. */
  m->alpha_us = intercept > 0 ? intercept : 0;
  m->beta = 1 / slope;
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_cost_from_two(fc_link_model_t *m, double small_bytes, double small_us, double big_bytes,
                                   double big_us) {
  const double x[2] = {small_bytes, big_bytes}, y[2] = {small_us, big_us};
  if (!m || !(small_bytes > 0 && big_bytes > small_bytes) || !(small_us > 0 && big_us > 0) || !isfinite(big_bytes) ||
      !isfinite(small_us) || !isfinite(big_us))
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_cost_from_two: sizes %g < %g and times %g, %g us", small_bytes,
                    big_bytes, small_us, big_us);
  fc_link_model_t fit = *m;
  const double plain = big_bytes / big_us;
  /* The fit stands where the large size spent at least half its time moving bytes; below that its
   * slope is timer noise (two ranks sharing one GPU move the nvlink lane's large size in little
   * more than the fixed cost: fits with no positive slope, or absurd ones, docs/PERFORMANCE.md,
   * session 20). */
  if (fc_cost_fit(&fit, x, y, 2) == FLEXCOLL_SUCCESS && fit.beta <= 2 * plain) {
    *m = fit;
    return FLEXCOLL_SUCCESS;
  }
  m->alpha_us = small_us < big_us ? small_us : big_us;
  m->beta = plain;
  return FLEXCOLL_SUCCESS;
}

void fc_cost_update(fc_link_model_t *m, double bytes, double us, double w) {
  if (!m || !(w > 0 && w <= 1) || !(us > m->alpha_us) || !(bytes > 0) || !isfinite(bytes) || !isfinite(us)) return;
  /* A part that took little more than alpha (a probe share) says little about the bandwidth: its
   * time over alpha is within the timer's noise.  Counting at least half its time as transfer
   * time bounds what one such part can claim to twice its plain rate (unbounded, one probe made
   * the pcie lane look faster than NVLink, and that rate times alpha, its useful minimum, then
   * kept it off every chunk: docs/PERFORMANCE.md, session 20). */
  const double transfer_us = us - m->alpha_us > us / 2 ? us - m->alpha_us : us / 2;
  const double measured = bytes / transfer_us;
  const double beta = (1 - w) * m->beta + w * measured;
  /* A transfer just over alpha gives an enormous rate; keep the model finite rather than let one
   * outlier make the link look infinitely fast. */
  if (isfinite(beta)) m->beta = beta;
}

/* ---- the cache ---------------------------------------------------------------------------------
 * <dir>/<key>.links, in text so that a person can read and edit it:
 *   flexcoll-links <version> <nlinks> <key, %-escaped>
 *   <alpha_us> <beta> <min_bytes> <port>        one line per link, doubles in %.17g (exact)
 *   end                                         so that a torn write cannot pass for a short file
 * The key is checked on load: two keys that sanitise to the same file name never share models. */
#define CACHE_VERSION 1
#define CACHE_NAME_MAX 200
#define CACHE_LINE_MAX 4096

static void sanitise_key(const char *key, char *out, size_t size) {
  size_t len = strlen(key), n = 0;
  /* Long keys keep a readable prefix and a hash of the whole, within the usual 255-byte name limit. */
  const size_t keep = len <= CACHE_NAME_MAX ? len : CACHE_NAME_MAX - 17;
  for (; n < keep && n + 1 < size; n++) {
    const char c = key[n];
    const int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                   c == '-' || c == '_';
    /* A leading dot would hide the file (and ".." is no name to rename onto). */
    out[n] = ok && !(n == 0 && c == '.') ? c : '_';
  }
  out[n] = '\0';
  if (keep < len) {
    const uint64_t h = fc_hash_bytes(FC_HASH_INIT, key, len);
    snprintf(out + n, size - n, "-%016llx", (unsigned long long)h);
  }
}

/* The key as one header token: bytes that would split or end the line are %-escaped. */
static int escape_key(const char *key, char *out, size_t size) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
    if (n + 4 > size) return -1;
    if (*p <= ' ' || *p >= 0x7f || *p == '%') n += (size_t)snprintf(out + n, size - n, "%%%02X", *p);
    else out[n++] = (char)*p;
  }
  out[n] = '\0';
  return 0;
}

static int cache_path(const char *dir, const char *key, char *path, size_t size) {
  char name[CACHE_NAME_MAX + 1];
  sanitise_key(key, name, sizeof name);
  const int len = snprintf(path, size, "%s/%s.links", dir, name);
  return len > 0 && (size_t)len < size ? 0 : -1;
}

/* mkdir -p: every missing component with mode 0700 (the models describe the machine's links). */
static int make_dirs(const char *dir) {
  char path[PATH_MAX];
  const size_t len = strlen(dir);
  if (len == 0 || len >= sizeof path) return errno = ENAMETOOLONG, -1;
  memcpy(path, dir, len + 1);
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    const char c = *p;
    *p = '\0';
    if (mkdir(path, 0700) != 0 && errno != EEXIST) return -1;
    *p = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (stat(dir, &st) != 0) return -1;
  return S_ISDIR(st.st_mode) ? 0 : (errno = ENOTDIR, -1);
}

static int model_valid(const fc_link_model_t *m) {
  return isfinite(m->alpha_us) && m->alpha_us >= 0 && isfinite(m->beta) && m->beta >= 0 && isfinite(m->min_bytes) &&
         m->min_bytes >= 0 && m->port >= -1;
}

/* Numbers are written and read in the C locale whatever the application chose: a decimal comma
 * would make a file that another process (or the next run) cannot read. */
static locale_t c_numeric;
static pthread_once_t c_numeric_once = PTHREAD_ONCE_INIT;
static void make_c_numeric(void) { c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

/* The C locale for this thread until restore_locale (uselocale(0) only queries: a failed newlocale
 * leaves the caller's locale, which is the C one in every program that never set another). */
static locale_t use_c_locale(void) {
  pthread_once(&c_numeric_once, make_c_numeric);
  return uselocale(c_numeric);
}
static void restore_locale(locale_t old) { uselocale(old); }

static int write_models(FILE *f, const char *ekey, const fc_link_model_t *models, int nlinks) {
  fprintf(f, "flexcoll-links %d %d %s\n", CACHE_VERSION, nlinks, ekey);
  for (int i = 0; i < nlinks; i++)
    fprintf(f, "%.17g %.17g %.17g %d\n", models[i].alpha_us, models[i].beta, models[i].min_bytes, models[i].port);
  fprintf(f, "end\n");
  return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

flexcoll_result_t fc_cost_cache_save(const char *dir, const char *key, const fc_link_model_t *models, int nlinks) {
  char ekey[CACHE_LINE_MAX / 2], path[PATH_MAX], tmp[PATH_MAX + 8];
  if (!dir || !key || !*key || !models || nlinks < 1 || nlinks > FC_MAX_LINKS || escape_key(key, ekey, sizeof ekey))
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_cost_cache_save: bad directory, key or %d links", nlinks);
  /* What load would refuse is not written: a saved file always comes back. */
  for (int i = 0; i < nlinks; i++)
    if (!model_valid(&models[i]))
      return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_cost_cache_save: link %d's model is not storable", i);
  if (cache_path(dir, key, path, sizeof path))
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: the path under %s is too long", dir);
  if (make_dirs(dir))
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: cannot create %s: %s", dir, strerror(errno));
  /* Written aside and renamed over: ranks of several jobs may save the same key at once, and a
   * reader must see one whole file or the other, never a mixture. */
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
  const int fd = mkstemp(tmp);
  if (fd < 0)
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: cannot create a file in %s: %s", dir,
                    strerror(errno));
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    unlink(tmp);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: fdopen: %s", strerror(errno));
  }
  const locale_t old = use_c_locale();
  int bad = write_models(f, ekey, models, nlinks);
  restore_locale(old);
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    const int err = errno;
    unlink(tmp);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: cannot write %s: %s", path, strerror(err));
  }
  FC_INFO(FC_SUB_TUNE, "link cost cache: saved %d links to %s", nlinks, path);
  return FLEXCOLL_SUCCESS;
}

/* One "alpha beta min_bytes port" line into *m; -1 on anything else (extra fields included). */
static int parse_model(const char *line, fc_link_model_t *m) {
  char *end;
  const char *p = line;
  double v[3];
  for (int k = 0; k < 3; k++) {
    /* No errno check: a subnormal sets ERANGE yet reads back exactly; overflow gives inf, which
     * model_valid refuses. */
    v[k] = strtod(p, &end);
    if (end == p) return -1;
    p = end;
  }
  errno = 0;
  const long port = strtol(p, &end, 10);
  if (end == p || errno || port < INT_MIN || port > INT_MAX) return -1;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\n') return -1;
  *m = (fc_link_model_t){.alpha_us = v[0], .beta = v[1], .min_bytes = v[2], .port = (int)port};
  return model_valid(m) ? 0 : -1;
}

/* The file's models into out[]; a short description of the first problem otherwise. */
static const char *read_models(FILE *f, const char *ekey, fc_link_model_t *out, int nlinks) {
  char line[CACHE_LINE_MAX], magic[32], fkey[CACHE_LINE_MAX];
  int version, count, used = 0;
  if (!fgets(line, sizeof line, f) || !strchr(line, '\n')) return "no header line";
  if (sscanf(line, "%31s %d %d %4095s%n", magic, &version, &count, fkey, &used) != 4 ||
      strcmp(magic, "flexcoll-links") || strcmp(line + used, "\n"))
    return "not a link cost file";
  if (version != CACHE_VERSION) return "another format version";
  if (strcmp(fkey, ekey)) return "another key (a different topology with the same file name)";
  if (count != nlinks) return "another number of links";
  for (int i = 0; i < nlinks; i++)
    if (!fgets(line, sizeof line, f) || parse_model(line, &out[i])) return "a bad or missing link line";
  if (!fgets(line, sizeof line, f) || strcmp(line, "end\n")) return "no end line (truncated)";
  if (fgetc(f) != EOF) return "data after the end line";
  return NULL;
}

flexcoll_result_t fc_cost_cache_load(const char *dir, const char *key, fc_link_model_t *models, int nlinks) {
  char ekey[CACHE_LINE_MAX / 2], path[PATH_MAX];
  if (!dir || !key || !*key || !models || nlinks < 1 || nlinks > FC_MAX_LINKS || escape_key(key, ekey, sizeof ekey))
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_cost_cache_load: bad directory, key or %d links", nlinks);
  if (cache_path(dir, key, path, sizeof path))
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: the path under %s is too long", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    /* The first run on a topology: expected, so no warning; the caller calibrates. */
    FC_INFO(FC_SUB_TUNE, "link cost cache: %s: %s", path, strerror(errno));
    return FLEXCOLL_SYSTEM_ERROR;
  }
  fc_link_model_t tmp[FC_MAX_LINKS];
  const locale_t old = use_c_locale();
  const char *problem = read_models(f, ekey, tmp, nlinks);
  restore_locale(old);
  fclose(f);
  if (problem)
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "link cost cache: ignoring %s: %s", path, problem);
  memcpy(models, tmp, (size_t)nlinks * sizeof *models);
  FC_INFO(FC_SUB_TUNE, "link cost cache: loaded %d links from %s", nlinks, path);
  return FLEXCOLL_SUCCESS;
}

/* ---- the default directory ---------------------------------------------------------------------
 * Computed once: the environment is read once per process, as for every FLEXCOLL_* parameter. */
static char cache_dir[PATH_MAX];
static const char *cache_dir_result;
static pthread_once_t cache_dir_once = PTHREAD_ONCE_INIT;

static void find_cache_dir(void) {
  const char *dir = fc_param_str("FLEXCOLL_CACHE_DIR", NULL), *suffix = "";
  if (!dir) {
    /* The XDG spec ignores a relative XDG_CACHE_HOME. */
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/') dir = xdg, suffix = "/flexcoll";
    else if (home && *home) dir = home, suffix = "/.cache/flexcoll";
  }
  if (!dir) return;
  const int len = snprintf(cache_dir, sizeof cache_dir, "%s%s", dir, suffix);
  if (len > 0 && (size_t)len < sizeof cache_dir) cache_dir_result = cache_dir;
}

const char *fc_cost_cache_dir(void) {
  pthread_once(&cache_dir_once, find_cache_dir);
  return cache_dir_result;
}

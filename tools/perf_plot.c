/* perf_plot.c — flexcoll-perf --plot FILE.png: busbw against size (log2 axis) for flexcoll out of
 * place and in place and for the NCCL baseline, and below it each link's share of the bytes per
 * size where more than one link carried some.  A small rasterizer and PNG writer of its own (zlib
 * compresses), so that a GPU node needs no Python or plotting library to draw the comparison. */
#define _GNU_SOURCE
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "perf.h"

#if HAVE_ZLIB
#include <zlib.h>

#include "perf_font.h"

typedef struct {
  int w, h;
  unsigned char *px; /* RGB rows */
} canvas_t;

typedef struct {
  int x0, y0, x1, y1;      /* the plot area in pixels (y0 at the top) */
  double xmin, xmax, ymax; /* data ranges: x in log2(bytes), y from 0 */
} panel_t;

static const unsigned char black[3] = {0, 0, 0}, grey[3] = {220, 220, 220};
/* Series and links: distinct colours that stay apart for the colour-blind (Okabe-Ito). */
static const unsigned char palette[8][3] = {{0, 114, 178}, {230, 159, 0}, {0, 158, 115}, {204, 121, 167},
                                            {86, 180, 233}, {213, 94, 0}, {240, 228, 66}, {100, 100, 100}};

static void dot(canvas_t *c, int x, int y, const unsigned char rgb[3]) {
  if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
  memcpy(c->px + ((size_t)y * c->w + x) * 3, rgb, 3);
}

static void rect(canvas_t *c, int x0, int y0, int x1, int y1, const unsigned char rgb[3]) {
  for (int y = y0; y <= y1; y++)
    for (int x = x0; x <= x1; x++) dot(c, x, y, rgb);
}

/* A line `thick` pixels wide, by steps along its longer side. */
static void line(canvas_t *c, double xa, double ya, double xb, double yb, int thick, const unsigned char rgb[3]) {
  double dx = xb - xa, dy = yb - ya;
  int steps = (int)(fabs(dx) > fabs(dy) ? fabs(dx) : fabs(dy)) + 1;
  for (int i = 0; i <= steps; i++) {
    int x = (int)lround(xa + dx * i / steps), y = (int)lround(ya + dy * i / steps);
    rect(c, x - thick / 2, y - thick / 2, x + (thick - 1) / 2, y + (thick - 1) / 2, rgb);
  }
}

/* Text at (x, y) top left, each font pixel drawn scale x scale; returns the width in pixels. */
static int text(canvas_t *c, int x, int y, int scale, const char *s, const unsigned char rgb[3]) {
  int x0 = x;
  for (; *s; s++, x += 6 * scale) {
    char ch = (char)toupper((unsigned char)*s);
    for (size_t g = 0; g < sizeof perf_font / sizeof perf_font[0]; g++) {
      if (perf_font[g].c != ch) continue;
      for (int row = 0; row < 7; row++)
        for (int col = 0; col < 5; col++)
          if (perf_font[g].rows[row] & (0x10 >> col))
            rect(c, x + col * scale, y + row * scale, x + (col + 1) * scale - 1, y + (row + 1) * scale - 1, rgb);
      break;
    }
  }
  return x - x0;
}

static int text_width(const char *s, int scale) { return (int)strlen(s) * 6 * scale; }

static double px_x(const panel_t *p, double lx) { return p->x0 + (lx - p->xmin) / (p->xmax - p->xmin) * (p->x1 - p->x0); }
static double px_y(const panel_t *p, double v) { return p->y1 - v / p->ymax * (p->y1 - p->y0); }

/* "8", "512", "1K", "64M": the sizes as nccl-tests users read them. */
static void size_label(double log2b, char *buf, size_t len) {
  static const char *const units[] = {"", "K", "M", "G", "T"};
  int e = (int)lround(log2b), u = e / 10 < 4 ? e / 10 : 4;
  snprintf(buf, len, "%lld%s", 1LL << (e - 10 * u), units[u]);
}

/* A round step for about n ticks up to max: 1, 2 or 5 times a power of ten. */
static double nice_step(double max, int n) {
  double raw = max / n, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* The frame, the grid and the tick labels of a panel; y ticks every ystep, labelled by fmt. */
static void axes(canvas_t *c, const panel_t *p, double ystep, const char *fmt, const char *ylabel) {
  char buf[32];
  for (double v = 0; v <= p->ymax * 1.0001; v += ystep) {
    int y = (int)lround(px_y(p, v));
    line(c, p->x0, y, p->x1, y, 1, grey);
    snprintf(buf, sizeof buf, fmt, v);
    text(c, p->x0 - 8 - text_width(buf, 2), y - 7, 2, buf, black);
  }
  int every = (int)ceil((p->xmax - p->xmin) / 12);
  for (int e = (int)ceil(p->xmin); e <= (int)floor(p->xmax); e++) {
    if ((e - (int)ceil(p->xmin)) % (every < 1 ? 1 : every)) continue;
    int x = (int)lround(px_x(p, e));
    line(c, x, p->y0, x, p->y1, 1, grey);
    size_label(e, buf, sizeof buf);
    text(c, x - text_width(buf, 2) / 2, p->y1 + 8, 2, buf, black);
  }
  line(c, p->x0, p->y0, p->x0, p->y1, 2, black);
  line(c, p->x0, p->y1, p->x1, p->y1, 2, black);
  text(c, p->x0, p->y0 - 22, 2, ylabel, black);
}

/* A legend entry at (x, y): a swatch and the name; returns its width. */
static int legend_at(canvas_t *c, int x, int y, const char *name, const unsigned char rgb[3]) {
  rect(c, x, y + 3, x + 20, y + 9, rgb);
  return 28 + text(c, x + 28, y, 2, name, black);
}

/* The k-th legend entry, in the top left corner of the panel. */
static void legend(canvas_t *c, const panel_t *p, int k, const char *name, const unsigned char rgb[3]) {
  legend_at(c, p->x0 + 16, p->y0 + 10 + k * 20, name, rgb);
}

/* busbw of series s (0 out of place, 1 in place, 2 NCCL) at result i; 0: not measured. */
static double series_value(const perf_result_t *r, int s) {
  return s == 2 ? r->nccl_busbw : r->time[s] > 0 ? r->busbw[s] : 0;
}

static void busbw_panel(canvas_t *c, const panel_t *pin, const perf_result_t *res, int n, int nccl) {
  panel_t p = *pin;
  double ymax = 0;
  for (int i = 0; i < n; i++)
    for (int s = 0; s < 3; s++) ymax = fmax(ymax, series_value(&res[i], s));
  double step = nice_step(ymax > 0 ? ymax : 1, 5);
  p.ymax = ceil((ymax > 0 ? ymax * 1.05 : 1) / step) * step;
  axes(c, &p, step, step < 1 ? "%.2g" : "%.0f", "busbw (GB/s)");
  static const char *const names[3] = {"flexcoll out-of-place", "flexcoll in-place", "NCCL out-of-place"};
  int shown = 0;
  for (int s = 0; s < 3; s++) {
    if (s == 2 && !nccl) continue;
    double lx = 0, ly = 0;
    int have = 0, any = 0;
    for (int i = 0; i < n; i++) {
      double v = series_value(&res[i], s), x = px_x(&p, log2((double)res[i].bytes)), y = px_y(&p, v);
      if (v <= 0 && s < 2 && res[i].time[s] <= 0) { have = 0; continue; }
      if (have) line(c, lx, ly, x, y, 3, palette[s]);
      rect(c, (int)x - 3, (int)y - 3, (int)x + 3, (int)y + 3, palette[s]);
      lx = x, ly = y, have = any = 1;
    }
    if (any) legend(c, &p, shown++, names[s], palette[s]);
  }
}

/* Every link name that carried bytes at some size, in the order first seen. */
static int all_links(const perf_result_t *res, int n, char names[PERF_MAX_LINKS][16]) {
  int k = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < res[i].nlinks; j++) {
      int m = 0;
      while (m < k && strcmp(names[m], res[i].link[j])) m++;
      if (m == k && k < PERF_MAX_LINKS) memcpy(names[k++], res[i].link[j], 16);
    }
  return k;
}

/* Stacked bars: each size's bytes split by link, the links in the same order and colour. */
static void shares_panel(canvas_t *c, const panel_t *pin, const perf_result_t *res, int n) {
  panel_t p = *pin;
  p.ymax = 1;
  axes(c, &p, 0.25, "%.2f", "share of the bytes per link");
  char names[PERF_MAX_LINKS][16];
  int nl = all_links(res, n, names);
  double width = (p.x1 - p.x0) / (double)(n + 1) * 0.6;
  if (width > 40) width = 40;
  for (int i = 0; i < n; i++) {
    double x = px_x(&p, log2((double)res[i].bytes)), base = 0;
    for (int l = 0; l < nl; l++)
      for (int j = 0; j < res[i].nlinks; j++) {
        if (strcmp(res[i].link[j], names[l])) continue;
        double top = base + res[i].share[j];
        rect(c, (int)(x - width / 2), (int)px_y(&p, top), (int)(x + width / 2), (int)px_y(&p, base), palette[l % 8]);
        base = top;
      }
  }
  /* In a row above the panel, right of its label: the bars fill the panel to the top. */
  int x = p.x0 + text_width("share of the bytes per link", 2) + 30;
  for (int l = 0; l < nl; l++) x += 20 + legend_at(c, x, p.y0 - 22, names[l], palette[l % 8]);
}

static int put_chunk(FILE *f, const char *type, const unsigned char *data, uint32_t len) {
  unsigned char hdr[8] = {len >> 24, len >> 16, len >> 8, len, type[0], type[1], type[2], type[3]};
  uLong crc = crc32(crc32(0, hdr + 4, 4), data, len);
  unsigned char tail[4] = {crc >> 24, crc >> 16, crc >> 8, crc};
  return fwrite(hdr, 1, 8, f) != 8 || (len && fwrite(data, 1, len, f) != len) || fwrite(tail, 1, 4, f) != 4;
}

/* 8-bit RGB, no interlace; every row with filter 0 (none). */
static int write_png(const char *path, const canvas_t *c, char *err, size_t errlen) {
  size_t row = (size_t)c->w * 3 + 1, raw_len = row * (size_t)c->h;
  unsigned char *raw = malloc(raw_len);
  uLongf zlen = compressBound(raw_len);
  unsigned char *z = malloc(zlen);
  int rc = -1;
  if (!raw || !z) snprintf(err, errlen, "out of memory");
  else {
    for (int y = 0; y < c->h; y++) {
      raw[row * y] = 0;
      memcpy(raw + row * y + 1, c->px + (size_t)y * c->w * 3, row - 1);
    }
    FILE *f = NULL;
    if (compress2(z, &zlen, raw, raw_len, 9) != Z_OK) snprintf(err, errlen, "zlib could not compress the image");
    else if (!(f = fopen(path, "wb"))) snprintf(err, errlen, "cannot write it");
    else {
      unsigned char ihdr[13] = {c->w >> 24, c->w >> 16, c->w >> 8, c->w, c->h >> 24, c->h >> 16, c->h >> 8, c->h, 8, 2, 0, 0, 0};
      int bad = fwrite("\x89PNG\r\n\x1a\n", 1, 8, f) != 8 || put_chunk(f, "IHDR", ihdr, 13) ||
                put_chunk(f, "IDAT", z, (uint32_t)zlen) || put_chunk(f, "IEND", NULL, 0);
      bad |= fclose(f) != 0;
      if (bad) snprintf(err, errlen, "write failed");
      rc = bad ? -1 : 0;
    }
  }
  free(raw);
  free(z);
  return rc;
}

int perf_plot_available(void) { return 1; }

int perf_plot(const char *path, const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *res, int n,
              char *err, size_t errlen) {
  if (n < 1) return snprintf(err, errlen, "no results to plot"), -1;
  int links = 0;
  for (int i = 0; i < n; i++) links |= res[i].links_used > 1;
  canvas_t c = {.w = 1000, .h = links ? 940 : 600};
  c.px = malloc((size_t)c.w * c.h * 3);
  if (!c.px) return snprintf(err, errlen, "out of memory"), -1;
  memset(c.px, 255, (size_t)c.w * c.h * 3);
  char title[160];
  snprintf(title, sizeof title, "flexcoll-perf %s, %d ranks, %s memory", o->coll, ri->nranks, o->memory);
  text(&c, (c.w - text_width(title, 3)) / 2, 16, 3, title, black);
  double lo = log2((double)res[0].bytes), hi = log2((double)res[n - 1].bytes);
  if (hi - lo < 1) lo -= 0.5, hi += 0.5;
  panel_t top = {.x0 = 110, .y0 = 90, .x1 = c.w - 40, .y1 = 520, .xmin = lo - 0.3, .xmax = hi + 0.3};
  busbw_panel(&c, &top, res, n, ri->nccl);
  text(&c, (top.x0 + top.x1 - text_width("size (bytes)", 2)) / 2, top.y1 + 32, 2, "size (bytes)", black);
  if (links) {
    panel_t bottom = top;
    bottom.y0 = 640, bottom.y1 = 880;
    shares_panel(&c, &bottom, res, n);
    text(&c, (top.x0 + top.x1 - text_width("size (bytes)", 2)) / 2, bottom.y1 + 32, 2, "size (bytes)", black);
  }
  int rc = write_png(path, &c, err, errlen);
  free(c.px);
  return rc;
}

#else /* !HAVE_ZLIB */

int perf_plot_available(void) { return 0; }

int perf_plot(const char *path, const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *res, int n,
              char *err, size_t errlen) {
  (void)path, (void)o, (void)ri, (void)res, (void)n;
  snprintf(err, errlen, "this flexcoll-perf was built without zlib (install zlib1g-dev and configure again)");
  return -1;
}

#endif

/* scaling_model.c - alpha-beta costs, their fit, and the step projection
 * (see scaling_model.h). */
#include "collectives/scaling_model.h"

#include <math.h>

#include "util/error.h"

/* latency steps and the bandwidth term's multiple of S/B, per op and algo */
static void coeffs(st_coll_op op, st_algo algo, int n, double *steps, double *mult) {
  if (n < 2) {
    *steps = 0;
    *mult = 0;
    return;
  }
  const double k = (double)(n - 1);
  if (op == ST_COLL_ALL_REDUCE && algo == ST_ALGO_TREE) {
    *steps = 2 * ceil(log2((double)n));
    *mult = 2.0;
  } else if (op == ST_COLL_ALL_REDUCE) {
    *steps = 2 * k;
    *mult = 2 * k / n;
  } else if (op == ST_COLL_BROADCAST) {
    *steps = k;
    *mult = 1.0;
  } else {
    *steps = k;
    *mult = k / n;
  }
}

double st_ab_time(st_coll_op op, st_algo algo, int n, double bytes, st_ab ab) {
  double steps, mult;
  coeffs(op, algo, n, &steps, &mult);
  return (n < 2 ? 0 : ab.overhead) + steps * ab.alpha + mult * bytes / ab.bw;
}

int st_ab_fit(st_coll_op op, int n, const double *bytes, const double *seconds, int m,
              st_ab *out, double *r2) {
  /* Relative least squares (weights 1/t^2): the sizes span 9 decades, and
   * plain least squares would fit only the largest ones, leaving alpha to
   * noise. Normal equations of min sum w (t - a - b S)^2. */
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  int distinct = 0;
  for (int i = 0; i < m; i++) {
    if (seconds[i] <= 0) continue;
    const double w = 1.0 / (seconds[i] * seconds[i]);
    sw += w;
    sx += w * bytes[i];
    sy += w * seconds[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * seconds[i];
    distinct += i == 0 || bytes[i] != bytes[i - 1];
  }
  const double den = sw * sxx - sx * sx;
  if (distinct < 2 || den <= 0)
    return st_error_set("alpha-beta fit of %s needs 2 or more sizes", st_coll_name(op));
  const double b = (sw * sxy - sx * sy) / den, a = (sy - b * sx) / sw;
  if (b <= 0)
    return st_error_set("alpha-beta fit of %s: time does not grow with size", st_coll_name(op));
  double steps, mult;
  coeffs(op, ST_ALGO_RING, n, &steps, &mult);
  if (mult <= 0)
    return st_error_set("alpha-beta fit of %s needs 2 or more ranks", st_coll_name(op));
  out->overhead = a > 0 ? a : 0;
  out->alpha = 0;
  out->bw = mult / b;
  if (r2) {
    /* R^2 of the relative residuals, against predicting every time by the
     * weighted mean: how much of the variation the size explains */
    const double tbar = sy / sw;
    double ss_res = 0, ss_tot = 0;
    for (int i = 0; i < m; i++) {
      if (seconds[i] <= 0) continue;
      const double e = (seconds[i] - a - b * bytes[i]) / seconds[i];
      const double d = (seconds[i] - tbar) / seconds[i];
      ss_res += e * e;
      ss_tot += d * d;
    }
    *r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
  }
  return 0;
}

st_ab st_cluster_link(const st_cluster *cl) {
  if (cl->nodes <= 1) return cl->intra;
  st_ab l;
  l.overhead = cl->intra.overhead;
  l.bw = cl->inter.bw < cl->intra.bw ? cl->inter.bw : cl->intra.bw;
  l.alpha = cl->inter.alpha > cl->intra.alpha ? cl->inter.alpha : cl->intra.alpha;
  return l;
}

void st_project_step(const st_step_model *sm, const st_cluster *cl, st_algo algo,
                     st_step_projection *out) {
  const int n = cl->nodes * cl->gpus_per_node;
  const st_ab link = st_cluster_link(cl);
  double red, ag = 0;
  if (sm->zero_stage == 0) {
    red = st_ab_time(ST_COLL_ALL_REDUCE, algo, n, sm->params * sm->grad_bytes, link);
  } else {
    red = st_ab_time(ST_COLL_REDUCE_SCATTER, ST_ALGO_RING, n, sm->params * sm->grad_bytes, link);
    ag = st_ab_time(ST_COLL_ALL_GATHER, ST_ALGO_RING, n, sm->params * sm->weight_bytes, link);
  }
  out->comm_s = red + ag;
  out->exposed_s = (1.0 - sm->overlap) * red + ag;
  out->step_s = sm->compute_s + out->exposed_s;
  out->efficiency = out->step_s > 0 ? sm->compute_s / out->step_s : 1.0;
}

/* scaling_model.h - the alpha-beta (latency-bandwidth) model of the
 * collectives (Hockney 1994; Thakur, Rabenseifner & Gropp 2005 for the ring
 * and tree costs; Patarasuk & Yuan 2009 for the ring all-reduce's optimal
 * bandwidth term), fitted to measured points and used to project a ZeRO
 * training step to more nodes.
 *
 * Costs, n ranks, S total bytes, alpha the per-step latency (s) and B the
 * per-rank link bandwidth (bytes/s) of the slowest hop on the path:
 *   ring all-reduce       2(n-1) alpha + 2(n-1)/n S/B
 *   ring reduce-scatter,
 *   ring all-gather        (n-1) alpha +  (n-1)/n S/B
 *   tree all-reduce       2 ceil(log2 n) alpha + 2 S/B  (pipelined up and down
 *                         a binary tree: each byte crosses a link twice)
 *   broadcast (ring/pipe)  (n-1) alpha + S/B
 * so for the ring B is exactly nccl-tests' busbw at large S. Each call also
 * pays a fixed overhead o (launch, and the host seeing completion), so
 *   t = o + steps alpha + multiple S/B.
 * Measured on one rank count, steps is fixed, so o and steps alpha cannot be
 * told apart: the fit puts the whole intercept into o (alpha = 0) and the
 * projection takes the per-hop latencies from the cluster description.
 */
#ifndef ST_SCALING_MODEL_H
#define ST_SCALING_MODEL_H

#include <stddef.h>

#include "collectives/busbw.h"

typedef enum { ST_ALGO_RING = 0, ST_ALGO_TREE = 1 } st_algo;

typedef struct {
  double overhead; /* seconds per call */
  double alpha;    /* seconds per step */
  double bw;       /* bytes per second per rank (the ring's busbw) */
} st_ab;

/* Predicted seconds for op over S bytes on n ranks with algo and link ab. */
double st_ab_time(st_coll_op op, st_algo algo, int n, double bytes, st_ab ab);

/* Fit of the ring model to m measured (bytes[i], seconds[i]) points of op
 * on n ranks, by least squares on relative residuals: t = a + b S gives
 * overhead = a, alpha = 0 (see above) and bw = multiple / b. Returns 0, or -1
 * when fewer than 2 distinct sizes or the fit gives a non-positive slope. r2
 * (if not NULL) gets the fit's R^2. */
int st_ab_fit(st_coll_op op, int n, const double *bytes, const double *seconds, int m,
              st_ab *out, double *r2);

/* A cluster of nodes x gpus_per_node ranks: intra-node links (NVLink) and
 * the network, as seen by one GPU. */
typedef struct {
  int nodes, gpus_per_node;
  st_ab intra, inter; /* inter.bw: network bandwidth per GPU (NIC share) */
} st_cluster;

/* The link a flat ring over the whole cluster is limited by: the slower
 * bandwidth and the larger per-hop latency of the hops it crosses (intra
 * only on one node); the per-call overhead is intra's (it is the host's). */
st_ab st_cluster_link(const st_cluster *cl);

/* One data-parallel step around compute_s of forward+backward+optimizer per
 * GPU. ZeRO 1/2: reduce-scatter of the fp32 gradients (grad_bytes x P) and
 * all-gather of the working weights (weight_bytes x P); ZeRO 0: all-reduce
 * of the gradients (ring or tree). A fraction `overlap` of the gradient
 * reduction hides behind backward; the all-gather does not (it follows the
 * optimizer). */
typedef struct {
  int zero_stage;
  double params;     /* P */
  double compute_s;  /* per GPU per step, at the per-GPU micro-batch */
  double overlap;    /* 0..1 */
  double grad_bytes, weight_bytes; /* per parameter: 4 and 2 */
} st_step_model;

typedef struct {
  double comm_s, exposed_s, step_s, efficiency; /* efficiency = compute / step */
} st_step_projection;

/* algo: the all-reduce's algorithm (ZeRO 0); reduce-scatter and
 * all-gather are rings. */
void st_project_step(const st_step_model *sm, const st_cluster *cl, st_algo algo,
                     st_step_projection *out);

#endif

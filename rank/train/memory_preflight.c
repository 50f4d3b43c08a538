/* memory_preflight.c - a rank's attention choice and memory pre-flight,
 * before anything is allocated (part of st_trainer_setup, trainer_state.h):
 * which attention runs and what its workspace costs, the budget every rank
 * agrees on, --auto-fit's choice, and the plan checked against the GPU (and,
 * with --offload optimizer, the host). docs/memory.md has the rules. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif
#include "rank/memory/host_mem.h"
#include "rank/memory/memory_fit.h"
#include "rank/train/trainer_state.h"
#include "util/bytes.h"
#include "util/error.h"

/* --attention: which attention the CUDA tables run for the training shape,
 * want (asked: the --attention the user gave, which the note names).
 * cuDNN's plans are built here, before the memory check, because their
 * workspace is part of the plan. The CPU has only its reference. */
static int setup_attention_as(trainer *tr, st_attention_impl want, st_attention_impl asked) {
  if (tr->device_index < 0) {
    if (want == ST_ATTENTION_CUDNN || want == ST_ATTENTION_MIXED)
      return st_error_setc(ST_EXIT_USAGE, "--attention %s needs the CUDA backend (bf16 or "
                           "fp16); the CPU runs its fp32 reference: use --attention auto|flash",
                           st_attention_name(want));
    snprintf(tr->attn_note, sizeof tr->attn_note, "the CPU reference (softmax kept, T x T per "
             "head)");
    return 0;
  }
#ifdef SHARDTRAIN_HAVE_CUDA
  const st_run_config *rc = tr->rc;
  const st_model_config *m = &rc->model;
  st_attention_choice ch;
  st_cuda_attention_group_cap(tr->attn_group);
  /* cuDNN's plans are built per head layout: GQA's K/V have n_kv_head heads */
  if (st_cuda_attention_select_as(want, asked, tr->ops->dtype, rc->micro_batch, rc->seq_len,
                                  m->n_embd, m->n_head, m->n_kv_head ? m->n_kv_head : m->n_head,
                                  &ch))
    return -1;
  snprintf(tr->attn_note, sizeof tr->attn_note, "%s", ch.note);
  tr->attn_cudnn_bwd = ch.impl == ST_ATTENTION_CUDNN;
  /* the workspace serves one backward call of bseq sequences (mixed: the
   * forward's, for the micro-batch) */
  const size_t bseq = tr->attn_cudnn_bwd
                          ? (size_t)st_attention_cudnn_group(rc->micro_batch, tr->attn_group)
                          : (size_t)rc->micro_batch;
  tr->attn_ws_per_seq = (ch.workspace_bytes + bseq - 1) / bseq;
  st_cuda_attention_workspace_at_least(tr->attn_ws_per_seq * bseq);
#else
  (void)asked;
#endif
  return 0;
}

/* The --attention the user gave (the CLI and the config reader accept only
 * its four words). */
static st_attention_impl asked_attention(const trainer *tr) {
  st_attention_impl a = ST_ATTENTION_AUTO;
  (void)st_attention_parse(tr->rc->attention, &a);
  return a;
}

int st_trainer_setup_attention(trainer *tr) {
  return setup_attention_as(tr, asked_attention(tr), asked_attention(tr));
}

/* cuDNN's plans again, for backward calls of at most `group` sequences. */
static int take_groups(trainer *tr, st_plan_input *in, int group) {
  tr->attn_group = group;
  if (st_trainer_setup_attention(tr)) return -1;
  in->attn_workspace_per_seq = tr->attn_ws_per_seq;
  in->attn_group = group;
  const size_t n = strlen(tr->attn_note);
  snprintf(tr->attn_note + n, sizeof tr->attn_note - n, "; the whole micro-batch's backward "
           "workspace does not fit beside the rest of the plan, so one call per group "
           "(docs/memory.md)");
  return 0;
}

/* --attention auto after the rest of the configuration is settled
 * (st_plan_attention_groups): cuDNN, chosen by setup_attention when it has a
 * plan for the shape, stays only if its O(T^2) workspace fits beside the
 * plan of *in (made without it) in the budget cap, for the whole
 * micro-batch or else for the largest group of sequences per backward call
 * that fits; else ours runs, O(T), and the note says why. --attention
 * cudnn keeps cuDNN, in groups only where the whole workspace does not fit
 * and a group does. in->attn_workspace_per_seq and in->attn_group become
 * what runs. */
static int settle_attention(trainer *tr, st_plan_input *in, uint64_t cap) {
  in->attn_workspace_per_seq = tr->attn_ws_per_seq;
  in->attn_group = tr->attn_group;
  if (!tr->attn_ws_per_seq || !tr->attn_cudnn_bwd) return 0;
  /* asked for cuDNN, groups go down to one sequence a call, and when none
   * fits the pre-flight reports the whole plan */
  const st_attention_impl given = asked_attention(tr);
  const int asked = given == ST_ATTENTION_CUDNN;
  if (!asked && given != ST_ATTENTION_AUTO) return 0;
  const int least = st_plan_attention_least_group(in, asked);
  st_plan_input t = *in;
  t.gpu_mem = cap;
  t.attn_workspace_per_seq = 0;
  st_memory_plan with;
  int group = 0;
  const int r = st_plan_attention_groups(&t, tr->attn_ws_per_seq, least, &with, &group);
  if (r < 0) return -1;
  if (r && group) return take_groups(tr, in, group);
  if (r || asked) return 0;
  char a[32], b[32];
  const uint64_t ws = st_plan_attention_workspace(tr->attn_ws_per_seq, tr->rc->micro_batch, least);
  st_format_bytes(ws, a, sizeof a);
  if (cap) st_format_bytes(with.usable, b, sizeof b);
  /* cuDNN's forward with our backward; ours both ways where cuDNN's
   * forward will not build after all */
  if (setup_attention_as(tr, ST_ATTENTION_MIXED, ST_ATTENTION_AUTO) &&
      setup_attention_as(tr, ST_ATTENTION_FLASH, ST_ATTENTION_AUTO))
    return -1;
  const size_t n = strlen(tr->attn_note);
  snprintf(tr->attn_note + n, sizeof tr->attn_note - n, "; --attention auto: cuDNN's "
           "deterministic backward needs %s of O(T^2) workspace (%d sequence%s a call), which "
           "%s (docs/memory.md)", a, least, least == 1 ? "" : "s",
           cap ? "does not fit beside the rest of the plan" : "no budget allows");
  if (cap) {
    const size_t k = strlen(tr->attn_note);
    snprintf(tr->attn_note + k, sizeof tr->attn_note - k, " [%s usable]", b);
  }
  in->attn_workspace_per_seq = tr->attn_ws_per_seq; /* cuDNN's forward's, or 0 */
  in->attn_group = 0;
  return 0;
}

/* This rank's configuration as the memory planner takes it. */
static void plan_input_of(const trainer *tr, st_plan_input *in) {
  st_run_plan_input(tr->rc, tr->comm->world,
                    tr->device_index >= 0 ? ST_BACKEND_CUDA : ST_BACKEND_CPU, tr->ops->dtype, in);
  in->attn_workspace_per_seq = tr->attn_ws_per_seq;
  in->attn_group = tr->attn_group;
  /* one rank's device collectives are copies unless ST_NCCL_ONE_RANK=1 made
   * a communicator (collectives/collectives_nccl.c) */
  in->nccl_one_rank = tr->comm->world == 1 && tr->dcomm && tr->dcomm->backend &&
                      strcmp(tr->dcomm->backend, "nccl") == 0;
  in->master_fp32 = tr->master_fp32;
}

/* The budget every rank plans against: the smallest over ranks, so that all
 * ranks make the same choice (on GPUs each reads its own free memory). */
static int agree_budget(trainer *tr, uint64_t *cap) {
  st_comm *c = tr->comm;
  double *all = calloc((size_t)c->world, sizeof *all);
  if (!all) return st_error_set("out of host memory");
  all[c->rank] = (double)*cap; /* exact: budgets are far below 2^53 bytes */
  int rc = c->all_reduce_double_sum(c, all, (size_t)c->world);
  for (int r = 0; !rc && r < c->world; r++)
    if ((uint64_t)all[r] < *cap) *cap = (uint64_t)all[r];
  free(all);
  return rc;
}

/* --auto-fit / --auto-fit-zero (docs/memory.md, "train --auto-fit"): before
 * anything is allocated, choose micro-batch, accumulation, recompute and,
 * with --auto-fit-zero, the ZeRO stage, with the query plan --fit makes from
 * the same flags; apply the choice to the run's settings and keep its
 * explanation for the configuration block and metrics.jsonl. *in is updated
 * to the choice. Collective (the budget is agreed on). */
static int setup_auto_fit(trainer *tr, st_plan_input *in, uint64_t cap) {
  st_run_config *rc = tr->rc;
  char a[32], b[32], c[32];
  if (!cap)
    return st_error_setc(ST_EXIT_USAGE, "--auto-fit needs a memory budget: give --gpu-mem SIZE "
                         "(the CPU backend has no device memory to read)");
  /* plan --fit reads the device's total; free memory plus the context
   * estimate can exceed it on an idle GPU, so the budget is the smaller. */
  if (tr->have_dev_mem && tr->dev_total && cap > tr->dev_total) cap = tr->dev_total;
  if (agree_budget(tr, &cap)) return -1;
  in->gpu_mem = cap;
  const st_plan_input given = *in;
  st_plan_fit_query q;
  st_fit_query_make(in, rc->global_batch, rc->micro_batch_given ? rc->micro_batch : 0,
                    rc->recompute_given ? in->recompute : ST_RECOMPUTE_NONE, rc->zero_stage,
                    rc->auto_fit == 2, &q);
  st_plan_fit f;
  if (st_memory_plan_fit(&q, &f)) return -1;
  const st_plan_choice *ch = f.found ? &f.choice : &f.least;
  if (!f.found)
    return st_error_setc(ST_EXIT_MEMORY, "--auto-fit: nothing fits %s usable per rank (%s, less "
                         "%g%% headroom) for global batch %d on %d rank(s): even micro-batch %d, "
                         "recompute %s, ZeRO %d needs %s. Use more ranks%s, a shorter --seq-len "
                         "or a smaller model%s (shardtrain plan --fit shows the search; "
                         "docs/memory.md)", st_format_bytes(ch->plan.usable, a, sizeof a),
                         tr->plan_source, in->headroom_pct, rc->global_batch, tr->comm->world,
                         ch->in.micro_batch, st_recompute_name(ch->in.recompute),
                         ch->in.zero_stage, st_format_bytes(ch->plan.capped, b, sizeof b),
                         rc->auto_fit == 2 ? "" : ", --auto-fit-zero",
                         st_run_grad_bf16(rc) ? " (--grad-dtype bf16 allows only one micro-step "
                                                "a step: --grad-dtype fp32 lets it accumulate)"
                                              : "");
  char why[4096], change[300];
  st_plan_fit_explain(&q, &f, "               ", why, sizeof why);
  st_plan_describe_change(&given, &ch->in, rc->global_batch, change, sizeof change);
  snprintf(tr->auto_fit_text, sizeof tr->auto_fit_text,
           "  auto-fit   micro-batch %d x grad-accum %d, recompute %s, ZeRO %d%s: plan %s of %s "
           "usable (%s, less %g%% headroom), %s to spare\n"
           "             %s%s\n%s\n", ch->in.micro_batch, ch->accum,
           st_recompute_name(ch->in.recompute), ch->in.zero_stage,
           rc->auto_fit == 2 ? " (stage chosen: --auto-fit-zero)" : " (stage as given)",
           st_format_bytes(ch->plan.capped, a, sizeof a),
           st_format_bytes(ch->plan.usable, b, sizeof b), tr->plan_source, in->headroom_pct,
           st_format_bytes((uint64_t)ch->plan.spare, c, sizeof c),
           change[0] ? "changed from the flags: " : "the flags' own settings fit and cost least",
           change, why);
  cJSON *j = st_plan_fit_cjson(&q, &f);
  if (j) {
    cJSON_AddStringToObject(j, "changed", change);
    tr->auto_fit_json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
  }
  if (!tr->auto_fit_json) return st_error_set("out of host memory");
  rc->micro_batch = ch->in.micro_batch;
  snprintf(rc->recompute, sizeof rc->recompute, "%s", st_recompute_name(ch->in.recompute));
  rc->zero_stage = ch->in.zero_stage;
  rc->offload = ch->in.offload;
  if (rc->offload) st_trainer_split_host_threads(tr, tr->env);
  tr->accum = ch->accum;
  *in = ch->in;
  in->gpu_mem = 0; /* the caller sets its own rank's cap again */
  return 0;
}

/* Pre-flight (docs/memory.md): before anything is allocated, this rank's
 * memory plan must fit --gpu-mem when given and, on CUDA, the device's free
 * memory, each less --headroom percent. Free memory is read after the CUDA
 * context and the NCCL communicator exist, so the plan's context estimate
 * is added to it rather than counted twice. When it does not fit, the
 * message names the smallest change that would: --fit's search from the
 * current settings (micro-batch at most the current one, recompute from the
 * current policy up, the current ZeRO stage first, then higher, then
 * lower). The CPU checks only against --gpu-mem. */
int st_trainer_memory_check(trainer *tr) {
  st_run_config *rc = tr->rc;
  st_plan_input in;
  plan_input_of(tr, &in);
  uint64_t cap = rc->gpu_mem;
  char a[32], b[32], c[32];
  if (rc->enforce_gpu_mem && (!cap || tr->device_index < 0))
    return st_error_setc(ST_EXIT_USAGE, "--enforce-gpu-mem holds a GPU's memory above --gpu-mem: "
                         "%s", !cap ? "give --gpu-mem SIZE too" : "it needs the CUDA backend");
  if (cap) snprintf(tr->plan_source, sizeof tr->plan_source, "--gpu-mem %s",
                    st_format_bytes(cap, a, sizeof a));
#ifdef SHARDTRAIN_HAVE_CUDA
  if (tr->device_index >= 0) {
    uint64_t fr, tot;
    char name[160];
    if (st_plan_device_memory(&fr, &tot, name, sizeof name)) return -1;
    if (rc->enforce_gpu_mem) {
      uint64_t held;
      if (st_cuda_hold_above(rc->gpu_mem, &held)) return -1;
      tr->gpu_mem_held = held;
      if (st_plan_device_memory(&fr, &tot, name, sizeof name)) return -1;
    }
    tr->have_dev_mem = 1;
    tr->dev_free_before = fr;
    tr->dev_total = tot;
    const uint64_t made = st_plan_context_bytes(in.world, in.nccl_one_rank);
    const uint64_t avail = fr + made;
    if (!cap || avail < cap) {
      cap = avail;
      snprintf(tr->plan_source, sizeof tr->plan_source,
               "%s free on %s + the %s estimate of the CUDA context%s, already made",
               st_format_bytes(fr, a, sizeof a), name, st_format_bytes(made, b, sizeof b),
               made > ST_PLAN_CUDA_CONTEXT ? " and NCCL communicator" : "");
    }
  }
#endif
  const int asked_batch = rc->micro_batch;
  /* everything else is chosen as if ours ran; cuDNN's workspace is added
   * afterwards only where it fits (settle_attention) */
  if (asked_attention(tr) == ST_ATTENTION_AUTO) in.attn_workspace_per_seq = 0;
  if (tr->gpu_mem_held) {
    size_t n = strlen(tr->plan_source);
    snprintf(tr->plan_source + n, sizeof tr->plan_source - n, "; --enforce-gpu-mem holds %s of "
             "the GPU", st_format_bytes(tr->gpu_mem_held, c, sizeof c));
  }
  if (rc->auto_fit && setup_auto_fit(tr, &in, cap)) return -1;
  if (rc->micro_batch != asked_batch && tr->device_index >= 0) {
    /* cuDNN's plans and workspace are per shape: choose again at the
     * micro-batch auto-fit picked, so the arena holds that workspace */
    if (st_trainer_setup_attention(tr)) return -1;
  }
  if (tr->device_index >= 0 && settle_attention(tr, &in, cap)) return -1;
  if (tr->device_index < 0) in.attn_workspace_per_seq = tr->attn_ws_per_seq;
  in.gpu_mem = cap;
  if (st_memory_plan_make(&in, &tr->plan)) return -1;
  /* --offload optimizer: the host's share too (on the CPU the device is host memory) */
  const uint64_t host_need = tr->plan.host_total + tr->plan.host_ckpt_staging +
                             (in.offload && tr->device_index < 0 ? tr->plan.total : 0);
  if ((in.offload || host_need) &&
      st_host_mem_check(host_need, tr->env ? tr->env->local_world : 0, &tr->host_avail,
                        tr->host_source, sizeof tr->host_source)) {
    if (in.offload || !tr->host_avail) return -1;
    char need_s[32], avail_s[32];
    return st_error_set("--ckpt-async on needs %s of pinned host memory per rank to stage "
                        "checkpoints (fp32 weights, Adam m and v of the rank's shard), but %s "
                        "is available (%s): train with --ckpt-async off (each save then holds "
                        "training until it is written), or more ranks per model",
                        st_format_bytes(host_need, need_s, sizeof need_s),
                        st_format_bytes(tr->host_avail, avail_s, sizeof avail_s),
                        tr->host_source);
  }
  if (tr->plan.fits != 0) {
    tr->plan_json = st_memory_plan_json(rc->model_name, rc->global_batch, tr->accum, &in,
                                        &tr->plan, tr->plan_source);
    return tr->plan_json ? 0 : st_error_set("out of host memory");
  }
  const st_memory_plan *p = &tr->plan;
  st_plan_fit_query q;
  memset(&q, 0, sizeof q);
  q.base = in;
  q.global_batch = rc->global_batch;
  q.search_zero = 2; /* keep the stage if possible, else the next higher */
  q.order = ST_FIT_NEAREST; /* the smallest change to what was asked for */
  st_plan_fit f;
  if (st_memory_plan_fit(&q, &f)) return -1;
  st_error_code(ST_EXIT_MEMORY);
  char what[512], change[300];
  snprintf(what, sizeof what, "the memory plan needs %s per rank, %s is usable (%s, less %g%% "
           "headroom)", st_format_bytes(p->capped, a, sizeof a),
           st_format_bytes(p->usable, b, sizeof b), tr->plan_source, in.headroom_pct);
  if (!f.found)
    return st_error_set("%s, and nothing fits: even micro-batch %d, recompute %s, ZeRO %d needs "
                        "%s. Use more ranks, a shorter --seq-len or a smaller model "
                        "(shardtrain plan shows the table; docs/memory.md)", what,
                        f.least.in.micro_batch, st_recompute_name(f.least.in.recompute),
                        f.least.in.zero_stage, st_format_bytes(f.least.plan.capped, c, sizeof c));
  st_plan_describe_change(&in, &f.choice.in, rc->global_batch, change, sizeof change);
  char alt[400] = "";
  if (f.has_alt[in.recompute]) { /* the same policy at a smaller micro-batch */
    char d[300];
    const st_plan_choice *ac = &f.alt[in.recompute];
    st_plan_describe_change(&in, &ac->in, rc->global_batch, d, sizeof d);
    snprintf(alt, sizeof alt, "; or, keeping --recompute %s: %s (plan %s)",
             st_recompute_name(in.recompute), d, st_format_bytes(ac->plan.capped, b, sizeof b));
  }
  return st_error_set("%s. The smallest change that fits: %s (plan %s)%s. shardtrain plan shows "
                      "the table and --fit the choices; train --auto-fit instead applies the "
                      "cheapest by estimated step time (docs/memory.md)", what, change,
                      st_format_bytes(f.choice.plan.capped, c, sizeof c), alt);
}

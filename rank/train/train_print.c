/* train_print.c - the configuration block rank 0 prints before step 1 (see
 * trainer_state.h, st_trainer_print_config). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHARDTRAIN_HAVE_CUDA
#include "collectives/collectives_nccl.h"
#endif
#include "io/tokens.h"
#include "rank/train/trainer_state.h"
#include "util/bytes.h"

void st_trainer_print_config(trainer *tr, int resumed, const char *from) {
  st_run_config *rc = tr->rc;
  const st_model_config *m = &rc->model;
  const st_env *e = tr->env;
  if (tr->comm->rank != 0) return;
  printf("shardtrain %s | train\n", SHARDTRAIN_VERSION);
  printf("  model      %s: %d layers, %d heads, width %d, seq-len %d, vocab %d (padded %d)\n",
         rc->model_name, m->n_layer, m->n_head, m->n_embd, rc->seq_len, m->vocab_size,
         m->padded_vocab_size);
  char arch[256];
  if (st_model_describe(m, arch, sizeof arch)[0]) printf("  arch       %s\n", arch);
  if (rc->seq_len != m->block_size || rc->init_from[0])
    printf("  positions  %d (%s%s%s), training at seq-len %d\n", m->block_size,
           m->pos == ST_POS_ROPE ? "rotary" : "rows of wpe",
           rc->init_from[0] ? "; --init-from " : "", rc->init_from, rc->seq_len);
  if (rc->lora.rank > 0) {
    char spec[256];
    st_lora_format(&rc->lora, spec, sizeof spec);
    printf("  params     %lld trainable (LoRA %s, scale %g) of %lld (%.3f%%); base frozen, "
           "SHA-256 %.16s...\n", (long long)tr->model.tab.total, spec,
           (double)st_lora_scale(&rc->lora), (long long)tr->model.base_tab.total,
           100.0 * (double)tr->model.tab.total / (double)tr->model.base_tab.total,
           rc->lora_base_digest);
    /* what the frozen base is held in: under QLoRA its projections are
     * NF4, which changes the model that trains (docs/lora.md) */
    const st_memory_plan *p = &tr->plan;
    const char *dt = st_dtype_name(tr->model.ops->dtype);
    char a[32], b[32], c[32];
    if (rc->lora.nf4_base)
      printf("  base       dtype nf4 (QLoRA, --base-dtype nf4): every block's 4 projection "
             "weights in NF4, %s; embeddings, norms and head in %s, %s; dequantisation scratch "
             "%s\n",
             st_format_bytes(p->weights_nf4, a, sizeof a), dt,
             st_format_bytes(p->weights_base, b, sizeof b),
             st_format_bytes(p->nf4_scratch, c, sizeof c));
    else
      printf("  base       dtype %s (the working dtype; --base-dtype nf4 quantises its "
             "projections), %s\n", dt, st_format_bytes(p->weights_base, a, sizeof a));
  } else {
    printf("  params     %lld (%.2f M)\n", (long long)tr->model.tab.total,
           tr->model.tab.total / 1e6);
  }
  printf("  batch      micro-batch %d x grad-accum %d x %d rank%s = global batch %d sequences "
         "x %d = %lld tokens\n", rc->micro_batch, tr->accum, tr->comm->world,
         tr->comm->world == 1 ? "" : "s", rc->global_batch,
         rc->seq_len, (long long)tr->step_tokens);
  printf("  ranks      %d on %d node(s), launched by %s; backend %s on %s", tr->comm->world,
         e->node_count, e->launcher, tr->model.ops->name, tr->device_name);
  if (tr->device_index < 0)
    printf(" (%d OpenMP threads/rank%s)", omp_get_max_threads(),
           tr->omp_auto ? ": cores / ranks on the node, as OMP_NUM_THREADS is unset" : "");
  printf("; collectives %s\n", tr->dcomm->backend);
#ifdef SHARDTRAIN_HAVE_CUDA
  if (tr->dcomm == &tr->nccl) printf("  nccl       %s\n", st_comm_nccl_describe(tr->dcomm));
#endif
  printf("  attention  %s\n", tr->attn_note);
  if (tr->comm->world == 1) { /* nothing to reduce or gather: say what one rank does */
    printf("  zero       stage %d on one rank: no reduce-scatter or all-gather (one rank holds "
           "everything: the whole gradient and Adam m/v for every parameter)%s\n",
           rc->zero_stage,
           rc->zero_stage == 2 ? "; gradients still pass block by block through a one-block "
                                 "bucket, as on several ranks (which use two)"
           : rc->zero_stage == 3 ? "; gradients pass through a one-block bucket and each "
                                   "block's weights are copied into one of two block buffers "
                                   "before it runs, as on several ranks"
                                 : "");
  } else {
    printf("  zero       stage %d: %s\n", rc->zero_stage,
           rc->zero_stage == 0 ? "all-reduce gradients, full Adam state per rank"
           : rc->zero_stage == 3
               ? "weights, gradient and Adam m/v shards of 1/N per rank (the embedding and head "
                 "whole on every rank); each block's weights all-gathered into one of two block "
                 "buffers before its forward and its backward, the next block's gather "
                 "overlapping this one's compute; each block's gradients reduce-scattered as "
                 "its backward ends; after the step only the head is gathered"
           : rc->zero_stage == 2
               ? "each block's gradients reduce-scattered as its backward ends (two one-block "
                 "buckets), gradient and Adam m/v shards of 1/N per rank, all-gather parameters"
               : "reduce-scatter gradients, Adam m/v for 1/N of the parameters per rank, "
                 "all-gather parameters");
  }
  if (tr->grad_dtype == ST_BF16)
    printf("  gradients  bf16 shard (--grad-dtype bf16): backward writes fp32 buckets; each "
           "range is rounded once to nearest even %s; the norm and AdamW read bf16\n",
           tr->comm->world > 1 ? "after its fp32 reduce-scatter"
                               : "as its block's backward ends (one rank: nothing to reduce)");
  {
    const st_memory_plan *p = &tr->plan;
    char a[32], b[32], c[32], d[32], g[32], h[32];
    printf("  memory     planned %s per %s (weights %s, gradients %s, optimizer %s, activations "
           "%s with recompute %s, other %s); ", st_format_bytes(p->total, a, sizeof a),
           tr->device_index >= 0 ? "GPU" : "rank",
           st_format_bytes(p->weights, b, sizeof b), st_format_bytes(p->grads, g, sizeof g),
           st_format_bytes(p->grad_shard + p->master + p->adam_m + p->adam_v, h, sizeof h),
           st_format_bytes(p->acts.total, c, sizeof c), st_recompute_name(tr->model.recompute),
           st_format_bytes(p->tokens + p->cublaslt + p->scratch + p->attn_workspace + p->nccl +
                               p->context, d, sizeof d));
    if (p->fits < 0) printf("not checked (no --gpu-mem on the CPU)\n");
    else printf("fits %s less %g%% with %s to spare%s\n", tr->plan_source, rc->headroom_pct,
                st_format_bytes((uint64_t)p->spare, a, sizeof a),
                p->capped != p->total ? " (the offloaded optimizer state counted too: on the "
                                        "CPU it is this rank's memory)" : "");
    if (tr->offload.on) /* rank/optim/offload.h */
      printf("  offload    optimizer: fp32 master weights, Adam m and v on the host (%s pinned per "
             "rank with staging, chunks of %lld elements), AdamW on %d host thread(s); host "
             "memory fits %s of %s\n", st_format_bytes(p->host_total, a, sizeof a),
             (long long)tr->offload.chunk, omp_get_max_threads(),
             st_format_bytes(tr->host_avail, b, sizeof b),
             tr->host_source);
    printf("  checkpoint saves %s\n", st_trainer_ckpt_mode(tr));
    if (rc->dump_grads_every > 0)
      printf("  grads      the reduced gradients of every %d-th step%s%s into %s/grads "
             "(--dump-grads; shardtrain grads norms|diff)\n", rc->dump_grads_every,
             rc->dump_grads_pattern[0] ? ", tensors " : "", rc->dump_grads_pattern, rc->out);
    if (tr->have_dev_mem) /* rank 0's GPU */
      printf("  device     %s: %s free of %s before allocation, %s free after setup (%s taken)\n",
             tr->device_name, st_format_bytes(tr->dev_free_before, a, sizeof a),
             st_format_bytes(tr->dev_total, b, sizeof b),
             st_format_bytes(tr->dev_free_after, c, sizeof c),
             st_format_bytes(tr->dev_free_before > tr->dev_free_after
                                 ? tr->dev_free_before - tr->dev_free_after : 0, d, sizeof d));
  }
  if (tr->auto_fit_text[0]) printf("%s", tr->auto_fit_text);
  printf("  monitor    every %d step(s) and at each epoch's end, into metrics.jsonl: %s; ",
         tr->stats_every, tr->mon.source);
  if (rc->mem_warn_fraction > 0)
    printf("warns once above %g of the total (--mem-warn-fraction)\n", rc->mem_warn_fraction);
  else printf("no warning (--mem-warn-fraction 0)\n");
  printf("  data       %s: %lld train tokens", rc->data, (long long)tr->ntrain);
  if (tr->train.n > 1)
    printf(" in %d shards, %s", tr->train.n, tr->shuffle ? "shuffled (seeded, per epoch)"
                                                          : "in order (--shuffle off)");
  if (tr->val.n && rc->val_seqs == 0) printf(", validation off (--val-seqs 0)");
  else if (tr->val.n && !rc->val_data[0])
    printf(", %lld val tokens (%s /val split)", (long long)tr->nval,
           tr->val.n > 1 ? "their" : "its");
  else if (tr->val.n) printf(", %lld val tokens (%s)", (long long)tr->nval, rc->val_data);
  else printf(", no validation split");
  if (tr->feed && !st_data_feed_threaded(tr->feed)) printf(", read without prefetch");
  if (rc->tokenizer_digest[0])
    printf("\n  tokenizer  %s, vocabulary %d, digest %.16s", rc->tokenizer_name,
           rc->tokenizer_vocab, rc->tokenizer_digest);
  printf("\n  optimizer  AdamW lr %g (warmup %d, cosine to %g by step %lld), wd %g, betas "
         "(%g, %g), clip %g\n", rc->optim.lr, rc->optim.warmup_steps,
         rc->optim.lr * rc->optim.min_lr_frac, (long long)rc->optim.total_steps,
         rc->optim.weight_decay, rc->optim.beta1, rc->optim.beta2, rc->optim.grad_clip);
  if (rc->warmup_capped_from > 0)
    printf("  notice     the warmup (--warmup %d) is longer than the %lld-step schedule: it is %d steps "
           "(raise --steps or --lr-decay-steps for the full warmup)\n", rc->warmup_capped_from,
           (long long)rc->optim.total_steps, rc->optim.warmup_steps);
  if (getenv("NCCL_BUFFSIZE") && tr->device_index < 0)
    printf("  notice     NCCL_BUFFSIZE is set, but the CPU backend's collectives are MPI's: it "
           "is ignored\n");
  if (getenv("ST_TIMELINE") && !tr->ops->timeline_mark)
    printf("  notice     ST_TIMELINE is set, but the %s backend records no GPU timeline: it is "
           "ignored (docs/benchmarks.md)\n", tr->ops->name);
  printf("  run        %s, %lld steps, seed %llu; ", rc->out, (long long)rc->steps,
         (unsigned long long)rc->seed);
  if (resumed) {
    printf("resumed from %s at step %lld\n", from, (long long)tr->step);
    printf("%s", tr->resume_note.text);
  }
  else if (strcmp(rc->resume, "none") == 0) printf("fresh start (--resume none)\n");
  else printf("fresh start (no checkpoint in %s/ckpt)\n", rc->out);
  fflush(stdout);
}

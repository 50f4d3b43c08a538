/* plan.c - `shardtrain plan` (see plan.h): the memory table, or --fit's
 * choice with the reasons for it, as text or one JSON object. */
#include "launcher/plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#include "launcher/cli.h"
#include "rank/memory/memory_fit.h"
#include "rank/memory/nccl_buffsize.h"
#include "rank/model/model.h"
#include "util/bytes.h"
#include "util/error.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif


/* 1234567 -> "1,234,567" */
static const char *commas(uint64_t v, char *buf, size_t cap) {
  char raw[32];
  int n = snprintf(raw, sizeof raw, "%llu", (unsigned long long)v), o = 0;
  for (int i = 0; i < n && (size_t)o + 2 < cap; i++) {
    if (i > 0 && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = raw[i];
  }
  buf[o] = 0;
  return buf;
}

static const char *human(uint64_t b, char *buf, size_t cap) { return st_format_bytes(b, buf, cap); }

/* Resolve --device and --precision as train would on this machine. */
static int resolve_backend(st_plan_options *o, st_plan_input *in) {
  st_run_config *rc = &o->rc;
  int ngpu = 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  ngpu = st_cuda_device_count();
#endif
  if (strcmp(rc->device, "auto") == 0)
    snprintf(rc->device, sizeof rc->device, "%s", ngpu > 0 ? "cuda" : "cpu");
  in->backend = strcmp(rc->device, "cuda") == 0 ? ST_BACKEND_CUDA : ST_BACKEND_CPU;
  if (strcmp(rc->precision, "auto") == 0)
    snprintf(rc->precision, sizeof rc->precision, "%s",
             in->backend == ST_BACKEND_CUDA ? "bf16" : "fp32");
  in->dtype = strcmp(rc->precision, "bf16") == 0   ? ST_BF16
              : strcmp(rc->precision, "fp16") == 0 ? ST_FP16
                                                     : ST_FP32;
  return 0;
}

/* GPU memory to check against: --gpu-mem, else the visible GPU's total. */
static void resolve_gpu_mem(const st_plan_options *o, const st_plan_input *in, uint64_t *mem,
                            char *source, size_t cap) {
  *mem = o->rc.gpu_mem;
  if (*mem) {
    snprintf(source, cap, "--gpu-mem");
    return;
  }
  snprintf(source, cap, "not given");
#ifdef SHARDTRAIN_HAVE_CUDA
  uint64_t f, t;
  char name[160];
  if (in->backend == ST_BACKEND_CUDA && st_cuda_device_count() > 0 &&
      st_plan_device_memory(&f, &t, name, sizeof name) == 0) {
    *mem = t;
    snprintf(source, cap, "%s, total", name);
  }
#else
  (void)in;
#endif
}

/* What the plan's bytes are of: one GPU, or on --device cpu the host memory
 * of one rank (which --gpu-mem caps there too, as in train). */
static const char *per_what(int cuda) { return cuda ? "per GPU" : "per CPU rank"; }
static const char *memory_what(int cuda) { return cuda ? "GPU memory" : "memory per CPU rank"; }

/* What --attention runs, for the table and --json ("attention"). */
static char attn_note[400];

/* cuDNN's forward takes the shape: --attention mixed runs it, and auto runs
 * it with our backward where cuDNN's backward does not fit (train's
 * memory_preflight.c; a GPU whose cuDNN builds no plan runs ours). */
static int cudnn_forward_runs(const st_plan_input *in) {
  return in->backend == ST_BACKEND_CUDA && in->dtype != ST_FP32 &&
         in->model.n_head > 0 && in->model.n_embd % in->model.n_head == 0 &&
         st_attention_cudnn_takes_head(in->model.n_embd / in->model.n_head);
}

/* cuDNN's workspace against the budget (st_plan_attention_groups, the rule
 * train applies in memory_preflight.c): *in and *p were planned without it;
 * they take it (ws per sequence) for the whole micro-batch where it fits
 * beside the rest, else for the largest group of sequences a call that
 * fits. auto goes down to st_attention_cudnn_min_group and else runs ours;
 * --attention cudnn (asked) goes down to one sequence and else keeps the
 * whole workspace, which the caller reports as not fitting. 0, or -1 with
 * st_error. */
static int settle_attention(st_plan_input *in, st_memory_plan *p, uint64_t ws, int asked) {
  const int least = st_plan_attention_least_group(in, asked);
  st_plan_input t = *in;
  t.attn_workspace_per_seq = 0;
  st_memory_plan with;
  int group = 0;
  const int r = st_plan_attention_groups(&t, ws, least, &with, &group);
  if (r < 0) return -1;
  const char *who = asked ? "cudnn: cuDNN's fused attention, as asked;"
                          : "auto: cuDNN's fused attention;";
  char h[32];
  if (r) {
    in->attn_workspace_per_seq = ws;
    in->attn_group = group;
    *p = with;
    human(p->attn_workspace, h, sizeof h);
    if (group)
      snprintf(attn_note, sizeof attn_note, "%s its deterministic backward's O(T^2) workspace "
               "fits beside the rest for %d sequence%s a call (%s), not for the whole "
               "micro-batch", who, group, group == 1 ? "" : "s", h);
    else
      snprintf(attn_note, sizeof attn_note, "%s its deterministic backward's %s O(T^2) "
               "workspace fits beside the rest", who, h);
    return 0;
  }
  human(st_plan_attention_workspace(ws, in->micro_batch, least), h, sizeof h);
  if (asked) {
    /* with is the plan at one sequence a call: the least cuDNN can need, so
     * the shortfall the user has to make room for whatever else changes */
    char over[32], ours[32], ours_over[96] = "which fits";
    human(with.total > with.usable ? with.total - with.usable : 0, over, sizeof over);
    /* ours needs no workspace: the same plan less it */
    const uint64_t ours_total = with.total - with.attn_workspace;
    human(ours_total, ours, sizeof ours);
    if (ours_total > with.usable) {
      char o2[32];
      human(ours_total - with.usable, o2, sizeof o2);
      snprintf(ours_over, sizeof ours_over, "over by %s too: see the change below", o2);
    }
    snprintf(attn_note, sizeof attn_note, "%s its deterministic backward's O(T^2) workspace "
             "does not fit beside the rest even for one sequence a call (%s; over by %s even "
             "then); --attention auto|flash runs ours, O(T): a plan of %s, %s", who, h, over,
             ours, ours_over);
  } else {
    snprintf(attn_note, sizeof attn_note, "auto: %s, O(T); cuDNN's deterministic backward "
             "would need %s of O(T^2) workspace (%d sequence%s a call), which %s",
             cudnn_forward_runs(in) ? "cuDNN's forward and our backward (mixed)" : "ours", h,
             least, least == 1 ? "" : "s",
             in->gpu_mem ? "does not fit beside the rest" : "only a budget (--gpu-mem) can allow");
  }
  return 0;
}

/* What runs when nothing below changes it (settle_attention overwrites
 * it): the CPU's reference, ours for fp32 or --attention flash, mixed as
 * asked or where auto runs it from the start, ours where auto meets a head
 * size cuDNN does not take, cuDNN's one call for the micro-batch for
 * --attention cudnn. */
static void default_note(const st_plan_input *in, st_attention_impl attention, int auto_mixed) {
  if (in->backend != ST_BACKEND_CUDA)
    snprintf(attn_note, sizeof attn_note, "the CPU reference (softmax kept, T x T per head)");
  else if (in->dtype == ST_FP32)
    snprintf(attn_note, sizeof attn_note, "ours, O(T) (fp32 runs ours)");
  else if (attention == ST_ATTENTION_FLASH)
    snprintf(attn_note, sizeof attn_note, "flash: ours, O(T), as asked");
  else if (attention == ST_ATTENTION_MIXED)
    snprintf(attn_note, sizeof attn_note, "mixed: cuDNN's forward and our backward, O(T), as "
             "asked");
  else if (attention == ST_ATTENTION_CUDNN)
    snprintf(attn_note, sizeof attn_note, "cudnn: cuDNN's fused attention, as asked; its "
             "deterministic backward in one call for the micro-batch (O(T^2) workspace)");
  else if (auto_mixed)
    snprintf(attn_note, sizeof attn_note, "auto: cuDNN's forward and our backward (mixed), "
             "O(T): at head size 64 our Hopper backward is faster than cuDNN's deterministic "
             "one and needs no O(T^2) workspace (plan assumes an H100/H200; docs/memory.md)");
  else if (!cudnn_forward_runs(in))
    snprintf(attn_note, sizeof attn_note, "auto: ours, O(T) (cuDNN's fused attention takes "
             "head sizes that are multiples of 8 up to 128)");
}

static void row(const char *label, uint64_t bytes, const char *note) {
  char c[40], h[32];
  printf("  %-28s %17s %11s%s%s\n", label, commas(bytes, c, sizeof c), human(bytes, h, sizeof h),
         note[0] ? "  " : "", note);
}

static void print_table(const st_plan_options *o, const st_plan_input *in,
                        const st_memory_plan *p, int accum, const char *source) {
  const st_model_config *m = &in->model;
  const char *dt = st_dtype_name(in->dtype);
  const int cuda = in->backend == ST_BACKEND_CUDA;
  char note[200], a[40], b[40], c[40];
  printf("model   %s: %d layers, %d heads, width %d, seq-len %d, vocab %d (padded %d)\n",
         o->rc.model_name, m->n_layer, m->n_head, m->n_embd, st_plan_seq_len(in), m->vocab_size,
         m->padded_vocab_size);
  char arch[256];
  if (st_model_describe(m, arch, sizeof arch)[0]) printf("        %s\n", arch);
  printf("        %s parameters; padded to %s for %d rank(s), shard %s\n",
         commas((uint64_t)p->params, a, sizeof a), commas((uint64_t)p->padded_params, b, sizeof b),
         in->world, commas((uint64_t)p->shard, c, sizeof c));
  printf("config  micro-batch %d x grad-accum %d x %d rank(s) = global batch %d; ZeRO %d, "
         "precision %s%s, recompute %s, %s%s\n\n", in->micro_batch, accum, in->world,
         o->rc.global_batch, in->zero_stage, dt,
         st_plan_grads_bf16(in) ? ", gradient shard bf16" : "", st_recompute_name(in->recompute),
         cuda ? "cuda" : "cpu", in->offload ? ", offload optimizer" : "");
  printf("  %-28s %17s %11s  %s\n", per_what(cuda), "bytes", "IEC units", "what it holds");
  if (in->zero_stage == 3) {
    snprintf(note, sizeof note, "ZeRO 3, %s: shard %s + head whole %s + 2 gathered blocks %s", dt,
             human(p->weights_shard, a, sizeof a), human(p->weights_head, b, sizeof b),
             human(p->weights_blocks, c, sizeof c));
  } else if (in->lora.rank > 0 && in->lora.nf4_base) {
    char d[32], e[32], f[32];
    snprintf(note, sizeof note, "QLoRA: frozen base %s (%s parameters): NF4 projections %s + "
             "%s %s + dequantisation scratch %s; adapters %s", human(p->weights_base + p->weights_nf4, a, sizeof a),
             commas((uint64_t)p->base_params, b, sizeof b), human(p->weights_nf4, d, sizeof d),
             dt, human(p->weights_base, e, sizeof e), human(p->nf4_scratch, c, sizeof c),
             human(p->lora_weights, f, sizeof f));
  } else if (in->lora.rank > 0) {
    snprintf(note, sizeof note, "%s: frozen base %s (%s parameters) + adapters %s", dt,
             human(p->weights_base, a, sizeof a), commas((uint64_t)p->base_params, b, sizeof b),
             human(p->lora_weights, c, sizeof c));
  } else {
    snprintf(note, sizeof note, "%s, every parameter (padded)", dt);
  }
  if (in->lora.rank > 0) {
    char spec[256];
    st_lora_format(&in->lora, spec, sizeof spec);
    printf("  LoRA %s: the parameters below are the adapters'; the base has no gradient, "
           "master or Adam state\n", spec);
  }
  row("working weights", p->weights, note);
  if (in->zero_stage >= 2) {
    const char *nb = in->world == 1 ? "1 one-block bucket" : "2 one-block buckets";
    if (p->grads_recv)
      snprintf(note, sizeof note, "ZeRO %d: head %s + %s %s + receive %s", in->zero_stage,
               human(p->grads_head, a, sizeof a), nb, human(p->grads_buckets, b, sizeof b),
               human(p->grads_recv, c, sizeof c));
    else
      snprintf(note, sizeof note, "ZeRO %d: head %s + %s %s (one micro-step a step: reduced "
               "into the shard, no receive buffers)", in->zero_stage,
               human(p->grads_head, a, sizeof a), nb, human(p->grads_buckets, b, sizeof b));
    row("fp32 gradients", p->grads, note);
  } else {
    row("fp32 gradients", p->grads, "the whole padded vector (accumulated in fp32)");
  }
  if (in->zero_stage >= 1) {
    snprintf(note, sizeof note, "reduced gradients of this rank's 1/%d, %s", in->world,
             st_plan_grads_bf16(in) ? "bf16 (--grad-dtype bf16: each rounded once as reduced)"
                                    : "fp32");
    row("gradient shard", p->grad_shard, note);
  }
  const char *part = in->zero_stage == 0 ? "whole (ZeRO 0)" : "this rank's shard";
  if (in->offload) part = "offloaded to host";
  if (st_plan_master_split(in->dtype, in->offload, in->master_fp32)) {
    snprintf(note, sizeof note, "%s: the fp32 master's low halves; its high halves are the "
             "working weights (kernels/master_split.h)", part);
    row("master weights, low halves", p->master, note);
  } else if (in->dtype != ST_FP32 || in->offload) {
    row("fp32 master weights", p->master, part);
  }
  row("Adam m", p->adam_m, part);
  row("Adam v", p->adam_v, part);
  snprintf(note, sizeof note, "recompute %s, micro-batch %d x %d", st_recompute_name(in->recompute),
           in->micro_batch, st_plan_seq_len(in));
  row("activations", p->acts.total, note);
  {
    char each[32];
    human(m->n_layer ? p->acts.blocks / (uint64_t)m->n_layer : 0, each, sizeof each);
    snprintf(note, sizeof note, "what backward needs: %d layers x %s", m->n_layer, each);
  }
  row("  kept per block", p->acts.blocks, note);
  if (in->lora.rank > 0)
    row("  LoRA adapters", p->acts.lora, in->lora.dropout > 0
            ? "A x per adapter per layer, scratch, dropout(x) (masks recomputed, not stored)"
            : "A x per adapter per layer, and their scratch");
  if (in->recompute != ST_RECOMPUTE_NONE)
    row("  recompute's shared block", p->acts.recompute, "rebuilt before each block's backward");
  row("  attention state", p->acts.attention,
      cuda ? "log-sum-exp, fp32 [B, heads, T] per layer (either kernel) + backward's scratch"
           : "CPU: fp32 softmax [B, heads, T, T] per layer + backward's scratch");
  /* the LM head's chunk (rank/model/model.h, st_model_head_rows) */
  const int64_t BT = (int64_t)in->micro_batch * st_plan_seq_len(in);
  const int R = st_model_head_rows(m, in->dtype, BT);
  const double share =
      p->acts.total ? 100.0 * (double)p->acts.logits / (double)p->acts.total : 0.0;
  if (R < BT)
    snprintf(note, sizeof note, "[%d of %lld rows, %d] %s at a time, then its gradient: %.0f%% "
             "of the activations", R, (long long)BT, m->padded_vocab_size, dt, share);
  else
    snprintf(note, sizeof note, "[all %lld rows, %d] %s, then its gradient: %.0f%% of the "
             "activations", (long long)BT, m->padded_vocab_size, dt, share);
  row("  logits", p->acts.logits, note);
  row("  backward scratch", p->acts.grad_scratch, "activation gradients, reused by every layer");
  row("  embeddings, ln_f, losses", p->acts.embed + p->acts.head, "");
  row("token buffers", p->tokens, "inputs and targets, int32");
  if (!cuda && attn_note[0]) printf("  %-28s %s\n", "attention", attn_note);
  if (cuda) {
    row("cuBLASLt workspace", p->cublaslt, "kernels/cuda/matmul.cu");
    if (p->attn_workspace)
      row("cuDNN attention workspace", p->attn_workspace, "cuDNN's deterministic backward (--attention)");
    if (attn_note[0]) printf("  %-28s %s\n", "attention", attn_note);
    row("CUDA scratch", p->scratch, "column-sum partials (cuda_scratch after one step)");
    if (in->world > 1) {
      int ch = in->nccl_channels > 0 ? in->nccl_channels : ST_PLAN_NCCL_CHANNELS;
      uint64_t bs = in->nccl_buffsize > 0 ? (uint64_t)in->nccl_buffsize : ST_PLAN_NCCL_BUFFSIZE;
      const int och = ST_PLAN_NCCL_OVERLAP_FACTOR * in->nccl_overlap_channels;
      char extra[48] = "";
      if (och > 0) snprintf(extra, sizeof extra, " + %d (gradient overlap)", och);
      snprintf(note, sizeof note, "ESTIMATE: %d%s channels x %d peer(s) x (%s + LL + LL128)", ch,
               extra, in->world - 1 < 2 ? in->world - 1 : 2, human(bs, a, sizeof a));
      row("NCCL buffers", p->nccl, note);
    } else {
      row("NCCL buffers", p->nccl, "one rank: no NCCL communicator (its collectives are copies)");
    }
    row("CUDA context", p->context,
        p->context > ST_PLAN_CUDA_CONTEXT
            ? "measured on an H200: the context + an NCCL communicator's own (docs/memory.md)"
            : "measured on an H200 (docs/memory.md)");
  }
  printf("  %-28s %17s %11s\n", "", "-----------------", "-----------");
  row("total", p->total, "");
  if (p->host_ckpt_staging)
    row("host: checkpoint staging", p->host_ckpt_staging,
        "pinned, --ckpt-async on: fp32 weights, Adam m, v of this rank's shard");
  printf("\n");
  if (in->offload) { /* --offload optimizer: rank/optim/offload.h */
    printf("  %-28s %17s %11s  %s\n", "host memory per rank (pinned)", "bytes", "IEC units", "what it holds");
    const char *hp = in->zero_stage == 0 ? "fp32, whole (ZeRO 0)" : "fp32, this rank's shard";
    row("fp32 master weights", p->host_master, hp);
    row("Adam m", p->host_adam_m, hp);
    row("Adam v", p->host_adam_v, hp);
    const int64_t nopt = in->zero_stage == 0 ? p->padded_params : p->shard;
    const int64_t chunk = st_plan_offload_chunk(in) < nopt ? st_plan_offload_chunk(in) : nopt;
    snprintf(note, sizeof note, "2 chunks of %lld fp32 gradients copied in", (long long)chunk);
    row("gradient staging", p->host_grad_staging, note);
    snprintf(note, sizeof note, "2 chunks of %lld %s working weights copied out",
             (long long)chunk, dt);
    row("working-weight staging", p->host_work_staging, note);
    printf("  %-28s %17s %11s\n", "", "-----------------", "-----------");
    row("host total", p->host_total, "train checks it against MemAvailable / ranks per node");
    printf("\n");
  }
  if (p->capped != p->total) { /* the CPU backend: the offloaded state is the rank's own memory */
    row("counted against --gpu-mem", p->capped,
        "total + host total: on the CPU both are this rank's memory");
    printf("\n");
  }
  if (p->fits < 0) {
    if (cuda)
      printf("GPU memory: not checked (give --gpu-mem SIZE; no GPU is visible here to read it "
             "from)\n");
    else
      printf("memory per CPU rank: not checked (give --gpu-mem SIZE, the host memory one rank "
             "may use, as train's --gpu-mem caps it)\n");
    return;
  }
  printf("%s %s (%s) less %g%% headroom = %s usable: ", memory_what(cuda),
         human(in->gpu_mem, a, sizeof a), source, in->headroom_pct, human(p->usable, b, sizeof b));
  if (p->fits) printf("fits, %s to spare\n", human((uint64_t)p->spare, c, sizeof c));
  else printf("DOES NOT FIT, over by %s\n", human((uint64_t)-p->spare, c, sizeof c));
}

/* After DOES NOT FIT: the smallest change that fits, found by the search
 * train's pre-flight makes for the same message (ST_FIT_NEAREST, the ZeRO
 * stage kept if it can be, else the next higher), and the --fit pointer. */
static int print_smallest_change(const st_plan_input *in, int global_batch) {
  st_plan_fit_query q;
  memset(&q, 0, sizeof q);
  q.base = *in;
  q.global_batch = global_batch;
  q.search_zero = 2;
  q.order = ST_FIT_NEAREST;
  st_plan_fit f;
  if (st_memory_plan_fit(&q, &f)) return -1;
  char change[300], h[32];
  if (f.found) {
    st_plan_describe_change(in, &f.choice.in, global_batch, change, sizeof change);
    printf("The smallest change that fits: %s (plan %s).\n", change,
           human(f.choice.plan.capped, h, sizeof h));
  } else {
    printf("Nothing fits on %d rank(s): even micro-batch %d, recompute %s, ZeRO %d needs %s. Use "
           "more --ranks, a shorter --seq-len, a smaller model or %s.\n", in->world,
           f.least.in.micro_batch, st_recompute_name(f.least.in.recompute),
           f.least.in.zero_stage, human(f.least.plan.capped, h, sizeof h),
           in->backend == ST_BACKEND_CUDA ? "a larger GPU" : "a larger --gpu-mem");
    printf("Add --fit to these flags to see what each choice needs (docs/memory.md).\n");
    return 0;
  }
  printf("Add --fit to these flags to choose micro-batch, recompute, ZeRO stage%s by estimated "
         "step time (train --auto-fit applies the same choice; docs/memory.md).\n",
         in->backend == ST_BACKEND_CUDA ? " and offload" : "");
  return 0;
}

static cJSON *plan_json(const st_plan_options *o, const st_plan_input *in,
                        const st_memory_plan *p, int accum, const char *source) {
  cJSON *j = st_memory_plan_cjson(o->rc.model_name, o->rc.global_batch, accum, in, p, source);
  if (j && attn_note[0]) cJSON_AddStringToObject(j, "attention", attn_note);
  /* the same choice for scripts: which kernel, and cuDNN's sequences a
   * backward call (0 with ours) */
  if (j) {
    const int cudnn = in->backend == ST_BACKEND_CUDA && in->attn_workspace_per_seq > 0;
    st_attention_impl att = ST_ATTENTION_AUTO;
    (void)st_attention_parse(o->rc.attention, &att);
    const int mixed = !cudnn && cudnn_forward_runs(in) && att != ST_ATTENTION_FLASH;
    cJSON_AddStringToObject(j, "attention_kernel", in->backend != ST_BACKEND_CUDA ? "cpu"
                                                   : cudnn                        ? "cudnn"
                                                   : mixed                        ? "mixed"
                                                                                  : "ours");
    cJSON_AddNumberToObject(j, "cudnn_seqs_per_call",
                            cudnn ? st_attention_cudnn_group(in->micro_batch, in->attn_group) : 0);
  }
  return j;
}

static void print_json(cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  printf("%s\n", s);
  cJSON_free(s);
  cJSON_Delete(j);
}

static void print_fit(const st_plan_fit_query *q, const st_plan_fit *f, const char *source) {
  char d[240], h1[32], h2[32], why[4096];
  const st_plan_choice *ch = f->found ? &f->choice : &f->least;
  const int cuda = q->base.backend == ST_BACKEND_CUDA;
  printf("fit     global batch %d on %d rank(s): %s (%s) less %g%% = %s usable %s; %d "
         "candidates planned\n", q->global_batch, q->base.world,
         human(q->base.gpu_mem, h1, sizeof h1), source, q->base.headroom_pct,
         human(ch->plan.usable, h2, sizeof h2), per_what(cuda), f->candidates);
  if (!f->found) {
    st_plan_choice_describe(&f->least, d, sizeof d);
    printf("        NOTHING FITS. The least memory any choice needs: %s, over by %s.\n"
           "        Use more ranks (ZeRO 1-3 divide the optimizer state, ZeRO 2 and 3 the "
           "gradients too, ZeRO 3 the weights),\n        a shorter --seq-len, a smaller model "
           "or %s.\n\n",
           d, human((uint64_t)-f->least.plan.spare, h1, sizeof h1),
           cuda ? "a larger GPU" : "a larger --gpu-mem");
    if (q->base.grad_bf16)
      printf("        --grad-dtype bf16 kept the search to one micro-step a step at ZeRO 2/3; "
             "with --grad-dtype fp32 it may accumulate smaller micro-batches.\n\n");
    return;
  }
  st_plan_choice_describe(&f->choice, d, sizeof d);
  printf("choice  %s (%s to spare)\n", d, human((uint64_t)f->choice.plan.spare, h1, sizeof h1));
  st_plan_fit_explain(q, f, "        ", why, sizeof why);
  printf("why\n%s\n\n", why);
}

int st_cmd_plan(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      st_cli_print_plan_usage();
      return 0;
    }
  st_plan_options o;
  if (st_cli_parse_plan(argc, argv, &o)) return st_cli_fail(ST_EXIT_USAGE);
  st_run_config *rc = &o.rc;
  st_plan_input in;
  memset(&in, 0, sizeof in);
  if (st_run_config_check_model(rc) || st_model_validate(&rc->model))
    return st_cli_fail(ST_EXIT_USAGE);
  if (rc->lora_spec[0] &&
      (st_lora_parse(rc->lora_spec, &rc->lora) || st_lora_resolve(&rc->lora, &rc->model)))
    return st_cli_fail(ST_EXIT_USAGE);
  if (st_run_config_base_dtype(rc)) return st_cli_fail(ST_EXIT_USAGE);
  resolve_backend(&o, &in);
  long long nccl_bs; /* what NCCL will read: refused here as in train (exit 2) */
  if (st_nccl_buffsize_env(&nccl_bs)) return st_cli_fail(ST_EXIT_USAGE);
  st_run_plan_input(rc, o.ranks, in.backend, in.dtype, &in);
  if (st_nccl_one_rank_env(&in.nccl_one_rank) || st_master_fp32_env(&in.master_fp32))
    return st_cli_fail(ST_EXIT_USAGE);
  /* without --fit, after the global batch's own check below */
  if (o.fit && st_run_config_check_grad_dtype(rc, o.ranks, o.seen.zero, 0))
    return st_cli_fail(ST_EXIT_USAGE);
  /* train measures cuDNN's workspace at setup; plan uses the formula.
   * --attention auto plans without it and adds it after, where it fits
   * (settle_attention). */
  uint64_t cudnn_ws = 0;
  st_attention_impl att = ST_ATTENTION_AUTO; /* the CLI took only its words */
  (void)st_attention_parse(rc->attention, &att);
  const int wants_cudnn = att == ST_ATTENTION_CUDNN || att == ST_ATTENTION_MIXED;
  if (wants_cudnn && (in.backend != ST_BACKEND_CUDA || in.dtype == ST_FP32)) {
    /* train's refusals (memory_preflight.c, attention.cu), at plan time */
    if (in.backend != ST_BACKEND_CUDA)
      st_error_setc(ST_EXIT_USAGE, "--attention %s needs the CUDA backend (bf16 or fp16); "
                    "the CPU runs its fp32 reference: use --attention auto|flash", rc->attention);
    else
      st_error_setc(ST_EXIT_USAGE, "--attention %s: cuDNN's fused attention runs bf16 and "
                    "fp16 only; use --precision bf16|fp16, or --attention auto|flash with fp32",
                    rc->attention);
    return st_cli_fail(ST_EXIT_USAGE);
  }
  char why[256];
  if (in.backend == ST_BACKEND_CUDA && st_attention_head_refusal(att, rc->model.n_embd,
                                                                 rc->model.n_head, in.dtype, why,
                                                                 sizeof why)) {
    st_error_setc(ST_EXIT_USAGE, "%s", why); /* train's setup refuses it so */
    return st_cli_fail(ST_EXIT_USAGE);
  }
  /* O(T^2): cuDNN's backward, for --attention cudnn and where auto may
   * take it: a head size cuDNN runs, other than where auto runs mixed from
   * the start (st_attention_auto_mixed; plan assumes Hopper, the GPUs it is
   * measured on). mixed plans no workspace for cuDNN's forward (train
   * counts what cuDNN reports for it: 256 bytes measured). */
  const int auto_mixed = att == ST_ATTENTION_AUTO && cudnn_forward_runs(&in) &&
                         st_attention_auto_mixed(rc->model.n_embd / rc->model.n_head, 1);
  if (cudnn_forward_runs(&in) &&
      (att == ST_ATTENTION_CUDNN || (att == ST_ATTENTION_AUTO && !auto_mixed)))
    cudnn_ws = st_plan_cudnn_attention_per_seq(rc->seq_len, &rc->model);
  default_note(&in, att, auto_mixed);
  if (att == ST_ATTENTION_CUDNN) in.attn_workspace_per_seq = cudnn_ws;
  char source[200];
  resolve_gpu_mem(&o, &in, &in.gpu_mem, source, sizeof source);
  const int settle = att == ST_ATTENTION_AUTO && cudnn_ws;

  if (!o.fit) {
    const int G = rc->global_batch, BN = in.micro_batch * in.world;
    if (G % BN != 0) {
      int lo = G / BN * BN, hi = lo + BN;
      char use[64];
      if (lo > 0) snprintf(use, sizeof use, "%d or %d", lo, hi);
      else snprintf(use, sizeof use, "%d", hi);
      st_error_setc(ST_EXIT_USAGE, "--global-batch %d does not divide by --micro-batch %d x %d "
                                   "ranks = %d; use --global-batch %s, or change --micro-batch "
                                   "(or let --fit choose)", G, in.micro_batch, in.world, BN, use);
      return st_cli_fail(ST_EXIT_USAGE);
    }
    if (st_run_config_check_grad_dtype(rc, o.ranks, 1, 1)) return st_cli_fail(ST_EXIT_USAGE);
    st_memory_plan p;
    if (st_memory_plan_make(&in, &p)) return st_cli_fail(st_error_exit_code());
    if (settle && settle_attention(&in, &p, cudnn_ws, 0))
      return st_cli_fail(st_error_exit_code());
    if (in.attn_workspace_per_seq && p.fits == 0 && settle_attention(&in, &p, cudnn_ws, 1))
      return st_cli_fail(st_error_exit_code());
    if (o.json) print_json(plan_json(&o, &in, &p, G / BN, source));
    else print_table(&o, &in, &p, G / BN, source);
    if (p.fits == 0 && !o.json && print_smallest_change(&in, G))
      return st_cli_fail(st_error_exit_code());
    return p.fits == 0 ? ST_EXIT_MEMORY : 0;
  }

  /* The same query train --auto-fit makes from the same flags (memory_fit.h). */
  st_plan_fit_query q;
  st_fit_query_make(&in, rc->global_batch, o.seen.micro_batch ? rc->micro_batch : 0,
                    o.seen.recompute ? in.recompute : ST_RECOMPUTE_NONE, rc->zero_stage,
                    !o.seen.zero, &q);
  st_plan_fit f;
  if (st_memory_plan_fit(&q, &f)) return st_cli_fail(st_error_exit_code());
  st_plan_choice *ch = f.found ? &f.choice : &f.least;
  if (settle && settle_attention(&ch->in, &ch->plan, cudnn_ws, 0))
    return st_cli_fail(st_error_exit_code());
  if (o.json) {
    cJSON *j = plan_json(&o, &ch->in, &ch->plan, ch->accum, source);
    cJSON_AddItemToObject(j, "fit", st_plan_fit_cjson(&q, &f));
    print_json(j);
  } else {
    print_fit(&q, &f, source);
    print_table(&o, &ch->in, &ch->plan, ch->accum, source);
    if (f.found) {
      printf("\ntrain with: --micro-batch %d --global-batch %d --recompute %s --zero %d%s%s\n"
             "(or let train choose the same: --auto-fit%s with these flags)\n",
             ch->in.micro_batch, rc->global_batch, st_recompute_name(ch->in.recompute),
             ch->in.zero_stage, ch->in.offload ? " --offload optimizer" : "",
             st_plan_grads_bf16(&ch->in) ? " --grad-dtype bf16" : "",
             q.search_zero ? "-zero" : "");
    }
  }
  return f.found ? 0 : ST_EXIT_MEMORY;
}

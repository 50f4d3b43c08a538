/* train_setup.c - what a rank does before its first step (see
 * trainer_state.h): choose the backend and bind the GPU, open the data and
 * check the batch arithmetic, make sure the run directory is writable and
 * shared, allocate the model and optimizer state, resume or initialise
 * (resume_setup.c: where the run starts from). */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/model_source.h"
#include "io/checkpoint_dirs.h"
#include "io/tokenizer.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "collectives/collectives_nccl.h"
#include "kernels/ops_cuda.h"
#endif
#include "kernels/profile.h"
#include "rank/train/config_agree.h"
#include "rank/train/data_resume.h"
#include "rank/train/device_select.h"
#include "rank/memory/host_mem.h"
#include "rank/memory/memory_fit.h"
#include "rank/memory/nccl_buffsize.h"
#include "rank/train/run_dir_setup.h"
#include "rank/train/trainer_state.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/fsutil.h"

/* OpenMP's default is one thread per core in every rank: with several
 * ranks per node that oversubscribes the cores several times over. Unless
 * the user chose (OMP_NUM_THREADS), split the node's cores among its ranks.
 * For the CPU backend's ops, and for the host AdamW of --offload optimizer
 * (set by the flag, or chosen by --auto-fit-zero). */
void st_trainer_split_host_threads(trainer *tr, const st_env *e) {
  if (getenv("OMP_NUM_THREADS") || tr->omp_auto) return;
  int per = omp_get_num_procs() / (e && e->local_world > 0 ? e->local_world : 1);
  omp_set_num_threads(per > 0 ? per : 1);
  tr->omp_auto = 1;
}

/* Pick CPU or CUDA, bind this rank's GPU by node-local rank, and check the
 * precision and recompute choices the backend supports. */
static int setup_backend(trainer *tr) {
  st_run_config *rc = tr->rc;
  const st_env *e = tr->env;
  st_device dev;
  if (st_device_select(rc->device, e, &dev)) return -1;
  const int cuda = dev.index >= 0;
  tr->device_index = dev.index;
  snprintf(tr->device_name, sizeof tr->device_name, "%s", dev.name);
  tr->ops = st_ops_cpu();
#ifdef SHARDTRAIN_HAVE_CUDA
  if (cuda) {
    if (strcmp(rc->precision, "auto") == 0) snprintf(rc->precision, sizeof rc->precision, "bf16");
    tr->ops = st_ops_cuda(strcmp(rc->precision, "bf16") == 0   ? ST_BF16
                          : strcmp(rc->precision, "fp16") == 0 ? ST_FP16
                                                                 : ST_FP32);
  }
#endif
  st_error_code(ST_EXIT_USAGE);
  long long nccl_bs; /* every rank, before NCCL's init reads it (exit 2) */
  if (st_nccl_buffsize_env(&nccl_bs) || st_master_fp32_env(&tr->master_fp32)) return -1;
  snprintf(rc->device, sizeof rc->device, "%s", cuda ? "cuda" : "cpu");
  if (getenv("ST_PROFILE_OPS")) { /* diagnostics: docs/benchmarks.md */
    tr->ops = st_ops_profiled(tr->ops);
    tr->profile = 1;
  }
  if (!cuda || rc->offload) st_trainer_split_host_threads(tr, e);
  if (strcmp(rc->precision, "auto") == 0) snprintf(rc->precision, sizeof rc->precision, "fp32");
  if (!cuda && strcmp(rc->precision, "fp32") != 0 && tr->resume_found &&
      !st_run_config_given(rc, "--precision")) {
    /* the checkpoint's precision, from a GPU run: its weights are stored in
     * fp32, so the CPU continues in fp32, and says so */
    size_t n = strlen(tr->resume_note.text);
    snprintf(tr->resume_note.text + n, sizeof tr->resume_note.text - n, "  notice     the "
             "checkpoint trained in %s; the CPU backend runs fp32 (its weights are stored in "
             "fp32, nothing is lost)\n", rc->precision);
    snprintf(rc->precision, sizeof rc->precision, "fp32");
  }
  if (!cuda && strcmp(rc->precision, "fp32") != 0)
    return st_error_set("--precision %s: the CPU backend is the fp32 reference; use --precision "
                        "fp32 (or auto) on the CPU, or run on GPUs for bf16/fp16",
                        rc->precision);
  st_error_code(ST_EXIT_ERROR);
  return 0;
}

/* Collectives on backend memory: MPI on host buffers, NCCL on GPUs. */
static int setup_collectives(trainer *tr) {
  tr->dcomm = tr->comm;
  if (tr->device_index < 0) return 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  int one_rank_nccl;
  if (st_nccl_one_rank_env(&one_rank_nccl)) return -1;
  st_nccl_options o = {.timeout_s = tr->rc->nccl_timeout_s, .cga_cluster_size = tr->rc->nccl_cga,
                       .min_ctas = tr->rc->nccl_min_ctas, .max_ctas = tr->rc->nccl_max_ctas,
                       .buffsize = tr->rc->nccl_buffsize,
                       .overlap_max_ctas = st_run_overlap_ctas(tr->rc),
                       .one_rank_nccl = one_rank_nccl};
  if (st_comm_nccl_init(&tr->nccl, &o)) return -1;
  tr->dcomm = &tr->nccl;
#endif
  return 0;
}

/* The file that says which tokenizer the data is in: the first HDF5 shard
 * (they all agree, io/token_shards.c), else the first shard. */
static const char *tokenizer_file(const st_shard_set *set) {
  for (int i = 0; i < set->n; i++)
    if (set->s[i].hdf5) return set->s[i].path;
  return set->first_path;
}

/* The data's tokenizer against the run's (rank/train/run_config.h): a digest
 * from the checkpoint (or an import) must match the data file's; a fresh
 * run takes the data's. A vocabulary other than the model's is refused
 * too, except byte data under a larger --vocab-size (benchmarks size the
 * model like GPT-2 on byte tokens: every id still has its row). */
static int check_tokenizer(trainer *tr, int file_vocab) {
  st_run_config *rc = tr->rc;
  st_tokens_tokenizer d;
  if (st_tokens_tokenizer_info(tokenizer_file(&tr->train), &d) != 0) return st_error_prefix("--data");
  char from[1200], tokdir[1200];
  if (tr->resume_found || !rc->init_from[0]) {
    snprintf(from, sizeof from, "%s", tr->resume_found ? tr->resume_from : "its import");
    snprintf(tokdir, sizeof tokdir, "%s/tokenizer", rc->out);
  } else {
    snprintf(from, sizeof from, "--init-from %s", rc->init_from);
    /* a run directory keeps its tokenizer in tokenizer/; an HF directory holds the files */
    int n = snprintf(tokdir, sizeof tokdir, "%s/tokenizer", rc->init_from);
    if (n < 0 || n >= (int)sizeof tokdir || !st_path_exists(tokdir))
      snprintf(tokdir, sizeof tokdir, "%s", rc->init_from);
  }
  if (d.known && rc->tokenizer_digest[0] && strcmp(d.digest, rc->tokenizer_digest) != 0)
    return st_error_set("--data %s was tokenized with %s (vocab %d, digest %.12s), but the run "
                        "in %s uses %s (vocab %d, digest %.12s, from %s): its ids mean other "
                        "text. Tokenize the text again with the run's tokenizer (shardtrain prep "
                        "--tokenizer %s ...) or %s",
                        rc->data, d.name, d.vocab_size, d.digest, rc->out, rc->tokenizer_name,
                        rc->tokenizer_vocab, rc->tokenizer_digest, from, tokdir,
                        tr->resume_found || !rc->init_from[0]
                            ? "train it in a new --out"
                            : "start from a model made for the data's tokenizer");
  if (d.known && !rc->tokenizer_digest[0])
    st_run_config_set_tokenizer(rc, d.name, d.digest, d.vocab_size);
  /* Ids of a smaller vocabulary still have their rows: byte data, data
   * under a family preset's real vocabulary (a fresh model of that shape),
   * and the data a resumed run was already trained on. */
  const int smaller = file_vocab < rc->model.vocab_size;
  const int under_larger =
      smaller && (!strcmp(d.name, "bytes") ||
                  (!tr->resume_found && rc->model_set_by[ST_MF_VOCAB] == ST_SET_PRESET) ||
                  (tr->resume_found && rc->tokenizer_vocab == file_vocab));
  if (file_vocab > 0 && file_vocab != rc->model.vocab_size && !under_larger)
    return st_error_set("--data %s holds ids of a %d-token vocabulary (%s), but the model's "
                        "vocabulary is %d%s: the embedding rows would not match the tokens. Use "
                        "data made with the model's tokenizer, or %s", rc->data, file_vocab,
                        d.known ? d.name : "tokenizer unknown", rc->model.vocab_size,
                        tr->resume_found ? " (from the checkpoint)" : " (--vocab-size)",
                        tr->resume_found ? "train it in a new --out" : "drop --vocab-size");
  return 0;
}

/* 1 when every shard of the set is an HDF5 token file (which holds /val). */
static int all_hdf5(const st_shard_set *set) {
  for (int i = 0; i < set->n; i++)
    if (!set->s[i].hdf5) return 0;
  return set->n > 0;
}

/* The train and validation shard sets (io/token_shards.h), --shuffle
 * resolved. */
static int setup_data(trainer *tr) {
  st_run_config *rc = tr->rc;
  int file_vocab = 0;
  const int T = rc->seq_len;
  st_error_code(ST_EXIT_DATA);
  if (!rc->data[0])
    return st_error_setc(ST_EXIT_USAGE, "--data is required%s: a token file from `shardtrain "
                         "prep` (.h5), an llm.c shard (.bin), a directory of them, a quoted "
                         "glob ('dir/train_*.bin') or @LIST (docs/data.md)",
                         tr->resume_found ? " (the checkpoint resumed from records none)"
                                          : " (a resumed run takes its checkpoint's; this one "
                                            "starts fresh)");
  if (st_shards_open(&tr->train, rc->data, "train", T)) return st_error_prefix("--data");
  tr->ntrain = tr->train.total_tokens;
  file_vocab = tr->train.vocab_size;
  /* .bin shards have no /val: validation needs --val-data */
  const char *val_spec = rc->val_data[0] ? rc->val_data : all_hdf5(&tr->train) ? rc->data : NULL;
  if (val_spec) {
    st_error_code(ST_EXIT_DATA);
    if (st_shards_open(&tr->val, val_spec, "val", T))
      return st_error_prefix(rc->val_data[0] ? "--val-data" : "--data");
    tr->nval = tr->val.total_tokens;
    int64_t *nseq = malloc((size_t)tr->val.n * sizeof *nseq);
    if (!nseq) return st_error_set("out of memory for the validation set");
    for (int i = 0; i < tr->val.n; i++) nseq[i] = tr->val.s[i].nseq;
    int bad = st_data_order_init(&tr->val_order, tr->val.n, nseq, 0, 0);
    free(nseq);
    if (bad) return -1;
  }
  tr->shuffle = strcmp(rc->shuffle, "on") == 0 || (strcmp(rc->shuffle, "auto") == 0 &&
                                                  tr->train.n > 1);
  if (!(tr->data_ident = st_shards_identity_json(&tr->train)))
    return st_error_set("out of memory describing the data shards");
  if (rc->model.vocab_size == 0)
    rc->model.vocab_size = file_vocab > 0 ? file_vocab : 50257; /* .bin: GPT-2 BPE */
  else if (file_vocab > rc->model.vocab_size && rc->model_set_by[ST_MF_VOCAB] == ST_SET_PRESET)
    return st_error_set("--model %s has a vocabulary of %d tokens, but --data %s holds ids of a "
                        "%d-token vocabulary: they would have no embedding rows. Use data made "
                        "with the model's tokenizer (or a smaller one), or give --vocab-size %d",
                        rc->model_name, rc->model.vocab_size, rc->data, file_vocab, file_vocab);
  else if (file_vocab > rc->model.vocab_size && rc->init_from[0] && !tr->resume_found)
    return st_error_set("--init-from %s has a vocabulary of %d tokens, but --data %s holds ids "
                        "of a %d-token vocabulary: they would have no embedding rows. Prepare "
                        "the text with the model's own tokenizer (prep --tokenizer)",
                        rc->init_from, rc->model.vocab_size, rc->data, file_vocab);
  else if (file_vocab > rc->model.vocab_size)
    return st_error_set("--vocab-size %d is smaller than the vocabulary of %s (%d); %s",
                        rc->model.vocab_size, rc->data, file_vocab,
                        tr->resume_found ? "the checkpoint's model cannot read it: train it in "
                                           "a new --out"
                                         : "drop the flag or raise it");
  if (check_tokenizer(tr, file_vocab) != 0) return -1;
  st_error_code(ST_EXIT_ERROR);
  return 0;
}

/* On resume, the shard set against the checkpoint's (rank/train/data_resume.h);
 * after the batch check, so data too small for a batch says that first. */
static int setup_data_resume(trainer *tr) {
  if (!tr->resume_found) return 0;
  return st_data_resume_check(tr->resume_from, &tr->train, tr->rc->data_changed_ok,
                              &tr->resume_note);
}

/* --lora against the model it ended on (after a resume's or --init-from's
 * shape): resolved for the family, and the combinations not supported
 * refused (exit 2). */
static int setup_lora_config(trainer *tr) {
  st_run_config *rc = tr->rc;
  memset(&rc->lora, 0, sizeof rc->lora);
  if (!rc->lora_spec[0]) return st_run_config_base_dtype(rc);
  const int U = ST_EXIT_USAGE;
  if (st_lora_parse(rc->lora_spec, &rc->lora) || st_lora_resolve(&rc->lora, &rc->model) ||
      st_run_config_base_dtype(rc))
    return -1;
  /* the spec as resolved for the family, so the checkpoint's config and
   * the messages quoting it name the targets that train (not "targets=") */
  st_lora_format(&rc->lora, rc->lora_spec, (int)sizeof rc->lora_spec);
  if (rc->zero_stage == 3)
    return st_error_setc(U, "--lora with --zero 3: the frozen base is not sharded; use --zero "
                         "0, 1 or 2 (the adapters' state is partitioned at 1 and 2)");
  if (rc->offload)
    return st_error_setc(U, "--lora with --offload optimizer: the adapters' optimizer state is "
                         "small; drop --offload");
  return 0;
}

static int setup_batch(trainer *tr) {
  st_run_config *rc = tr->rc;
  int world = tr->comm->world, B = rc->micro_batch, T = rc->seq_len;
  st_error_code(ST_EXIT_USAGE);
  char use[64];
  if (rc->auto_fit && rc->global_batch % world != 0) {
    int lo = rc->global_batch / world * world, hi = lo + world;
    if (lo > 0) snprintf(use, sizeof use, "%d or %d", lo, hi);
    else snprintf(use, sizeof use, "%d", hi);
    return st_error_set("--global-batch %d does not divide by %d ranks: every rank takes the "
                        "same number of sequences; use --global-batch %s",
                        rc->global_batch, world, use);
  }
  if (!rc->auto_fit && rc->global_batch % (B * world) != 0) {
    int lo = rc->global_batch / (B * world) * (B * world), hi = lo + B * world;
    if (lo > 0) snprintf(use, sizeof use, "%d or %d", lo, hi);
    else snprintf(use, sizeof use, "%d", hi);
    return st_error_set("--global-batch %d does not divide by --micro-batch %d x %d ranks = %d; "
                        "use --global-batch %s, or change --micro-batch",
                        rc->global_batch, B, world, B * world, use);
  }
  tr->accum = rc->auto_fit ? 0 : rc->global_batch / (B * world); /* auto-fit: chosen later */
  tr->step_tokens = (int64_t)rc->global_batch * T;
  if (tr->train.total_seq < rc->global_batch) {
    st_error_code(ST_EXIT_DATA);
    return st_error_set("%s holds %lld training tokens, fewer than one global batch needs "
                        "(%d sequences x %d tokens + 1 = %lld); lower --global-batch or "
                        "--seq-len, or prepare more text", rc->data, (long long)tr->ntrain,
                        rc->global_batch, T, (long long)tr->step_tokens + 1);
  }
  if (tr->val.n && tr->val.total_seq < 1) {
    st_error_code(ST_EXIT_DATA);
    return st_error_set("the validation split of %s holds %lld tokens, fewer than one sequence "
                        "(%d + 1); lower --seq-len or prepare with a larger --val-fraction",
                        tr->val.first_path, (long long)tr->nval, T);
  }
  /* a shape the flags cannot make (--heads 5 --dim 64, --kv-heads 3 of 4
   * heads, --norm-eps under LayerNorm) is a bad flag combination, as plan
   * says too */
  if (st_run_config_check_model(rc) || st_model_validate(&rc->model)) return -1;
  if (setup_lora_config(tr)) return -1;
  if (st_run_config_check_grad_dtype(rc, world, rc->auto_fit != 2, !rc->auto_fit)) return -1;
  st_error_code(ST_EXIT_ERROR);
  return 0;
}

int st_trainer_alloc_state(trainer *tr) {
  st_run_config *rc = tr->rc;
  st_comm *c = tr->comm;
  int B = rc->micro_batch, T = rc->seq_len;
  const st_ops *ops = tr->ops;
  st_recompute rec = st_recompute_parse(rc->recompute);
  /* ZeRO 2 never holds a full gradient vector, not even during setup;
   * ZeRO 3 no whole weight vector either: the partition is made from the
   * table's size first (st_model_num_params counts it as the table does). */
  if (rc->lora.rank > 0) {
    /* the adapters are what trains (rank/model/model.h): the partition, the
     * optimizer and the checkpoints below see only them */
    if (st_model_init_lora(&tr->model, &rc->model, &rc->lora, ops, B, T, c->world, rec,
                           rc->zero_stage == 2))
      return -1;
    rc->lora_trainable = tr->model.tab.total;
    rc->lora_base_params = tr->model.base_tab.total;
  } else if (rc->zero_stage == 3) {
    st_partition_make(st_model_num_params(&rc->model), c->rank, c->world, &tr->part);
    if (st_model_init_sharded(&tr->model, &rc->model, ops, B, T, c->world, rec,
                              (int64_t)c->rank * tr->part.shard, tr->part.shard))
      return -1;
    st_trainer_bind_gather(tr);
  } else if ((rc->zero_stage == 2 ? st_model_init_bucketed : st_model_init)(
                 &tr->model, &rc->model, ops, B, T, c->world, rec)) {
    return -1;
  }
  if (rc->zero_stage == 3 && tr->part.total != tr->model.tab.total)
    return st_error_set("internal: ZeRO 3's shard was sized for %lld parameters, the table has "
                        "%lld", (long long)tr->part.total, (long long)tr->model.tab.total);
  st_partition_make(tr->model.tab.total, c->rank, c->world, &tr->part);
  /* ZeRO 0 keeps the whole optimizer state on every rank. */
  if (rc->zero_stage == 0) st_partition_make(tr->model.tab.total, 0, 1, &tr->opt_part);
  else tr->opt_part = tr->part;
  size_t n = (size_t)(rc->zero_stage == 0 ? tr->model.padded_total : tr->part.shard);
  size_t bt = (size_t)B * T;
  if (rc->offload) { /* the state on the host: rank/optim/offload.h */
    if (st_offload_alloc(&tr->offload, ops, (int64_t)n, st_run_offload_chunk())) return -1;
    tr->master = tr->offload.master;
    tr->adam_m = tr->offload.m;
    tr->adam_v = tr->offload.v;
  } else {
    tr->adam_m = ops->alloc(n * sizeof(float), "adam_m");
    tr->adam_v = ops->alloc(n * sizeof(float), "adam_v");
  }
  /* ZeRO 1 on one rank: the shard is the whole gradient vector, which the
   * model already holds; a copy would cost 4 bytes per parameter for nothing. */
  tr->grad_shard_aliased = rc->zero_stage == 1 && c->world == 1;
  st_plan_input gi; /* the planner's rule for --grad-dtype bf16 */
  memset(&gi, 0, sizeof gi);
  gi.grad_bf16 = st_run_grad_bf16(rc);
  gi.zero_stage = rc->zero_stage;
  gi.accum = tr->accum;
  tr->grad_dtype = st_plan_grads_bf16(&gi) ? ST_BF16 : ST_FP32;
  if (tr->grad_shard_aliased) tr->grad_shard = tr->model.grads;
  else tr->grad_shard = rc->zero_stage >= 1 ? ops->alloc((size_t)tr->part.shard *
                                                             st_dtype_size(tr->grad_dtype),
                                                         "grad_shard")
                                            : NULL;
  /* Mixed precision: fp32 master weights for the range this rank updates;
   * the model holds the bf16/fp16 working copy. fp32 runs update in place.
   * bf16 keeps only the master's rests: its high halves are the working
   * copy (kernels/master_split.h). */
  if (st_plan_master_split(ops->dtype, rc->offload, tr->master_fp32)) {
    if (!ops->adamw_update_segments_split)
      return st_error_set("internal: backend %s has no split-master AdamW", ops->name);
    tr->master_lo = ops->alloc(n * sizeof(int16_t), "master");
    tr->split_hi = malloc((size_t)ST_SPLIT_STAGE * sizeof *tr->split_hi);
    tr->split_lo = malloc((size_t)ST_SPLIT_STAGE * sizeof *tr->split_lo);
    if (!tr->master_lo)
      return st_error_set("cannot allocate %.1f MiB of %s memory for the master weights' rests",
                          n * 2.0 / 1048576.0, ops->name);
    if (!tr->split_hi || !tr->split_lo) return st_error_set("out of host memory");
  } else if (ops->dtype != ST_FP32 && !rc->offload) {
    tr->master = ops->alloc(n * sizeof(float), "master");
    if (!tr->master)
      return st_error_set("cannot allocate %.1f MiB of %s memory for fp32 master weights",
                          n * 4.0 / 1048576.0, ops->name);
  }
  st_loss_scaler_init(&tr->scaler, ops->dtype == ST_FP16, rc->loss_scale_max);
  tr->bucket_counts = calloc((size_t)c->world, sizeof(size_t));
  if (!tr->bucket_counts) return st_error_set("out of host memory");
  if (rc->zero_stage >= 2 &&
      (tr->accum != 1 || (tr->grad_dtype == ST_BF16 && c->world > 1))) {
    /* Only the shard is kept: block gradients live in two buckets (made by
     * st_model_init_bucketed), and each hook slot's reduction lands in its
     * own buffer (this rank's share of the slot's range at most) until it
     * is added to the shard. With one micro-step a step each reduction
     * lands in the shard itself, as at ZeRO 1, and there are none; unless
     * the shard is bf16 on several ranks: NCCL reduces in fp32 into these,
     * then they are rounded into the shard. */
    const st_model *m = &tr->model;
    const int64_t lnf = m->block_begin + m->cfg.n_layer * m->block_numel;
    const int64_t range[ST_COMM_TAG_GATHER] = {m->block_numel, m->block_numel, m->block_begin,
                                               m->tab.total - lnf};
    for (int s = 0; s < ST_COMM_TAG_GATHER; s++) {
      int64_t k = range[s] < tr->part.shard ? range[s] : tr->part.shard;
      tr->recv[s] = ops->alloc((size_t)(k + 1) * sizeof(float), "grads_recv");
      if (!tr->recv[s])
        return st_error_set("cannot allocate ZeRO-2 receive buffers (%lld floats)", (long long)k);
    }
  }
  tr->d_inp = ops->alloc(bt * sizeof(int), "tokens");
  tr->d_tgt = ops->alloc(bt * sizeof(int), "tokens");
  tr->inp = malloc(bt * sizeof(int));
  tr->tgt = malloc(bt * sizeof(int));
  tr->scratch = malloc((bt + 1) * sizeof(int));
  if (!tr->adam_m || !tr->adam_v || (rc->zero_stage >= 1 && !tr->grad_shard) || !tr->inp ||
      !tr->tgt || !tr->scratch || !tr->d_inp || !tr->d_tgt)
    return st_error_set("cannot allocate %s memory for optimizer state (%zu floats) and batches",
                        ops->name, n * 2);
  snprintf(rc->master, sizeof rc->master, "%s",
           tr->master_lo ? "split" : tr->master ? "whole" : "weights");
  tr->config_json = st_run_config_to_json(rc);
  return 0;
}

/* The backend's own buffers, made now at the plan's sizes (ops->reserve),
 * so that nothing is allocated inside the step loop: on CUDA the cuBLASLt
 * workspace and cuda_scratch, which would otherwise appear on the first
 * matmul and the first backward. */
static int setup_reserve(trainer *tr) {
  const st_memory_plan *p = &tr->plan;
  if (tr->ops->reserve((size_t)p->cublaslt, (size_t)p->scratch) == 0) return 0;
  char a[32], b[32];
  char c[32];
  return st_error_set("cannot allocate the %s backend's own buffers at setup (cuBLASLt "
                      "workspace %s, scratch %s, cuDNN attention workspace %s) on %s: the device "
                      "ran out of memory below the plan; lower --micro-batch or raise --headroom "
                      "(docs/memory.md)", tr->ops->name, st_format_bytes(p->cublaslt, a, sizeof a),
                      st_format_bytes(p->scratch, b, sizeof b),
                      st_format_bytes(p->attn_workspace, c, sizeof c), tr->device_name);
}

/* The arena (kernels/arena.h): one raw allocation of the plan's arena
 * bytes, which the backend then carves every planned buffer from.
 * ST_FAULT_ARENA_SHORT=BYTES makes it that much smaller, so that the last
 * buffers do not fit (the overflow test). Out-of-memory errors here and in
 * setup_state carry ST_EXIT_OOM and the report (rank/train/oom.c). */
static int setup_arena(trainer *tr) {
  uint64_t bytes = tr->plan.arena;
  const char *f = getenv("ST_FAULT_ARENA_SHORT");
  if (f) {
    const uint64_t cut = strtoull(f, NULL, 10);
    bytes = cut < bytes ? bytes - cut : 0;
  }
  snprintf(tr->phase, sizeof tr->phase, "setup, before the first step");
  tr->arena_block = tr->ops->alloc((size_t)bytes, "arena");
  char msg[4096];
  if (!tr->arena_block) {
    st_oom_report(tr, tr->phase, "arena", bytes, "the arena's one allocation failed", msg,
                  sizeof msg);
    return st_error_setc(ST_EXIT_OOM, "%s", msg);
  }
  st_arena_init(&tr->arena, tr->arena_block, (size_t)bytes);
  tr->ops->use_arena(&tr->arena);
  st_oom_install(tr);
  return 0;
}

/* Model and optimizer state, then the backend's own buffers, all carved
 * from the arena. A buffer that does not fit is an out-of-memory, named
 * by its category; an arena not exactly full means the plan and the
 * allocating code disagree, which is a bug. */
static int setup_state(trainer *tr) {
  int rc = st_trainer_alloc_state(tr);
  if (!rc) rc = setup_reserve(tr);
  if (!rc) rc = st_trainer_ckpt_setup(tr);
  const st_arena *a = &tr->arena;
  char msg[4096], detail[160];
  if (a->failed) {
    snprintf(detail, sizeof detail, "a buffer of this category did not fit in the arena (%zu "
             "bytes left of %zu)", a->size - a->failed_used, a->size);
    st_oom_report(tr, tr->phase, a->failed_category, a->failed_bytes, detail, msg, sizeof msg);
    return st_error_setc(ST_EXIT_OOM, "%s", msg);
  }
  if (rc) return -1;
  if (tr->offload.on && tr->offload.host_bytes != tr->plan.host_total)
    return st_error_set("internal error: setup allocated %llu bytes of host memory for the "
                        "offloaded optimizer, but the memory plan's host section says %llu; "
                        "rank/memory/memory_plan.c and rank/optim/offload.c must agree; please "
                        "report this", (unsigned long long)tr->offload.host_bytes,
                        (unsigned long long)tr->plan.host_total);
  if (a->used != a->size) {
    char parts[1024] = "";
    size_t n = 0;
    for (int i = 0; i < a->ncat && n < sizeof parts; i++) {
      int known = 0;
      uint64_t want = st_memory_plan_category(&tr->plan, a->cat[i].name, &known);
      n += (size_t)snprintf(parts + n, sizeof parts - n, "%s%s %llu (plan %llu)", i ? ", " : "",
                            a->cat[i].name, (unsigned long long)a->cat[i].bytes,
                            (unsigned long long)want);
    }
    return st_error_set("internal error: setup carved %zu bytes from the arena, but the memory "
                        "plan sized it %zu bytes; by category: %s. rank/memory/memory_plan.c and the "
                        "allocating code must agree (docs/memory.md, \"The arena\"); please "
                        "report this", a->used, a->size, parts);
  }
  return 0;
}

/* The end of setup: the arena is sealed (an allocation from now on is a
 * raw one, which the count below sees), the allocation count the step
 * loop must keep (trainer.c checks it), and on CUDA the device's free
 * memory now. */
static void setup_done(trainer *tr) {
  tr->arena.sealed = 1;
  tr->allocs_setup = tr->ops->allocations(NULL);
#ifdef SHARDTRAIN_HAVE_CUDA
  size_t fr, tot;
  if (tr->have_dev_mem && st_cuda_mem_info(&fr, &tot) == 0) tr->dev_free_after = fr;
  else tr->have_dev_mem = 0;
#endif
}

/* "N bytes" for a file, "missing" when it cannot be read; for a shard
 * spec (pattern, directory, @list), its file count and their bytes. */
static void file_size_field(st_agree_list *l, const char *name, const char *path) {
  struct stat st;
  char **paths = NULL;
  int n = 0;
  if (strcmp(path, "") && (path[0] == '@' || strpbrk(path, "*?[") ||
                           (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))) {
    long long bytes = 0;
    if (st_shards_expand(path, &paths, &n) == 0)
      for (int i = 0; i < n; i++) bytes += stat(paths[i], &st) == 0 ? (long long)st.st_size : -1;
    st_shards_free_paths(paths, n);
    st_agree_add(l, name, ST_EXIT_DATA, "every rank must read the same files (paths on a "
                 "filesystem every node mounts, or identical copies)", "%s: %d files, %lld bytes",
                 path, n, bytes);
  } else if (stat(path, &st) == 0)
    st_agree_add(l, name, ST_EXIT_DATA, "every rank must read the same file (a path on a "
                 "filesystem every node mounts, or identical copies)", "%s: %lld bytes", path,
                 (long long)st.st_size);
  else
    st_agree_add(l, name, ST_EXIT_DATA, "every rank must read the same file (a path on a "
                 "filesystem every node mounts, or identical copies)", "%s: missing", path);
}

/* After the checkpoint's settings are in: every rank holds the same
 * settings (flags that merely repeat a default on one rank can differ in
 * effect on resume), resumes the same checkpoint, and reads data files of
 * the same size. Collective, of fixed size (rank/train/config_agree.h). */
static int setup_agree_resolved(trainer *tr) {
  const st_run_config *rc = tr->rc;
  st_agree_list l;
  memset(&l, 0, sizeof l);
  st_agree_run_config(&l, rc);
  if (tr->resume_found)
    st_agree_add(&l, "the checkpoint to resume", ST_EXIT_CHECKPOINT, "every rank must see the "
                 "same run directory (--out on a filesystem every node mounts)", "%s (step %lld)",
                 tr->resume_from, (long long)tr->resume_meta.step);
  else
    st_agree_add(&l, "the checkpoint to resume", ST_EXIT_CHECKPOINT, "every rank must see the "
                 "same run directory (--out on a filesystem every node mounts)", "none");
  file_size_field(&l, "the --data file", rc->data);
  if (rc->val_data[0]) file_size_field(&l, "the --val-data file", rc->val_data);
  /* how the bf16 master is kept decides how every rank rounds its working
   * weights (kernels/master_split.h): ranks that differ would drift apart */
  const char *mf = getenv("ST_MASTER_FP32");
  st_agree_add(&l, "the environment's ST_MASTER_FP32", ST_EXIT_USAGE,
               "set it alike on every rank (mpirun -x ST_MASTER_FP32, or srun's environment)",
               "%s", mf ? mf : "(unset)");
  return st_agree_check(tr->comm, &l);
}

/* This rank's micro-batch reader, once the batch shape is final (--auto-fit
 * chooses it in the memory pre-flight). */
static int setup_feed(trainer *tr) {
  const st_run_config *rc = tr->rc;
  tr->feed = st_data_feed_open(&tr->train, rc->seed, tr->shuffle, rc->micro_batch, rc->seq_len,
                               tr->comm->rank, tr->comm->world, rc->model.vocab_size);
  return tr->feed ? 0 : -1;
}

/* A fresh run keeps its tokenizer's files in RUN_DIR/tokenizer/ (copied
 * from the data file's /tokenizer), for sample, eval and export. Rank 0,
 * after the run directory is ours; an existing tokenizer/ (an import's) is
 * kept. */
static int setup_tokenizer_files(trainer *tr, int resumed) {
  const st_run_config *rc = tr->rc;
  if (resumed || tr->comm->rank != 0) return 0;
  char dir[1100];
  snprintf(dir, sizeof dir, "%s/tokenizer", rc->out);
  if (st_is_dir(dir)) return 0;
  int n = 0;
  st_error_code(ST_EXIT_ERROR);
  if (st_tokens_extract_tokenizer(tokenizer_file(&tr->train), dir, &n) != 0)
    return st_error_prefix("--out %s: cannot store the tokenizer's files", rc->out);
  return 0;
}

int st_trainer_setup(trainer *tr, int *resumed, char *from, int cap) {
  int code;
  /* The checkpoint's settings first: everything after depends on them. */
  if ((code = st_trainer_agree(tr, st_run_dir_lock_existing(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_trainer_setup_checkpoint(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_agree_resolved(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_backend(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_collectives(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_data(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_batch(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_data_resume(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_trainer_setup_attention(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_trainer_memory_check(tr) != 0))) return code;
  /* Memory before the run directory: an out-of-memory here writes nothing. */
  if ((code = st_trainer_agree(tr, setup_arena(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_state(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_trainer_dump_grads_check(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_run_dir_prepare(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_run_dir_check_writable(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_run_dir_check_shared(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_trainer_setup_resume(tr, resumed, from, cap) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_feed(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, st_run_dir_check_no_overwrite(tr) != 0))) return code;
  if ((code = st_trainer_agree(tr, setup_tokenizer_files(tr, *resumed) != 0))) return code;
  setup_done(tr);
  return 0;
}

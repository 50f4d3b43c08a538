/* run_config.h - everything one training run is configured with: model
 * shape, batch layout, ZeRO stage, optimizer, data and run directory. Filled
 * from flags by launcher/cli.c, stored as JSON in every checkpoint. */
#ifndef ST_RUN_CONFIG_H
#define ST_RUN_CONFIG_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "rank/model/config.h"
#include "rank/model/config_fields.h"
#include "rank/model/lora.h"
#include "rank/memory/memory_plan.h"
#include "rank/optim/optimizer.h"

/* What set a model field on the command line (st_run_config.model_set_by). */
typedef enum {
  ST_SET_NONE = 0, /* a default: on resume the checkpoint's value */
  ST_SET_FLAG,     /* its own flag (--kv-heads) */
  ST_SET_PRESET,   /* --model */
  ST_SET_ARCH      /* --arch (norm, positions, MLP, biases, epsilon, theta) */
} st_set_by;

typedef struct {
  /* the description; block_size = the positions (rows of wpe; RoPE: the
   * most positions, a family preset's own or, with flags, --seq-len) */
  st_model_config model;
  /* st_set_by per field of model (rank/model/config_fields.h ids), filled
   * by launcher/cli.c: a resume takes the fields not set from the
   * checkpoint and refuses set ones that differ, naming the flag. */
  unsigned char model_set_by[ST_MF_COUNT];
  char model_name[64];      /* preset name, "custom", or "imported" (--init-from) */
  /* --seq-len: T, the training sequence length, <= model.block_size. A
   * fresh model has block_size = seq_len; --init-from takes the source's
   * positions (an imported GPT-2 keeps 1024 and may train at 256). */
  int seq_len;
  /* --init-from: the model source (io/model_source.h) the weights and the
   * shape come from, with a fresh optimizer at step 0; "" = none. */
  char init_from[1024];
  /* --lora (rank/model/lora.h): the spec as st_lora_format writes it ("" =
   * full fine-tuning; targets= empty: the family's default), and the
   * config st_trainer_setup resolves from it for the model; the base's
   * identity (st_lora_base_digest of the weights --init-from read), and the
   * parameter counts, for the checkpoint's config (section "lora"). */
  char lora_spec[256];
  st_lora_config lora;
  char lora_base_digest[72];
  /* --base-dtype bf16|nf4: the frozen base's storage. bf16 (the default) is
   * the working dtype (fp32 on the CPU backend); nf4 is QLoRA's 4-bit
   * NormalFloat for the four projection weights of every block (--lora
   * only; resolved into lora.nf4_base). */
  char base_dtype[8];
  int64_t lora_trainable, lora_base_params;
  int micro_batch;          /* sequences per rank per micro-step */
  int global_batch;         /* sequences per optimizer step */
  int zero_stage;           /* 0, 1 or 2 */
  int offload;              /* --offload: 0 none, 1 optimizer (rank/optim/offload.h) */
  /* How the fp32 master weights are kept, set at setup and written to the
   * checkpoint's config: "split" (bf16: the working weights and 16-bit
   * rests, kernels/master_split.h), "whole" (an fp32 copy: fp16, offload,
   * ST_MASTER_FP32=1) or "weights" (fp32: the working weights are the
   * master); "" before setup. */
  char master[8];
  char grad_dtype[8];       /* --grad-dtype fp32 | bf16: bf16 keeps the reduced gradient
                             * shard in bf16 (ZeRO 2/3, one micro-step a step;
                             * st_plan_grads_bf16) */
  char precision[8];        /* fp32 | bf16 | fp16 (auto: bf16 on CUDA, fp32 on CPU) */
  float loss_scale_max;     /* fp16 dynamic loss scale ceiling (2^24) */
  char recompute[16];       /* none on CPU */
  char attention[8];        /* auto | cudnn | flash | mixed (st_attention_parse; CUDA bf16/fp16: the CPU and fp32 run ours) */
  char device[8];           /* cpu | cuda | auto */
  char data[1024];          /* train tokens (.h5 or .bin) */
  char val_data[1024];      /* validation tokens for .bin data ("" = /val of .h5) */
  char shuffle[8];          /* auto | on | off: the epoch order (docs/data.md) */
  int data_changed_ok;      /* --data-changed-ok: resume although the shard set changed */
  char out[1024];           /* run directory */
  char resume[1024];        /* auto | none | PATH */
  char dump_params[1024];   /* write final params as raw float32 (tests) */
  int dump_grads_every;     /* --dump-grads EVERY: 0 = off (io/grad_dump.h) */
  char dump_grads_pattern[512]; /* its PATTERN: comma-separated globs, "" = every tensor */
  /* The tokenizer the model's ids mean (io/tokenizer.h): its name ("bytes",
   * "gpt2-bpe"), hex SHA-256 digest (st_tokenizer_digest) and vocabulary;
   * "" and 0 while unknown (llm.c .bin data). Set by st_run_config_set_tokenizer:
   * at a fresh start from the data file's attributes (rank/train/train_setup.c), on
   * resume from the checkpoint's config (section "tokenizer", resume_config.c),
   * by `ckpt import` from a Hugging Face directory's tokenizer. train refuses
   * data of another digest (exit 4). */
  char tokenizer_name[32];
  char tokenizer_digest[72];
  int tokenizer_vocab;
  /* The bos/eos/pad token ids of the Hugging Face config.json the weights
   * first came from, as compact JSON text ({"bos_token_id":1,...}), "" when
   * none: set by st_run_config_set_special_ids from the source at `ckpt
   * import` and a fresh `train --init-from` (io/model_source.h), from the
   * checkpoint's config on resume; written as the config's "hf_special_ids",
   * which `ckpt export` puts back into its config.json. No flag sets it. */
  char hf_special_ids[512];
  int64_t steps;
  st_optim_config optim;
  uint64_t seed;
  int ckpt_every;           /* steps between checkpoints; 0 = only at the end */
  int ckpt_async;           /* --ckpt-async: 1 (default) background rank-file writes */
  int keep_last;            /* --keep-last: complete checkpoints kept; 0 = all */
  int val_every;            /* steps between validations; 0 = only at the end */
  int val_seqs;             /* validation sequences (all ranks together) */
  int log_every;
  int stop_after;           /* exit after this step (for resume tests); 0 = off */
  int json;                 /* rank 0 prints one JSON summary line at the end */
  int step_timing;          /* split each step into data, compute, communication, optimizer */
  int warmup_capped_from;   /* --warmup asked for more steps than the schedule has (0: no) */
  /* Memory pre-flight (rank/memory/memory_plan.h): the plan must fit gpu_mem (when
   * set; on CUDA also the device's free memory) less headroom_pct percent. */
  uint64_t gpu_mem;         /* --gpu-mem bytes; 0 = unset */
  /* --enforce-gpu-mem: hold the GPU's memory above gpu_mem at setup, so
   * nothing in the process (cuDNN, cuBLASLt, NCCL included) can use more:
   * a smaller GPU emulated on a larger one */
  int enforce_gpu_mem;
  float headroom_pct;       /* --headroom, default 5 */
  /* --auto-fit (1) / --auto-fit-zero (2): choose micro-batch, accumulation,
   * recompute (and with 2 the ZeRO stage) before allocating
   * (rank/memory/memory_fit.h); 0 = train as configured. */
  int auto_fit;
  int micro_batch_given, recompute_given, zero_given; /* flags given: they bound auto-fit */
  /* Monitoring (rank/memory/gpu_monitor.h): sample memory every gpu_stats_every
   * steps (0 = --log-every) into metrics.jsonl; warn on stderr when use
   * passes mem_warn_fraction of the total (0 = never). */
  int gpu_stats_every;
  float mem_warn_fraction;
  /* NCCL (GPU runs): watchdog and communicator config */
  double nccl_timeout_s;    /* init and each collective; 0 = no watchdog */
  long long nccl_buffsize;  /* NCCL_BUFFSIZE unless set in the environment; 0 = NCCL's */
  int nccl_cga, nccl_min_ctas, nccl_max_ctas; /* -1/0 = NCCL's defaults */
  /* CTAs of the communicator that reduces gradient buckets while backward
   * runs; 0 = the main one (docs/benchmarks.md, "Overlap without starving
   * the GEMMs") */
  int nccl_overlap_ctas;
  /* The flags the command line gave, each as " --flag " (launcher/cli.c
   * marks them): on resume, a setting not given comes from the checkpoint
   * (rank/train/resume_config.h), and one given overrides it. */
  char given[1024];
  /* --lr-decay-steps was given, or came from a checkpoint that had it apart
   * from --steps: the cosine horizon does not follow --steps. */
  int lr_decay_fixed;
} st_run_config;

/* The flag a field set on the command line came from, for messages:
 * "--kv-heads", "--model llama-3.2-1b", "--arch qwen2"; NULL when not set.
 * buf holds the text. */
const char *st_run_config_set_by(const st_run_config *rc, st_model_field_id id, char *buf,
                                 size_t cap);

/* The model flags against the description they ended in (after a resume
 * merged the checkpoint's, and before st_model_validate): --norm-eps needs
 * RMSNorm, --rope-theta rotary positions, --seq-len at most the model's
 * positions. 0, or -1 with st_error naming the flag (ST_EXIT_USAGE). */
int st_run_config_check_model(const st_run_config *rc);

/* Defaults: the "small" preset, T=128, micro-batch 8, global batch 16. */
void st_run_config_defaults(st_run_config *rc);

/* Record the run's tokenizer (the fields above); name/digest NULL or ""
 * and vocab 0 clear it. */
void st_run_config_set_tokenizer(st_run_config *rc, const char *name, const char *digest,
                                 int vocab);

/* Record ids (a cJSON object, st_model_source_special_ids) in
 * rc->hf_special_ids; NULL or an empty object clears it. 0, or -1 with
 * st_error (exit 3) naming `from` when the ids' text does not fit the field. */
int st_run_config_set_special_ids(st_run_config *rc, const cJSON *ids, const char *from);

/* 1 when flag ("--lr") was given on the command line (rc->given). */
/* --base-dtype into rc->lora.nf4_base (after rc->lora is parsed): nf4
 * without --lora is refused (exit 2). 0, or -1 with st_error. */
int st_run_config_base_dtype(st_run_config *rc);
int st_run_config_given(const st_run_config *rc, const char *flag);
/* Record flag as given (at most once; a full list drops it, which only
 * loses the flag's override on resume). */
void st_run_config_mark_given(st_run_config *rc, const char *flag);

/* The schedule's derived settings, after --steps is final (the flags, and on
 * resume the checkpoint's config): the cosine horizon is --steps unless
 * lr_decay_fixed, and a warmup longer than the horizon is capped (said in
 * the configuration block through warmup_capped_from). */
void st_run_config_schedule(st_run_config *rc);

/* The run config as a malloc'ed JSON object string (model shape + training);
 * the caller frees it. */
char *st_run_config_to_json(const st_run_config *rc);

/* CTAs of the gradient-overlap communicator this run makes on GPUs: 0 at
 * ZeRO 0 (its gradients are reduced after backward, nothing overlaps),
 * else --nccl-overlap-ctas, at most --nccl-max-ctas when that is set. */
int st_run_overlap_ctas(const st_run_config *rc);

/* The memory plan's input for this run on `world` ranks of backend be with
 * storage dtype dt: shape, batch, ZeRO stage, recompute, the NCCL estimate's
 * inputs and the headroom. NCCL_BUFFSIZE from the environment wins over
 * --nccl-buffsize, as it does for NCCL (collectives_nccl.c). The attention
 * workspace and gpu_mem are left 0 for the caller (train measures the one
 * and reads the device, plan uses formulas and flags). One function for
 * train and plan, so the two cannot plan differently. */
/* Elements per chunk of the offloaded optimizer step: ST_OFFLOAD_CHUNK
 * (tests set it below a tiny model's size, so the pipeline runs several
 * chunks), else 0 (the plan's default, ST_OFFLOAD_CHUNK_ELEMS). */
int64_t st_run_offload_chunk(void);

/* 1 when --grad-dtype bf16 was asked for (it applies where
 * st_plan_grads_bf16 says). */
int st_run_grad_bf16(const st_run_config *rc);
/* --grad-dtype bf16 against the settings the flags fix: ZeRO 2 or 3 and one
 * micro-step a step (--global-batch = --micro-batch x world), where
 * st_plan_grads_bf16 applies; else -1 with a one-line st_error naming the
 * fix (ST_EXIT_USAGE). zero_fixed / batch_fixed: 0 where a search
 * (--auto-fit, --auto-fit-zero, plan --fit) chooses the stage / micro-batch;
 * st_memory_plan_fit then keeps to such candidates. */
int st_run_config_check_grad_dtype(const st_run_config *rc, int world, int zero_fixed,
                                   int batch_fixed);

void st_run_plan_input(const st_run_config *rc, int world, st_backend be, st_dtype dt,
                       st_plan_input *in);

#endif

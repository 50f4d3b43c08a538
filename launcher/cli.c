/* cli.c - flags of `shardtrain train` (see cli.h). Flag names are part of
 * the user interface in DESIGN.md ("Commands"); keep them. */
#include "launcher/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#include "rank/memory/memory_plan.h"
#include "rank/model/config.h"
#include "util/error.h"

static int parse_int(const char *flag, const char *v, long long lo, long long hi, long long *out) {
  *out = 0; /* set on every path: callers' compilers need not prove the error path returns */
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || *end || end == v || x < lo || x > hi) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("%s expects an integer in [%lld, %lld], got '%s'", flag, lo, hi, v);
  }
  *out = x;
  return 0;
}

int st_cli_number_in(const char *flag, const char *v, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  /* NaN fails no comparison, so the range test alone would let it through */
  if (errno || *end || end == v || !isfinite(x) || x < lo || x > hi) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("%s expects a finite number in [%g, %g], got '%s'", flag, lo, hi, v);
  }
  *out = x;
  return 0;
}

static int parse_float(const char *flag, const char *v, double lo, double hi, float *out) {
  double x = 0;
  const int rc = st_cli_number_in(flag, v, lo, hi, &x);
  *out = (float)x;
  return rc;
}

static int copy_str(char *dst, size_t cap, const char *flag, const char *v) {
  if (strlen(v) >= cap) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("%s value is too long (%zu characters, at most %zu)", flag, strlen(v),
                        cap - 1);
  }
  memcpy(dst, v, strlen(v) + 1);
  return 0;
}

static int one_of(const char *flag, const char *v, const char *const *allowed) {
  for (int i = 0; allowed[i]; i++)
    if (strcmp(v, allowed[i]) == 0) return 0;
  char list[256] = "";
  for (int i = 0; allowed[i]; i++) {
    strncat(list, allowed[i], sizeof list - strlen(list) - 2);
    if (allowed[i + 1]) strncat(list, "|", sizeof list - strlen(list) - 1);
  }
  st_error_code(ST_EXIT_USAGE);
  return st_error_set("%s must be one of %s, got '%s'", flag, list, v);
}

/* The model, batch and system flags train and plan share. 1 when f was
 * one of them (and v consumed), 0 when not, -1 on a bad value. */
static int common_flag(const char *f, const char *v, st_run_config *rc, st_cli_seen *seen) {
  static const char *const k_zero[] = {"0", "1", "2", "3", NULL};
  static const char *const k_prec[] = {"auto", "fp32", "bf16", "fp16", NULL};
  static const char *const k_dev[] = {"auto", "cpu", "cuda", NULL};
  long long x;
  if (strcmp(f, "--model") == 0) {
    st_model_config probe;
    memset(&probe, 0, sizeof probe);
    if (st_model_preset(v, &probe)) { st_error_code(ST_EXIT_USAGE); return -1; }
    if (copy_str(rc->model_name, sizeof rc->model_name, f, v)) return -1;
    seen->preset = 1;
    return 1;
  }
  if (strcmp(f, "--layers") == 0 || strcmp(f, "--heads") == 0 || strcmp(f, "--dim") == 0 ||
      strcmp(f, "--kv-heads") == 0) {
    /* st_model_validate's bounds, so a flag is told the same range here as
     * a shape read from a file is there */
    const long long hi = f[2] == 'l'   ? ST_MODEL_MAX_LAYERS
                         : f[2] == 'd' ? ST_MODEL_MAX_WIDTH
                                       : ST_MODEL_MAX_HEADS;
    if (parse_int(f, v, 1, hi, &x)) return -1;
    if (f[2] == 'l') seen->layers = (int)x;
    else if (f[2] == 'h') seen->heads = (int)x;
    else if (f[2] == 'd') seen->dim = (int)x;
    else seen->kv_heads = (int)x;
    seen->shape = 1;
    return 1;
  }
  if (strcmp(f, "--ffn-dim") == 0) {
    if (parse_int(f, v, 1, ST_MODEL_MAX_FFN, &x)) return -1;
    seen->ffn_dim = (int)x;
    seen->shape = 1;
    return 1;
  }
  if (strcmp(f, "--arch") == 0) {
    st_arch a;
    if (st_arch_parse(v, &a)) { st_error_code(ST_EXIT_USAGE); return -1; }
    seen->arch = (int)a;
    seen->shape = 1;
    return 1;
  }
  if (strcmp(f, "--rope-theta") == 0) {
    if (parse_float(f, v, 1.0, 1e12, &seen->rope_theta)) return -1;
    seen->theta_given = seen->shape = 1;
    return 1;
  }
  if (strcmp(f, "--norm-eps") == 0) {
    if (parse_float(f, v, 1e-12, 0.1, &seen->norm_eps)) return -1;
    seen->eps_given = seen->shape = 1;
    return 1;
  }
  if (strcmp(f, "--tied") == 0) {
    static const char *const k_01[] = {"0", "1", NULL};
    if (one_of(f, v, k_01)) return -1;
    seen->tied = atoi(v);
    seen->shape = 1;
    return 1;
  }
  if (strcmp(f, "--zero") == 0) {
    if (one_of(f, v, k_zero)) return -1;
    rc->zero_stage = atoi(v);
    seen->zero = 1;
    return 1;
  }
  if (strcmp(f, "--ckpt-async") == 0) {
    static const char *const k_onoff[] = {"on", "off", NULL};
    if (one_of(f, v, k_onoff)) return -1;
    rc->ckpt_async = strcmp(v, "on") == 0;
    return 1;
  }
  if (strcmp(f, "--offload") == 0) {
    static const char *const k_off[] = {"none", "optimizer", NULL};
    if (one_of(f, v, k_off)) return -1;
    rc->offload = strcmp(v, "optimizer") == 0;
    return 1;
  }
  if (strcmp(f, "--grad-dtype") == 0) {
    static const char *const k_gd[] = {"fp32", "bf16", NULL};
    if (one_of(f, v, k_gd)) return -1;
    return copy_str(rc->grad_dtype, sizeof rc->grad_dtype, f, v) ? -1 : 1;
  }
  if (strcmp(f, "--precision") == 0) {
    if (one_of(f, v, k_prec)) return -1;
    return copy_str(rc->precision, sizeof rc->precision, f, v) ? -1 : 1;
  }
  if (strcmp(f, "--base-dtype") == 0) {
    static const char *const k_bd[] = {"bf16", "nf4", NULL};
    if (one_of(f, v, k_bd)) return -1;
    return copy_str(rc->base_dtype, sizeof rc->base_dtype, f, v) ? -1 : 1;
  }
  if (strcmp(f, "--recompute") == 0) {
    if (one_of(f, v, st_recompute_names)) return -1;
    seen->recompute = 1;
    return copy_str(rc->recompute, sizeof rc->recompute, f, v) ? -1 : 1;
  }
  if (strcmp(f, "--device") == 0) {
    if (one_of(f, v, k_dev)) return -1;
    seen->device = 1;
    return copy_str(rc->device, sizeof rc->device, f, v) ? -1 : 1;
  }
  if (strcmp(f, "--gpu-mem") == 0) return st_plan_parse_size(f, v, &rc->gpu_mem) ? -1 : 1;
  if (strcmp(f, "--attention") == 0) {
    if (one_of(f, v, st_attention_words)) return -1;
    return copy_str(rc->attention, sizeof rc->attention, f, v) ? -1 : 1;
  }
  if (strcmp(f, "--headroom") == 0) {
    float t;
    if (parse_float(f, v, 0.0, 99.0, &t)) return -1;
    rc->headroom_pct = t;
    return 1;
  }
#define INT_FLAG(name, lo, hi, dst)                          \
  if (strcmp(f, name) == 0) {                                \
    if (parse_int(f, v, lo, hi, &x)) return -1;              \
    dst = x;                                                 \
    return 1;                                                \
  }
  INT_FLAG("--seq-len", 1, 1 << 20, seen->seq_len)
  INT_FLAG("--vocab-size", 2, ST_MODEL_MAX_VOCAB, seen->vocab)
  INT_FLAG("--global-batch", 1, 1 << 30, rc->global_batch)
  INT_FLAG("--nccl-buffsize", 0, 1LL << 34, rc->nccl_buffsize)
  INT_FLAG("--nccl-max-ctas", 0, 64, rc->nccl_max_ctas)
  INT_FLAG("--nccl-overlap-ctas", 0, 64, rc->nccl_overlap_ctas)
#undef INT_FLAG
  if (strcmp(f, "--micro-batch") == 0) {
    if (parse_int(f, v, 1, 1 << 20, &x)) return -1;
    rc->micro_batch = (int)x;
    seen->micro_batch = 1;
    return 1;
  }
  return 0;
}

static void seen_init(st_cli_seen *seen) {
  memset(seen, 0, sizeof *seen);
  seen->arch = seen->tied = -1;
}

/* The fields --arch sets besides arch itself (st_model_arch_defaults). */
static const st_model_field_id k_arch_sets[] = {
    ST_MF_NORM, ST_MF_NORM_EPS, ST_MF_POS, ST_MF_ROPE_THETA,
    ST_MF_MLP, ST_MF_QKV_BIAS, ST_MF_PROJ_BIAS, ST_MF_MLP_BIAS};

/* The model flags into rc->model, in the documented order: --model, then
 * --arch, then each single field; model_set_by records which set what. A
 * GPT-2 preset sets everything but the positions and the vocabulary (those
 * stay --seq-len's and the data's); a family preset sets the whole
 * description, its real vocabulary and positions included. */
static void apply_model_flags(st_run_config *rc, const st_cli_seen *s) {
  st_model_config *m = &rc->model;
  if (s->preset) {
    st_model_config p;
    memset(&p, 0, sizeof p);
    st_model_preset(rc->model_name, &p); /* the name was checked when read */
    const int family = p.vocab_size != 0;
    if (!family) {
      p.block_size = m->block_size;
      p.vocab_size = m->vocab_size;
    }
    *m = p;
    for (int i = 0; i < ST_MF_COUNT; i++)
      if (family || (i != ST_MF_POSITIONS && i != ST_MF_VOCAB))
        rc->model_set_by[i] = ST_SET_PRESET;
  }
  if (s->arch >= 0) {
    st_model_arch_defaults(m, (st_arch)s->arch);
    rc->model_set_by[ST_MF_ARCH] = ST_SET_FLAG;
    for (size_t i = 0; i < sizeof k_arch_sets / sizeof k_arch_sets[0]; i++)
      rc->model_set_by[k_arch_sets[i]] = ST_SET_ARCH;
  }
  const struct {
    st_model_field_id id;
    int given;
    double v;
  } single[] = {{ST_MF_LAYERS, s->layers > 0, s->layers},
                {ST_MF_HEADS, s->heads > 0, s->heads},
                {ST_MF_DIM, s->dim > 0, s->dim},
                {ST_MF_KV_HEADS, s->kv_heads > 0, s->kv_heads},
                {ST_MF_FFN, s->ffn_dim > 0, s->ffn_dim},
                {ST_MF_VOCAB, s->vocab > 0, s->vocab},
                {ST_MF_ROPE_THETA, s->theta_given, s->rope_theta},
                {ST_MF_NORM_EPS, s->eps_given, s->norm_eps},
                {ST_MF_TIED, s->tied >= 0, s->tied}};
  for (size_t i = 0; i < sizeof single / sizeof single[0]; i++)
    if (single[i].given) {
      st_model_field_set(m, single[i].id, single[i].v);
      rc->model_set_by[single[i].id] = ST_SET_FLAG;
    }
  /* A fresh model's positions are T, unless a family preset gave its own
   * (st_run_config_check_model then holds T to them). */
  if (s->seq_len > 0) rc->seq_len = s->seq_len;
  if (rc->model_set_by[ST_MF_POSITIONS] != ST_SET_PRESET) m->block_size = rc->seq_len;
  if (s->shape && !s->preset) snprintf(rc->model_name, sizeof rc->model_name, "custom");
}

/* Every flag train takes, then plan's own, for "did you mean". Kept next
 * to the parsers above; a flag missing here only loses its suggestion. */
static const char *const k_flags[] = {
    "--arch", "--attention", "--auto-fit", "--base-dtype", "--auto-fit-zero", "--beta1", "--beta2", "--ckpt-every", "--data", "--data-changed-ok", "--device",
    "--dim", "--dump-grads", "--dump-params", "--enforce-gpu-mem", "--eps", "--ffn-dim", "--global-batch", "--gpu-mem", "--gpu-stats-every",
    "--grad-clip", "--grad-dtype", "--headroom", "--heads", "--init-from", "--json", "--keep-last", "--kv-heads", "--layers", "--log-every", "--lora", "--loss-scale-max",
    "--lr", "--lr-decay-steps", "--mem-warn-fraction", "--micro-batch", "--min-lr-frac", "--model",
    "--nccl-buffsize", "--nccl-cga", "--nccl-max-ctas", "--nccl-min-ctas", "--nccl-overlap-ctas",
    "--nccl-timeout", "--norm-eps", "--offload", "--ckpt-async",
    "--out", "--precision", "--recompute", "--resume", "--rope-theta", "--seed", "--seq-len", "--shuffle", "--step-timing",
    "--steps", "--stop-after", "--tied", "--val-data", "--val-every", "--val-seqs", "--vocab-size",
    "--warmup", "--weight-decay", "--zero", "--help", NULL};
static const char *const k_plan_flags[] = {"--ranks", "--fit", NULL};

/* Edit distance (Levenshtein) of two short strings, capped at 9. */
static int edits(const char *a, const char *b) {
  size_t n = strlen(b);
  if (n > 63 || strlen(a) > 63) return 9;
  int row[64];
  for (size_t j = 0; j <= n; j++) row[j] = (int)j;
  for (size_t i = 1; a[i - 1]; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= n; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[n] > 9 ? 9 : row[n];
}

/* The closest of cands (NULL-terminated) to f within *best edits, or NULL;
 * lowers *best to the pick's distance. */
static const char *closest(const char *f, const char *const *cands, int *best) {
  const char *pick = NULL;
  for (int i = 0; cands[i]; i++) {
    int d = edits(f, cands[i]);
    if (d < *best) *best = d, pick = cands[i];
  }
  return pick;
}

/* Edits allowed for a suggestion: 2, and a quarter of the flag's length, so
 * "--rank" does not turn into "--data". */
static int max_edits(const char *f) {
  return (int)strlen(f) / 4 < 2 ? (int)strlen(f) / 4 + 1 : 3;
}

/* " (did you mean --x?)" for the closest flag, else "". plan: also plan's
 * own flags. */
static const char *did_you_mean(const char *f, int plan, char *buf, size_t cap) {
  int best = max_edits(f);
  const char *pick = closest(f, k_flags, &best);
  const char *p2 = plan ? closest(f, k_plan_flags, &best) : NULL;
  if (p2) pick = p2;
  if (pick) snprintf(buf, cap, " (did you mean %s?)", pick);
  else buf[0] = 0;
  return buf;
}

static int is_one_of(const char *f, const char *const *cands) {
  for (int i = 0; cands[i]; i++)
    if (strcmp(f, cands[i]) == 0) return 1;
  return 0;
}

static int flag_without_value(const char *f, int known, const char *hint, const char *cmd) {
  st_error_code(ST_EXIT_USAGE);
  if (known) return st_error_set("flag %s needs a value (see shardtrain %s --help)", f, cmd);
  return st_error_set("unknown flag '%s'%s for %s (see shardtrain %s --help)", f, hint, cmd, cmd);
}

int st_cli_missing_value(const char *f, const char *const *known, const char *cmd) {
  char hint[64];
  return flag_without_value(f, is_one_of(f, known), st_cli_did_you_mean(f, known, hint, sizeof hint),
                            cmd);
}

/* train's and plan's: plan also knows its own flags. */
static int missing_value(const char *f, int plan) {
  char hint[64];
  return flag_without_value(f, is_one_of(f, k_flags) || (plan && is_one_of(f, k_plan_flags)),
                            did_you_mean(f, plan, hint, sizeof hint), plan ? "plan" : "train");
}

const char *st_cli_did_you_mean(const char *f, const char *const *cands, char *buf, size_t cap) {
  int best = max_edits(f);
  const char *pick = closest(f, cands, &best);
  if (pick) snprintf(buf, cap, " (did you mean %s?)", pick);
  else buf[0] = 0;
  return buf;
}

int st_cli_is_train_flag(const char *f) {
  for (int i = 0; k_flags[i]; i++)
    if (strcmp(f, k_flags[i]) == 0 && strcmp(f, "--help") != 0) return 1;
  return 0;
}

/* --dump-grads EVERY[:PATTERN]: EVERY >= 1 steps; PATTERN comma-separated
 * fnmatch globs of tensor names (io/grad_dump.h). */
static int parse_dump_grads(const char *v, st_run_config *rc) {
  char *end = NULL;
  errno = 0;
  long long every = strtoll(v, &end, 10);
  if (end == v || errno || every < 1 || every > 1000000000LL || (*end && *end != ':')) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("--dump-grads '%s': expected EVERY[:PATTERN], EVERY a whole number of "
                        "steps >= 1 (e.g. --dump-grads 100 or --dump-grads 10:'h.0.*,ln_f.*')", v);
  }
  const char *pat = *end == ':' ? end + 1 : "";
  if (*end == ':' && !pat[0]) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("--dump-grads '%s': empty PATTERN after ':'; drop the ':' to dump every "
                        "tensor", v);
  }
  if (strlen(pat) >= sizeof rc->dump_grads_pattern) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("--dump-grads: PATTERN is longer than %zu characters",
                        sizeof rc->dump_grads_pattern - 1);
  }
  rc->dump_grads_every = (int)every;
  snprintf(rc->dump_grads_pattern, sizeof rc->dump_grads_pattern, "%s", pat);
  return 0;
}

int st_cli_parse_train(int argc, char **argv, st_run_config *rc) {
  int lr_set_total = 0;
  st_cli_seen seen;
  seen_init(&seen);
  long long x;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (strncmp(f, "--", 2) == 0 && st_cli_is_train_flag(f)) st_run_config_mark_given(rc, f);
    if (strcmp(f, "--json") == 0) { rc->json = 1; continue; }
    if (strcmp(f, "--step-timing") == 0) { rc->step_timing = 1; continue; }
    if (strcmp(f, "--data-changed-ok") == 0) { rc->data_changed_ok = 1; continue; }
    if (strcmp(f, "--enforce-gpu-mem") == 0) { rc->enforce_gpu_mem = 1; continue; }
    if (strcmp(f, "--auto-fit") == 0) {
      if (rc->auto_fit < 1) rc->auto_fit = 1;
      continue;
    }
    if (strcmp(f, "--auto-fit-zero") == 0) { rc->auto_fit = 2; continue; }
    if (strncmp(f, "--", 2) != 0) {
      st_error_code(ST_EXIT_USAGE);
      return st_error_set("unexpected argument '%s'; flags start with -- (see shardtrain train --help)", f);
    }
    if (i + 1 >= argc) return missing_value(f, 0);
    const char *v = argv[++i];
#define INT_FLAG(name, lo, hi, dst)                          \
  if (strcmp(f, name) == 0) {                                \
    if (parse_int(f, v, lo, hi, &x)) return -1;              \
    dst = x;                                                 \
    continue;                                                \
  }
#define FLOAT_FLAG(name, lo, hi, dst)                        \
  if (strcmp(f, name) == 0) {                                \
    if (parse_float(f, v, lo, hi, &dst)) return -1;          \
    continue;                                                \
  }
#define STR_FLAG(name, dst)                                  \
  if (strcmp(f, name) == 0) {                                \
    if (copy_str(dst, sizeof dst, f, v)) return -1;          \
    continue;                                                \
  }
    int common = common_flag(f, v, rc, &seen);
    if (common < 0) return -1;
    if (common) continue;
    if (strcmp(f, "--steps") == 0) {
      if (parse_int(f, v, 1, 1000000000LL, &x)) return -1;
      rc->steps = x;
      continue;
    }
    if (strcmp(f, "--lr-decay-steps") == 0) {
      if (parse_int(f, v, 1, 1000000000LL, &x)) return -1;
      rc->optim.total_steps = x;
      lr_set_total = 1;
      continue;
    }
    if (strcmp(f, "--seed") == 0) {
      if (parse_int(f, v, 0, 9223372036854775807LL, &x)) return -1;
      rc->seed = (uint64_t)x;
      continue;
    }
    INT_FLAG("--warmup", 0, 1000000000, rc->optim.warmup_steps)
    INT_FLAG("--ckpt-every", 0, 1000000000, rc->ckpt_every)
    INT_FLAG("--keep-last", 0, 1000000000, rc->keep_last)
    INT_FLAG("--val-every", 0, 1000000000, rc->val_every)
    INT_FLAG("--val-seqs", 0, 1 << 30, rc->val_seqs)
    INT_FLAG("--log-every", 1, 1000000000, rc->log_every)
    INT_FLAG("--stop-after", 0, 1000000000, rc->stop_after)
    INT_FLAG("--nccl-cga", -1, 8, rc->nccl_cga)
    INT_FLAG("--nccl-min-ctas", 0, 64, rc->nccl_min_ctas)
    INT_FLAG("--gpu-stats-every", 0, 1000000000, rc->gpu_stats_every)
    if (strcmp(f, "--mem-warn-fraction") == 0) {
      float t;
      if (parse_float(f, v, 0.0, 1.0, &t)) return -1;
      rc->mem_warn_fraction = t;
      continue;
    }
    if (strcmp(f, "--loss-scale-max") == 0) {
      float t;
      if (parse_float(f, v, 1.0, 3.0e38, &t)) return -1;
      rc->loss_scale_max = t;
      continue;
    }
    if (strcmp(f, "--nccl-timeout") == 0) {
      float t;
      if (parse_float(f, v, 0.0, 1e6, &t)) return -1;
      rc->nccl_timeout_s = t;
      continue;
    }
    FLOAT_FLAG("--lr", 0.0, 10.0, rc->optim.lr)
    FLOAT_FLAG("--min-lr-frac", 0.0, 1.0, rc->optim.min_lr_frac)
    FLOAT_FLAG("--weight-decay", 0.0, 10.0, rc->optim.weight_decay)
    FLOAT_FLAG("--grad-clip", 0.0, 1e9, rc->optim.grad_clip)
    FLOAT_FLAG("--beta1", 0.0, 0.999999, rc->optim.beta1)
    FLOAT_FLAG("--beta2", 0.0, 0.999999999, rc->optim.beta2)
    FLOAT_FLAG("--eps", 0.0, 1.0, rc->optim.eps)
    STR_FLAG("--data", rc->data)
    STR_FLAG("--val-data", rc->val_data)
    if (strcmp(f, "--shuffle") == 0 && strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "off")) {
      st_error_code(ST_EXIT_USAGE);
      return st_error_set("--shuffle %s: use auto (on for several shards, off for one), on or "
                          "off (docs/data.md)", v);
    }
    STR_FLAG("--shuffle", rc->shuffle)
    STR_FLAG("--out", rc->out)
    if (strcmp(f, "--resume") == 0 && !v[0]) {
      st_error_code(ST_EXIT_USAGE);
      return st_error_set("--resume needs a value: auto (the run's latest checkpoint), none (a "
                          "fresh start) or a step directory; got an empty string");
    }
    STR_FLAG("--resume", rc->resume)
    STR_FLAG("--dump-params", rc->dump_params)
    if (strcmp(f, "--dump-grads") == 0) {
      if (parse_dump_grads(v, rc)) return -1;
      continue;
    }
    STR_FLAG("--init-from", rc->init_from)
    if (strcmp(f, "--lora") == 0) { /* kept normalised, so a resume compares like with like */
      st_lora_config l;
      if (st_lora_parse(v, &l)) return -1;
      st_lora_format(&l, rc->lora_spec, (int)sizeof rc->lora_spec);
      continue;
    }
#undef INT_FLAG
#undef FLOAT_FLAG
#undef STR_FLAG
    st_error_code(ST_EXIT_USAGE);
    char hint[64];
    return st_error_set("unknown flag '%s'%s; see shardtrain train --help", f,
                        did_you_mean(f, 0, hint, sizeof hint));
  }
  apply_model_flags(rc, &seen);
  rc->micro_batch_given = seen.micro_batch;
  rc->recompute_given = seen.recompute;
  rc->zero_given = seen.zero;
  if (rc->auto_fit == 2 && seen.zero) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("--auto-fit-zero chooses the ZeRO stage, and --zero %d fixes it: drop "
                        "one (--auto-fit keeps the given or default --zero)", rc->zero_stage);
  }
  rc->lr_decay_fixed = lr_set_total;
  st_run_config_schedule(rc); /* again on resume, once the checkpoint's settings are in */
  /* --data may be left out on resume (the checkpoint's is used); setup
   * refuses a run that has neither (rank/train/train_setup.c) */
  return 0;
}

void st_cli_print_train_usage(void) {
  printf(
      "usage: shardtrain train --data FILE [flags]   (run under mpirun/srun for several ranks)\n"
      "  model   --model NAME (default small): GPT-2 sizes tiny|small|gpt2-124m|gpt2-350m|\n"
      "            gpt2-774m|gpt2-1558m (vocabulary from the data), or the Llama family\n"
      "            llama-3.2-1b|llama-3.2-3b|llama-3.1-8b|qwen2.5-0.5b|qwen2.5-1.5b|\n"
      "            smollm2-135m|smollm2-360m at its real shape, vocabulary and positions\n"
      "            (the data's vocabulary must not be larger)\n"
      "          --layers N --heads N --dim N   --seq-len T (default 128; at most a family\n"
      "            preset's positions)  --vocab-size V\n"
      "          --arch gpt2|llama|qwen2 (gpt2: LayerNorm, learned positions, GELU, biases;\n"
      "            llama: RMSNorm, rotary positions, SwiGLU, no biases; qwen2: llama with\n"
      "            q/k/v biases)  --kv-heads N (divides --heads; default --heads)\n"
      "          --ffn-dim N (MLP width, default 4 x --dim)  --rope-theta X (rotary base;\n"
      "            llama 500000, qwen2 1e6)  --norm-eps X (RMSNorm's; llama 1e-5, qwen2 1e-6)\n"
      "          --tied 0|1 (1: the output head is the token embedding, default; family\n"
      "            presets set their own); --model applies first, then --arch, then the rest\n"
      "          --init-from SRC: shape and weights from a Hugging Face directory, an llm.c\n"
      "            model file or a run/step directory (ckpt import); fresh optimizer, step 0;\n"
      "            --seq-len T (<= its positions; default all of them) is the training length;\n"
      "            a checkpoint already in --out is resumed instead (--resume auto)\n"
      "          --lora RANK[,alpha=A,dropout=P,targets=T1,T2,...]: LoRA on the frozen\n"
      "            --init-from base (alpha 8, dropout 0; targets GPT-2 qkv,o,up,down,\n"
      "            Llama/Qwen2 q,k,v,o,gate,up,down; default qkv / q,v; docs/lora.md);\n"
      "            without --init-from the seeded --model initialisation is the base\n"
      "          --base-dtype bf16|nf4: the LoRA base's storage (bf16: the working dtype;\n"
      "            nf4: QLoRA's 4-bit NormalFloat projection weights, docs/nf4.md)\n"
      "  batch   --micro-batch B (sequences per rank per micro-step, default 8)\n"
      "          --global-batch G (sequences per optimizer step, default 16;\n"
      "            gradient accumulation = G / (B * ranks))\n"
      "  system  --zero 0|1|2|3 (default 1)  --device cpu|cuda|auto  --precision fp32|bf16|fp16|auto\n"
      "          --recompute none|act|selective|full (default none; act: only the MLP\n"
      "            activation is rebuilt, selective: the norms too, full: each block is rerun;\n"
      "            docs/memory.md)  --loss-scale-max S (fp16, default 2^24)\n"
      "          --attention auto|cudnn|mixed|flash (CUDA bf16/fp16; default auto) flash: ours,\n"
      "            O(T) memory, deterministic (warpgroup MMA on Hopper, mma.sync elsewhere);\n"
      "            cudnn: cuDNN's fused attention, deterministic backward with an O(T^2)\n"
      "            workspace, in groups of sequences where the whole micro-batch's does not fit;\n"
      "            mixed: cuDNN's forward (faster than ours) and our O(T) backward; auto: plans\n"
      "            with ours, then takes cuDNN (faster) only where its workspace still fits the\n"
      "            budget, else mixed; the configuration block names the kernels (docs/memory.md)\n"
      "          --offload none|optimizer (default none; optimizer: fp32 master weights, Adam m\n"
      "            and v in pinned host memory, AdamW on the host cores, the device keeps the\n"
      "            working weights, gradients and activations; host memory per rank is checked\n"
      "            against MemAvailable / ranks on the node, exit 6; docs/memory.md, \"Offload\")\n"
      "          --grad-dtype fp32|bf16 (default fp32; bf16: the reduced gradient shard in bf16,\n"
      "            2 bytes a parameter, as autocast leaves weight gradients; needs --zero 2|3 (one\n"
      "            GPU too) and --global-batch = --micro-batch x ranks; docs/precision.md)\n"
      "  memory  --gpu-mem SIZE (cap per rank, e.g. 24GiB; on GPUs the free memory also counts;\n"
      "            on the CPU the check runs only when given)  --headroom PCT (5)\n"
      "          --enforce-gpu-mem (with --gpu-mem: hold the GPU's memory above the cap at\n"
      "            setup, so that nothing in the process can use more; exit 6 when more is\n"
      "            already in use; docs/memory.md, \"The seed scenario\")\n"
      "          the memory plan is checked before anything is allocated: exit 6 when it does\n"
      "          not fit, naming the smallest change that would (see shardtrain plan, docs/memory.md)\n"
      "          --auto-fit: choose --micro-batch (at most the one given), the accumulation and\n"
      "            --recompute (at least the one given) for --global-batch by estimated step\n"
      "            time, as shardtrain plan --fit --zero Z does; --auto-fit-zero: also the ZeRO\n"
      "            stage (as plan --fit without --zero); exit 6 when nothing fits\n"
      "  monitor --gpu-stats-every N (memory, utilisation, temperature into metrics.jsonl every\n"
      "            N steps, after step 1 and at each epoch's end; default and 0: --log-every)\n"
      "          --mem-warn-fraction F (warn once per crossing above F of the total, 0.9; 0 = off)\n"
      "  optim   --lr (1e-3) --warmup (20) --min-lr-frac (0.1) --lr-decay-steps (=steps)\n"
      "          --weight-decay (0.1) --grad-clip (1.0) --beta1 (0.9) --beta2 (0.95) --eps (1e-8)\n"
      "  run     --steps N (100)  --out RUN_DIR (runs/default)  --resume auto|none|PATH\n"
      "          --ckpt-every N (0: only at the end)  --val-every N (0: only at the end)\n"
      "          --ckpt-async on|off (on: a save copies this rank's state to pinned host memory\n"
      "            and a background thread writes it while training goes on; latest moves\n"
      "            once every rank has flushed, as with off; default on; docs/checkpoints.md)\n"
      "          --keep-last N (keep the newest N complete checkpoints and every one holding a\n"
      "            file named keep; 0: keep all, the default)\n"
      "          --val-seqs N (256; 0: none)  --log-every N (1)  --seed S (1337)\n"
      "          --val-data FILE (for .bin data)  --stop-after STEP  --dump-params FILE  --json\n"
      "          --dump-grads EVERY[:PATTERN] (every EVERY-th step's reduced gradients, before and\n"
      "            after clipping, with per-tensor norms, into RUN/grads/step_N/ in the checkpoint\n"
      "            layout; PATTERN: comma-separated globs of tensor names, e.g. 'h.0.*,ln_f.*';\n"
      "            shardtrain grads norms|diff reads them; docs/checkpoints.md)\n"
      "  data    --data FILE|DIR|'PATTERN'|@LIST (one token file or many shards; docs/data.md)\n"
      "          --val-data (the same forms)  --shuffle auto|on|off (auto: on for several\n"
      "            shards)  --data-changed-ok (resume although the shard set changed)\n"
      "          --step-timing (split each step: data, compute, exposed communication, optimizer;\n"
      "            synchronises the device at phase boundaries)\n"
      "  nccl    --nccl-timeout S (600; 0 = no watchdog)  --nccl-buffsize BYTES  --nccl-cga N\n"
      "          --nccl-min-ctas N  --nccl-max-ctas N   (GPU runs; NCCL_* variables you set win)\n"
      "          --nccl-overlap-ctas N (4, 0..64; at most N CTAs reduce gradients during\n"
      "          backward, on a split communicator; 0: no split, all on the main one)\n");
}

int st_cli_parse_plan(int argc, char **argv, st_plan_options *o) {
  memset(o, 0, sizeof *o);
  seen_init(&o->seen);
  st_run_config_defaults(&o->rc);
  snprintf(o->rc.device, sizeof o->rc.device, "cuda");
  o->ranks = 1;
  long long x;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (strcmp(f, "--json") == 0) { o->json = 1; continue; }
    if (strcmp(f, "--fit") == 0) { o->fit = 1; continue; }
    /* shared checks word their fix by what was given (st_run_config_given) */
    if (strncmp(f, "--", 2) == 0 && st_cli_is_train_flag(f)) st_run_config_mark_given(&o->rc, f);
    st_error_code(ST_EXIT_USAGE);
    if (strncmp(f, "--", 2) != 0)
      return st_error_set("unexpected argument '%s'; flags start with -- (see shardtrain plan "
                          "--help)", f);
    if (i + 1 >= argc) return missing_value(f, 1);
    const char *v = argv[++i];
    int common = common_flag(f, v, &o->rc, &o->seen);
    if (common < 0) return -1;
    if (common) continue;
    if (strcmp(f, "--lora") == 0) { /* resolved for the family by st_cmd_plan */
      st_lora_config l;
      if (st_lora_parse(v, &l)) return -1;
      st_lora_format(&l, o->rc.lora_spec, (int)sizeof o->rc.lora_spec);
      continue;
    }
    if (strcmp(f, "--ranks") == 0) {
      if (parse_int(f, v, 1, 1 << 20, &x)) return -1;
      o->ranks = (int)x;
      continue;
    }
    st_error_code(ST_EXIT_USAGE);
    if (is_one_of(f, k_flags))
      return st_error_set("%s is a train flag that plan does not take: plan reads no data and "
                          "writes nothing; it takes train's model, batch and system flags plus "
                          "--ranks, --gpu-mem, --headroom, --fit, --json (shardtrain plan --help)",
                          f);
    char hint[64];
    return st_error_set("unknown flag '%s'%s for plan (plan takes train's model, batch and "
                        "system flags plus --ranks, --gpu-mem, --headroom, --fit, --json; see "
                        "shardtrain plan --help)", f, did_you_mean(f, 1, hint, sizeof hint));
  }
  apply_model_flags(&o->rc, &o->seen);
  if (o->rc.model.vocab_size == 0) o->rc.model.vocab_size = 50257;
  st_error_code(ST_EXIT_ERROR);
  return 0;
}

void st_cli_print_plan_usage(void) {
  printf(
      "usage: shardtrain plan [flags]   (one process; prints the memory per GPU, or per CPU rank\n"
      "                               with --device cpu, of a train config)\n"
      "  model   --model NAME (default small): tiny|small|gpt2-124m|gpt2-350m|gpt2-774m|\n"
      "            gpt2-1558m, or llama-3.2-1b|llama-3.2-3b|llama-3.1-8b|qwen2.5-0.5b|\n"
      "            qwen2.5-1.5b|smollm2-135m|smollm2-360m (their own vocabulary)\n"
      "          --layers N --heads N --dim N   --seq-len T (default 128)\n"
      "          --vocab-size V (default 50257, GPT-2's; byte tokens from prep: 256)\n"
      "          --arch gpt2|llama|qwen2  --kv-heads N  --ffn-dim N  --rope-theta X\n"
      "          --norm-eps X  --tied 0|1   (as in train --help)\n"
      "  batch   --micro-batch B (default 8)  --global-batch G (default 16)\n"
      "  system  --ranks N (world size, default 1)  --zero 0|1|2|3 (default 1)\n"
      "          --precision fp32|bf16|fp16|auto (auto: bf16 on cuda, fp32 on cpu)\n"
      "          --recompute none|act|selective|full (default none)\n"
      "          --device cuda|cpu|auto (default cuda; auto: as train would pick here)\n"
      "          --offload none|optimizer (optimizer: master weights, Adam m and v on the host;\n"
      "          their device rows are 0 and a host section lists them)\n"
      "          --grad-dtype fp32|bf16 (bf16: the gradient shard in bf16; ZeRO 2|3, no accumulation)\n"      "          --attention auto|cudnn|mixed|flash (default auto; as train: auto adds cuDNN's\n"
      "          workspace only where it fits the budget, the attention line says which runs)\n"
      "          --nccl-buffsize BYTES  --nccl-max-ctas N  --nccl-overlap-ctas N\n"
      "          (inputs of the NCCL estimate)\n"
      "  memory  --gpu-mem SIZE (24GiB, 80GB, 81559MiB, ...; default: the visible GPU's\n"
      "          total; on --device cpu nothing is checked without it)\n"
      "          --headroom PCT (percent of the budget kept free, default 5)\n"
      "  --fit   choose for --global-batch the micro-batch (dividing it, at most --micro-batch\n"
      "          when given), recompute (from --recompute when given) and, when --zero is not\n"
      "          given, ZeRO stage with the lowest estimated step time that fits (the same\n"
      "          search as train --auto-fit; docs/memory.md)\n"
      "  --json  one JSON object instead of the table\n"
      "exit: 0 fits (or no GPU memory to check against), 6 does not fit / --fit found nothing,\n"
      "2 bad flag. docs/memory.md explains every line.\n");
}

int st_cli_fail(int code) {
  fflush(stdout); /* keep what was printed before the error in order */
  fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
  return code ? code : ST_EXIT_ERROR;
}

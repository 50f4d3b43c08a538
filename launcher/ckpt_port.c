/* ckpt_port.c - ckpt import / export (see ckpt_port.h). */
#define _GNU_SOURCE
#include "launcher/ckpt_port.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/collectives.h"
#include "io/tokenizer.h"
#include "io/checkpoint.h"
#include "io/hf_arch.h"
#include "io/llmc_model.h"
#include "io/model_source.h"
#include "io/peft_export.h"
#include "launcher/cli.h"
#include "rank/train/run_config.h"
#include "util/error.h"
#include "util/fsutil.h"

/* A communicator of one: what st_ckpt_save needs when no MPI runs. */
static int self_barrier(st_comm *c) { (void)c; return 0; }
static int self_bcast(st_comm *c, void *b, size_t n, int root) {
  (void)c, (void)b, (void)n, (void)root;
  return 0;
}
static int self_imax(st_comm *c, int *b, size_t n) {
  (void)c, (void)b, (void)n;
  return 0;
}

/* SRC, --out and the export options from argv (argv[0] the action). */
typedef struct {
  const char *src, *out, *dtype, *format;
  int merge;               /* --merge: a LoRA run as base + merged adapters */
  const char *lora_format; /* --lora-format peft: a LoRA run's adapters alone; NULL: not given */
  int format_given;        /* --format named: a PEFT export has no other format to take */
} port_args;

static int parse(int argc, char **argv, int export, port_args *a) {
  memset(a, 0, sizeof *a);
  a->dtype = "fp32";
  a->format = "hf";
  const char *usage = export ? "usage: shardtrain ckpt export RUN_DIR|STEP_DIR|MODEL --out PATH "
                               "[--dtype fp32|bf16] [--format hf|llmc] [--merge | --lora-format "
                               "peft] (a LoRA run: one of the last two)"
                             : "usage: shardtrain ckpt import HF_DIR|LLMC_FILE --out RUN_DIR";
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      printf("%s\n", usage);
      return 1;
    }
    if (f[0] != '-' || !f[1]) {
      if (a->src) return st_error_setc(ST_EXIT_USAGE, "one model source only (got %s and %s); %s",
                                       a->src, f, usage);
      a->src = f;
      continue;
    }
    if (export && strcmp(f, "--merge") == 0) {
      a->merge = 1;
      continue;
    }
    const int known = strcmp(f, "--out") == 0 ||
                      (export && (strcmp(f, "--dtype") == 0 || strcmp(f, "--format") == 0 ||
                                  strcmp(f, "--lora-format") == 0));
    if (!known)
      return st_error_setc(ST_EXIT_USAGE, "unknown flag '%s' for ckpt %s; %s", f, argv[0], usage);
    if (i + 1 >= argc) return st_error_setc(ST_EXIT_USAGE, "flag %s needs a value; %s", f, usage);
    const char *v = argv[++i];
    if (strcmp(f, "--out") == 0) a->out = v;
    else if (strcmp(f, "--dtype") == 0) a->dtype = v;
    else if (strcmp(f, "--lora-format") == 0) a->lora_format = v;
    else a->format = v, a->format_given = 1;
  }
  if (!a->src || !a->out || !a->out[0]) return st_error_setc(ST_EXIT_USAGE, "%s", usage);
  if (strcmp(a->dtype, "fp32") && strcmp(a->dtype, "bf16"))
    return st_error_setc(ST_EXIT_USAGE, "--dtype %s: use fp32 or bf16", a->dtype);
  if (strcmp(a->format, "hf") && strcmp(a->format, "llmc"))
    return st_error_setc(ST_EXIT_USAGE, "--format %s: use hf or llmc", a->format);
  if (a->lora_format && strcmp(a->lora_format, "peft"))
    return st_error_setc(ST_EXIT_USAGE, "--lora-format %s: use peft (a Hugging Face PEFT adapter "
                         "directory)", a->lora_format);
  if (a->lora_format && a->format_given && strcmp(a->format, "hf") != 0)
    return st_error_setc(ST_EXIT_USAGE, "--format %s and --lora-format peft: a PEFT adapter "
                         "directory is Hugging Face's format; drop --format %s", a->format,
                         a->format);
  if (a->lora_format && a->merge)
    return st_error_setc(ST_EXIT_USAGE, "--merge and --lora-format peft: give one (--merge: the "
                         "base with the adapters merged; --lora-format peft: the adapters alone)");
  return 0;
}

/* Open src and read its weights: *tab built, *params malloc'ed. */
static int load_source(const char *src, st_model_source *s, st_param_table *tab,
                       float **params) {
  *params = NULL;
  if (st_model_source_open(src, s) || st_param_table_build(&s->cfg, tab)) return -1;
  *params = malloc((size_t)tab->total * sizeof **params);
  if (!*params) return st_error_set("out of host memory for %lld parameters", (long long)tab->total);
  return st_model_source_read(s, tab, *params);
}

/* The checkpoint's config: a default run config with the source's shape,
 * and where it came from. NULL with st_error on failure. */
static char *import_config(const st_model_source *s, const char *src) {
  st_run_config rc;
  st_run_config_defaults(&rc);
  rc.model = s->cfg;
  rc.seq_len = s->cfg.block_size;
  snprintf(rc.model_name, sizeof rc.model_name, "imported");
  rc.zero_stage = 0;
  /* the source's tokenizer is the run's (rank/train/run_config.h), when we read it */
  st_tokenizer *tok = s->tokenizer_dir[0] ? st_tokenizer_load(s->tokenizer_dir) : NULL;
  if (tok)
    st_run_config_set_tokenizer(&rc, st_tokenizer_name(tok), st_tokenizer_digest(tok),
                                st_tokenizer_vocab_size(tok));
  st_tokenizer_free(tok);
  /* bos/eos/pad ids of the source's config.json: its export (and that of a
   * run trained from it) writes them back */
  cJSON *ids = st_model_source_special_ids(s);
  const int bad = st_run_config_set_special_ids(&rc, ids, src);
  cJSON_Delete(ids);
  if (bad) return NULL;
  char *js = st_run_config_to_json(&rc);
  cJSON *o = js ? cJSON_Parse(js) : NULL;
  free(js);
  if (!o) {
    st_error_setc(ST_EXIT_ERROR, "out of host memory importing %s", src);
    return NULL;
  }
  cJSON *imp = cJSON_AddObjectToObject(o, "imported_from");
  cJSON_AddStringToObject(imp, "source", src);
  cJSON_AddStringToObject(imp, "kind", s->kind == ST_MODEL_SRC_HF     ? "huggingface"
                                       : s->kind == ST_MODEL_SRC_LLMC ? "llmc"
                                                                      : "shardtrain");
  cJSON_AddStringToObject(imp, "dtype", s->dtype);
  char *out = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!out) st_error_setc(ST_EXIT_ERROR, "out of host memory importing %s", src);
  return out;
}

int st_cmd_ckpt_import(int argc, char **argv) {
  port_args a;
  int p = parse(argc, argv, 0, &a);
  if (p) return p > 0 ? 0 : st_cli_fail(st_error_exit_code());
  char latest[1300], step[1200];
  snprintf(latest, sizeof latest, "%s/ckpt/latest", a.out);
  int found = 0;
  if (st_path_exists(latest) || (st_ckpt_resolve(a.out, "auto", step, sizeof step, &found) == 0 &&
                                 found)) {
    st_error_setc(ST_EXIT_CHECKPOINT, "%s already holds checkpoints; ckpt import writes a new "
                  "run directory and never overwrites one: give another --out", a.out);
    return st_cli_fail(ST_EXIT_CHECKPOINT);
  }
  st_model_source s;
  st_param_table tab;
  memset(&tab, 0, sizeof tab);
  float *params = NULL, *zeros = NULL;
  char *cfg_json = NULL;
  int code = 0;
  if (load_source(a.src, &s, &tab, &params)) {
    code = ST_EXIT_CHECKPOINT;
    goto out;
  }
  zeros = calloc((size_t)tab.total, sizeof *zeros);
  if (!zeros) {
    st_error_set("out of host memory importing %s", a.src);
    code = ST_EXIT_ERROR;
    goto out;
  }
  cfg_json = import_config(&s, a.src);
  if (!cfg_json) {
    code = st_error_exit_code();
    goto out;
  }
  st_comm comm;
  memset(&comm, 0, sizeof comm);
  comm.world = 1;
  comm.backend = "self";
  comm.barrier = self_barrier;
  comm.broadcast = self_bcast;
  comm.all_reduce_int_max = self_imax;
  st_partition part;
  st_partition_make(tab.total, 0, 1, &part);
  st_ckpt_meta meta;
  memset(&meta, 0, sizeof meta);
  meta.world_size = 1;
  snprintf(meta.config_json, sizeof meta.config_json, "%s", cfg_json);
  if (st_mkdir_p(a.out) ||
      st_ckpt_save(a.out, &comm, &tab, &part, params, zeros, zeros, &meta)) {
    code = ST_EXIT_CHECKPOINT;
    goto out;
  }
  int ntok = 0;
  if (s.tokenizer_dir[0]) {
    char to[1300];
    snprintf(to, sizeof to, "%s/tokenizer", a.out);
    ntok = st_hf_copy_tokenizer(s.tokenizer_dir, to);
    if (ntok < 0) {
      code = ST_EXIT_ERROR;
      goto out;
    }
  }
  printf("ckpt import: %s (%s, %s) -> %s/ckpt/step_00000000: %s, %d layers, %d heads (%d KV), "
         "width %d, %d positions, vocab %d (padded %d), %lld parameters; tokenizer: %s\n",
         a.src, s.kind == ST_MODEL_SRC_HF ? "Hugging Face" : s.kind == ST_MODEL_SRC_LLMC ? "llm.c"
                                                                                      : "shardtrain",
         s.dtype, a.out, st_arch_name(s.cfg.arch), s.cfg.n_layer, s.cfg.n_head, s.cfg.n_kv_head,
         s.cfg.n_embd, s.cfg.block_size,
         s.cfg.vocab_size, s.cfg.padded_vocab_size, (long long)tab.total,
         ntok ? "copied to tokenizer/" : "none in the source");
out:
  free(cfg_json);
  free(zeros);
  free(params);
  st_param_table_free(&tab);
  return code ? st_cli_fail(code) : 0;
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s: %s", path, strerror(errno));
  int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  ok = fclose(f) == 0 && ok;
  return ok ? 0 : st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s", path);
}

static int export_hf(const port_args *a, const st_model_source *s, const st_param_table *tab,
                     const float *params, st_dtype dt) {
  /* model_type is the architecture's name (gpt2, llama, qwen2) */
  const st_hf_arch *arch = st_hf_arch_find(st_arch_name(s->cfg.arch));
  if (!arch)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: no Hugging Face export for architecture %s",
                         s->path, st_arch_name(s->cfg.arch));
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", a->out);
  if (!mkdtemp(tmp)) /* the temporary name is ours: name the user's --out */
    return st_error_setc(ST_EXIT_ERROR, "--out %s cannot be created (%s): its parent folder "
                         "must exist and be writable; create it (mkdir -p) or give another "
                         "--out", a->out, strerror(errno));
  chmod(tmp, 0755); /* mkdtemp's 0700 is for the temporary name only */
  char p[1400];
  char *cfg = arch->config_json(&s->cfg, dt);
  cJSON *ids = st_model_source_special_ids(s); /* an import's, a run's, an HF directory's */
  char *with_ids = cfg ? st_hf_config_with_ids(cfg, ids) : NULL;
  cJSON_Delete(ids);
  if (with_ids != cfg) {
    free(cfg);
    cfg = with_ids;
  }
  snprintf(p, sizeof p, "%s/config.json", tmp);
  int rc = cfg ? write_text(p, cfg) : st_error_set("out of host memory");
  free(cfg);
  snprintf(p, sizeof p, "%s/model.safetensors", tmp);
  if (!rc) rc = arch->write(p, &s->cfg, tab, params, dt);
  if (!rc && s->tokenizer_dir[0] && st_hf_copy_tokenizer(s->tokenizer_dir, tmp) < 0) rc = -1;
  if (!rc && st_path_exists(a->out))
    rc = st_error_setc(ST_EXIT_CHECKPOINT, "%s appeared while exporting; not overwritten",
                       a->out);
  if (!rc && rename(tmp, a->out) != 0)
    rc = st_error_setc(ST_EXIT_CHECKPOINT, "cannot rename %s to %s: %s", tmp, a->out,
                       strerror(errno));
  if (rc) st_rm_rf(tmp);
  return rc;
}

/* base_model_name_or_path for the run whose base is `base` (the checkpoint's
 * recorded --init-from): a name from_pretrained loads, as
 * AutoPeftModelForCausalLM does. A Hugging Face directory is one; a
 * `ckpt import` of one (a run folder) is not, but its config records the
 * directory it was imported from (imported_from.source, the same weights).
 * Anything else (no --init-from, an llm.c file, a trained run) has no such
 * name: "" (null, as PEFT allows). */
static void peft_base_name(const char *base, char *out, size_t cap) {
  out[0] = 0;
  st_model_source b;
  if (!base[0] || st_model_source_open(base, &b)) return;
  if (b.kind == ST_MODEL_SRC_HF) {
    snprintf(out, cap, "%s", base);
    return;
  }
  if (b.kind != ST_MODEL_SRC_CKPT) return;
  cJSON *j = cJSON_Parse(b.config_json);
  const cJSON *imp = cJSON_GetObjectItemCaseSensitive(j, "imported_from");
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(imp, "kind");
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(imp, "source");
  if (cJSON_IsString(kind) && strcmp(kind->valuestring, "huggingface") == 0 &&
      cJSON_IsString(src))
    snprintf(out, cap, "%s", src->valuestring);
  cJSON_Delete(j);
}

/* --lora-format peft: the adapters of LoRA checkpoint s as a PEFT adapter
 * directory (io/peft_export.h), in --dtype; base_model_name_or_path from
 * peft_base_name (hf_base). */
static int export_peft(const port_args *a, const st_model_source *s, const st_lora_config *lora,
                       const char *hf_base) {
  st_lora_table lt;
  float *ad;
  if (st_model_source_read_adapters(s, lora, &lt, &ad)) return -1;
  st_peft_adapter *pa = calloc((size_t)(lt.n > 0 ? lt.n : 1), sizeof *pa);
  int rc = -1;
  if (!pa) {
    st_error_set("out of host memory for %d adapters", lt.n);
  } else {
    for (int i = 0; i < lt.n; i++) {
      const st_lora_slot *sl = &lt.slot[i];
      pa[i].layer = sl->layer;
      snprintf(pa[i].module, sizeof pa[i].module, "%s", st_lora_peft_module(&s->cfg, sl->target));
      pa[i].in = sl->in;
      pa[i].out = sl->out;
      pa[i].A = ad + sl->a_off;
      pa[i].B = ad + sl->b_off;
    }
    const st_peft_config pc = {s->cfg.arch, lora->rank, lora->alpha, lora->dropout,
                               strcmp(a->dtype, "bf16") == 0 ? ST_BF16 : ST_FP32, hf_base};
    rc = st_peft_export(a->out, &pc, pa, lt.n);
  }
  free(pa);
  free(ad);
  st_lora_table_free(&lt);
  return rc;
}

/* A LoRA checkpoint exports as base + merged adapters (--merge) or as its
 * adapters (--lora-format peft): one must be asked for; neither applies
 * to another model. 1: LoRA (*lora, base filled), 0: not, -1: refused. */
static int export_lora_mode(const port_args *a, st_lora_config *lora, char *base, size_t cap) {
  st_model_source s;
  char digest[72];
  if (st_model_source_open(a->src, &s)) return -1;
  const int is = st_model_source_lora(&s, lora, base, cap, digest);
  if (is < 0) return -1;
  if (is && !a->merge && !a->lora_format)
    return st_error_setc(ST_EXIT_USAGE, "%s is a LoRA run: give --merge (its base with the "
                         "adapters merged, a plain model) or --lora-format peft (the adapters "
                         "alone, a PEFT directory)", s.path);
  if (!is && (a->merge || a->lora_format))
    return st_error_setc(ST_EXIT_USAGE, "%s is not a LoRA run: drop %s", s.path,
                         a->merge ? "--merge" : "--lora-format");
  return is;
}

/* The folder --out goes in must exist and take writes: checked before the
 * source is read, and as the user's path (every format writes a temporary
 * name beside --out first). An unwritable --out is exit 1 (README, "Exit
 * codes"); 0 or -1 with st_error. */
static int check_out_parent(const char *out) {
  char parent[1200];
  snprintf(parent, sizeof parent, "%s", out);
  for (size_t l = strlen(parent); l > 1 && parent[l - 1] == '/'; l--) parent[l - 1] = 0;
  char *slash = strrchr(parent, '/');
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) parent[1] = 0; /* "/x": the root */
  else *slash = 0;
  struct stat st;
  const int found = stat(parent, &st) == 0;
  if (!found && (errno == ENOENT || errno == ENOTDIR))
    return st_error_setc(ST_EXIT_ERROR, "--out %s: its parent folder %s does not exist; create "
                         "it first (mkdir -p %s) or give an --out in an existing folder", out,
                         parent, parent);
  if (found && !S_ISDIR(st.st_mode))
    return st_error_setc(ST_EXIT_ERROR, "--out %s: %s is a file, not a folder; give an --out "
                         "in a folder", out, parent);
  if (access(parent, W_OK | X_OK) != 0)
    return st_error_setc(ST_EXIT_ERROR, "--out %s: cannot write into its parent folder %s "
                         "(%s); give an --out in a folder you can write to", out, parent,
                         strerror(errno));
  return 0;
}

int st_cmd_ckpt_export(int argc, char **argv) {
  port_args a;
  int p = parse(argc, argv, 1, &a);
  if (p) return p > 0 ? 0 : st_cli_fail(st_error_exit_code());
  if (st_path_exists(a.out)) {
    st_error_setc(ST_EXIT_CHECKPOINT, "--out %s already exists; ckpt export never overwrites: "
                  "give a new path", a.out);
    return st_cli_fail(ST_EXIT_CHECKPOINT);
  }
  if (check_out_parent(a.out)) return st_cli_fail(ST_EXIT_ERROR);
  st_lora_config lora;
  char base[1200];
  const int is_lora = export_lora_mode(&a, &lora, base, sizeof base);
  if (is_lora < 0) return st_cli_fail(st_error_exit_code());
  if (is_lora && a.lora_format) {
    st_model_source ls;
    char hf_base[1200];
    peft_base_name(base, hf_base, sizeof hf_base);
    if (st_model_source_open(a.src, &ls) || export_peft(&a, &ls, &lora, hf_base))
      return st_cli_fail(st_error_exit_code() == ST_EXIT_ERROR ? ST_EXIT_CHECKPOINT
                                                                 : st_error_exit_code());
    char why[1400];
    if (hf_base[0]) snprintf(why, sizeof why, "%s", hf_base);
    else if (!base[0]) snprintf(why, sizeof why, "null: the base is the run's seeded "
                                "initialisation");
    else snprintf(why, sizeof why, "null: the base, %s, is not a Hugging Face directory or an "
                  "import of one", base);
    /* under QLoRA the named base is the unquantised one: the adapters
     * belong on its NF4 rounding, which PEFT does not infer */
    printf("ckpt export: %s -> %s (PEFT LoRA adapters r=%d, alpha %g, %s; "
           "base_model_name_or_path %s)%s\n", ls.path, a.out, lora.rank, (double)lora.alpha,
           a.dtype, why,
           lora.nf4_base ? "; QLoRA: they trained on the base quantised to NF4 (--base-dtype "
                           "nf4): load them onto the NF4-quantised base, not its unquantised "
                           "weights (docs/lora.md)"
                         : "");
    return 0;
  }
  st_model_source s;
  st_param_table tab;
  memset(&tab, 0, sizeof tab);
  float *params = NULL;
  const st_dtype dt = strcmp(a.dtype, "bf16") == 0 ? ST_BF16 : ST_FP32;
  int rc = load_source(a.src, &s, &tab, &params);
  if (!rc && strcmp(a.format, "llmc") == 0 && s.cfg.arch != ST_ARCH_GPT2)
    rc = st_error_setc(ST_EXIT_CHECKPOINT, "%s is a %s model: --format llmc writes GPT-2 only "
                       "(llm.c's model file has no fields for RMSNorm, RoPE, SwiGLU or KV "
                       "heads); use --format hf", s.path, st_arch_name(s.cfg.arch));
  else if (!rc && strcmp(a.format, "llmc") == 0)
    rc = st_llmc_write(a.out, &s.cfg, &tab, params, dt);
  else if (!rc) rc = export_hf(&a, &s, &tab, params, dt);
  if (!rc)
    printf("ckpt export: %s -> %s (%s, %s%s)\n", s.path, a.out,
           strcmp(a.format, "llmc") == 0                ? "llm.c model file"
           : s.cfg.arch == ST_ARCH_LLAMA ? "Hugging Face LlamaForCausalLM"
           : s.cfg.arch == ST_ARCH_QWEN2 ? "Hugging Face Qwen2ForCausalLM"
                                         : "Hugging Face GPT-2",
           a.dtype,
           strcmp(a.format, "hf") == 0 && s.tokenizer_dir[0] ? ", tokenizer files" : "");
  free(params);
  st_param_table_free(&tab);
  return rc ? st_cli_fail(st_error_exit_code() == ST_EXIT_ERROR ? ST_EXIT_CHECKPOINT
                                                                  : st_error_exit_code())
            : 0;
}

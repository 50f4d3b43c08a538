/* lora.c - the --lora spec, the adapter table and its flat layout, the
 * adapters' initialisation and their merge into the base (rank/model/lora.h). */
#include "rank/model/lora.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "util/error.h"

static const char *const k_names[ST_LORA_NTARGETS] = {"qkv", "q", "k", "v", "o", "gate", "up", "down"};

const char *st_lora_target_name(st_lora_target t) {
  return (unsigned)t < ST_LORA_NTARGETS ? k_names[t] : "?";
}

int st_lora_target_parse(const char *name) {
  for (int t = 0; t < ST_LORA_NTARGETS; t++)
    if (strcmp(name, k_names[t]) == 0) return t;
  return -1;
}

static int is_gpt2(const st_model_config *c) { return c->arch == ST_ARCH_GPT2; }

const char *st_lora_peft_module(const st_model_config *cfg, st_lora_target t) {
  static const char *const gpt2[ST_LORA_NTARGETS] = {"attn.c_attn", NULL, NULL, NULL,
                                                     "attn.c_proj", NULL, "mlp.c_fc",
                                                     "mlp.c_proj"};
  static const char *const llama[ST_LORA_NTARGETS] = {
      NULL, "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
  if ((unsigned)t >= ST_LORA_NTARGETS) return NULL;
  return is_gpt2(cfg) ? gpt2[t] : llama[t];
}

unsigned st_lora_family_targets(const st_model_config *cfg) {
  if (is_gpt2(cfg))
    return 1u << ST_LORA_QKV | 1u << ST_LORA_O | 1u << ST_LORA_UP | 1u << ST_LORA_DOWN;
  return 1u << ST_LORA_Q | 1u << ST_LORA_K | 1u << ST_LORA_V | 1u << ST_LORA_O |
         1u << ST_LORA_GATE | 1u << ST_LORA_UP | 1u << ST_LORA_DOWN;
}

unsigned st_lora_default_targets(const st_model_config *cfg) {
  return is_gpt2(cfg) ? 1u << ST_LORA_QKV : 1u << ST_LORA_Q | 1u << ST_LORA_V;
}

/* The family's targets as text ("q, k, v, o, gate, up, down"). */
static void family_list(const st_model_config *cfg, char *out, size_t cap) {
  const unsigned fam = st_lora_family_targets(cfg);
  size_t n = 0;
  out[0] = 0;
  for (int t = 0; t < ST_LORA_NTARGETS && n < cap; t++)
    if (fam & 1u << t) n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", k_names[t]);
}

/* Keep the first unknown target name for st_lora_resolve, which knows the
 * family; one too long to keep is refused here, with every family's list. */
static int note_unknown(const char *spec, const char *name, st_lora_config *out) {
  if (strlen(name) >= sizeof out->unknown)
    return st_error_setc(ST_EXIT_USAGE, "--lora %s: unknown target '%s'; GPT-2's targets are "
                         "qkv, o, up, down, Llama's and Qwen2's q, k, v, o, gate, up, down",
                         spec, name);
  if (!out->unknown[0]) snprintf(out->unknown, sizeof out->unknown, "%s", name);
  return 0;
}

#define SPEC_FIX "give e.g. --lora 8 or --lora 16,alpha=32,dropout=0.05,targets=q,k,v,o"

static int parse_float(const char *s, float *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return -1;
  *out = (float)v;
  return 0;
}

static void append(char *buf, size_t cap, size_t *n, const char *sep, const char *s) {
  if (*n < cap) *n += (size_t)snprintf(buf + *n, cap - *n, "%s%s", sep, s);
}

/* spec rewritten in the documented order, RANK[,key=value...][,targets=T,...],
 * for the message that refuses another order: the rank bare (PEFT writes
 * r=16), the keys as given, targets= and every target last. */
static void documented_order(const char *spec, char *out, size_t cap) {
  char buf[512], keys[512] = "", tgts[512] = "";
  size_t nk = 0, nt = 0;
  snprintf(buf, sizeof buf, "%s", spec);
  int in_targets = 0, first = 1;
  const char *rank = "";
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save), first = 0) {
    const int kv = strchr(tok, '=') != NULL;
    if (first) {
      rank = strncmp(tok, "r=", 2) == 0 ? tok + 2 : tok;
    } else if (strncmp(tok, "targets=", 8) == 0) {
      in_targets = 1;
      if (tok[8]) append(tgts, sizeof tgts, &nt, nt ? "," : "", tok + 8);
    } else if (kv || !in_targets) {
      append(keys, sizeof keys, &nk, ",", tok);
    } else {
      append(tgts, sizeof tgts, &nt, nt ? "," : "", tok);
    }
  }
  snprintf(out, cap, "%s%s%s%s", rank, keys, nt ? ",targets=" : "", tgts);
}

int st_lora_parse(const char *spec, st_lora_config *out) {
  const int U = ST_EXIT_USAGE;
  memset(out, 0, sizeof *out);
  out->alpha = 8.0f;
  char buf[512];
  if (!spec || !*spec || strlen(spec) >= sizeof buf)
    return st_error_setc(U, "--lora: empty or too long a spec; " SPEC_FIX);
  snprintf(buf, sizeof buf, "%s", spec);
  int in_targets = 0, first = 1;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save), first = 0) {
    char *eq = strchr(tok, '=');
    char fix[512];
    if (first && strncmp(tok, "r=", 2) == 0) {
      documented_order(spec, fix, sizeof fix);
      return st_error_setc(U, "--lora %s: the rank is the first field, a bare whole number (not "
                           "r=); write --lora %s", spec, fix);
    }
    /* after targets= every field is a target (docs/lora.md), so a key there
     * would be a target named 'alpha=32': refused rather than guessed */
    if (eq && in_targets) {
      documented_order(spec, fix, sizeof fix);
      *eq = '\0';
      return st_error_setc(U, "--lora %s: targets= takes every field after it, so it comes "
                           "last ('%s=' follows it); write --lora %s", spec, tok, fix);
    }
    if (first) {
      char *end;
      errno = 0;
      long r = strtol(tok, &end, 10);
      if (eq || errno || end == tok || *end || r < 1 || r > 65536)
        return st_error_setc(U, "--lora %s: the first field is the rank, a whole number in "
                             "[1, 65536], got '%s'; " SPEC_FIX, spec, tok);
      out->rank = (int)r;
      continue;
    }
    if (!eq) {
      if (!in_targets)
        return st_error_setc(U, "--lora %s: '%s' is neither key=value nor after targets=; "
                             SPEC_FIX, spec, tok);
      int t = st_lora_target_parse(tok);
      if (t < 0) {
        if (note_unknown(spec, tok, out)) return -1;
      } else {
        out->targets |= 1u << t;
      }
      continue;
    }
    *eq = '\0';
    const char *key = tok, *val = eq + 1;
    if (strcmp(key, "alpha") == 0) {
      if (parse_float(val, &out->alpha) || out->alpha <= 0)
        return st_error_setc(U, "--lora %s: alpha must be a number > 0, got '%s'", spec, val);
    } else if (strcmp(key, "dropout") == 0) {
      if (parse_float(val, &out->dropout) || out->dropout < 0 || out->dropout >= 1)
        return st_error_setc(U, "--lora %s: dropout must be in [0, 1), got '%s'", spec, val);
    } else if (strcmp(key, "targets") == 0) {
      in_targets = 1;
      if (*val) {
        int t = st_lora_target_parse(val);
        if (t < 0) {
          if (note_unknown(spec, val, out)) return -1;
        } else {
          out->targets |= 1u << t;
        }
      }
    } else {
      return st_error_setc(U, "--lora %s: unknown key '%s'; keys are alpha, dropout, targets; "
                           SPEC_FIX, spec, key);
    }
  }
  return 0;
}

int st_lora_resolve(st_lora_config *lora, const st_model_config *cfg) {
  if (lora->rank < 1) return 0;
  char fam[64];
  family_list(cfg, fam, sizeof fam);
  if (lora->unknown[0]) {
    /* a PEFT module name given for ours: say which of ours it is (GPT-2's
     * c_proj is two: attn.c_proj and mlp.c_proj) */
    char ours[32] = "";
    size_t k = 0;
    for (int t = 0; t < ST_LORA_NTARGETS && k < sizeof ours; t++) {
      const char *m = st_lora_peft_module(cfg, (st_lora_target)t);
      const char *leaf = m ? strrchr(m, '.') : NULL;
      if (leaf && strcmp(leaf + 1, lora->unknown) == 0)
        k += (size_t)snprintf(ours + k, sizeof ours - k, "%s%s", k ? " or " : "", k_names[t]);
    }
    if (ours[0])
      return st_error_setc(ST_EXIT_USAGE, "--lora: unknown target '%s', PEFT's name for our %s; "
                           "a %s model's targets are %s", lora->unknown, ours,
                           st_arch_name(cfg->arch), fam);
    return st_error_setc(ST_EXIT_USAGE, "--lora: unknown target '%s'; a %s model's targets are "
                         "%s", lora->unknown, st_arch_name(cfg->arch), fam);
  }
  if (!lora->targets) lora->targets = st_lora_default_targets(cfg);
  const unsigned bad = lora->targets & ~st_lora_family_targets(cfg);
  if (bad) {
    int t = 0;
    while (!(bad & 1u << t)) t++;
    return st_error_setc(ST_EXIT_USAGE, "--lora: target '%s' does not exist in a %s model; "
                         "use %s", k_names[t], st_arch_name(cfg->arch), fam);
  }
  if ((lora->targets & 1u << ST_LORA_GATE) && cfg->mlp != ST_MLP_SWIGLU)
    return st_error_setc(ST_EXIT_USAGE, "--lora: target 'gate' needs a SwiGLU MLP");
  return 0;
}

void st_lora_format(const st_lora_config *lora, char *out, int cap) {
  int n = snprintf(out, (size_t)cap, "%d,alpha=%.7g,dropout=%.7g,targets=", lora->rank,
                   (double)lora->alpha, (double)lora->dropout);
  const char *sep = "";
  for (int t = 0; t < ST_LORA_NTARGETS && n < cap; t++)
    if (lora->targets & 1u << t) {
      n += snprintf(out + n, (size_t)(cap - n), "%s%s", sep, k_names[t]);
      sep = ",";
    }
  /* kept, so the spec normalised before the model is known still fails
   * st_lora_resolve when it is */
  if (lora->unknown[0] && n < cap) snprintf(out + n, (size_t)(cap - n), "%s%s", sep, lora->unknown);
}

/* The base projection, its output width and the rows of target t. */
static void target_geometry(const st_model_config *c, st_lora_target t, st_lora_slot *s) {
  const int C = c->n_embd, hd = st_model_head_dim(c), QKV = st_model_qkv_dim(c), F = c->ffn_dim;
  const int swiglu = c->mlp == ST_MLP_SWIGLU, FC = swiglu ? 2 * F : F;
  s->in = C;
  s->row0 = 0;
  switch (t) {
  case ST_LORA_QKV: s->proj = ST_LORA_PROJ_QKV; s->proj_out = s->out = QKV; break;
  case ST_LORA_Q: s->proj = ST_LORA_PROJ_QKV; s->proj_out = QKV; s->out = c->n_head * hd; break;
  case ST_LORA_K:
    s->proj = ST_LORA_PROJ_QKV; s->proj_out = QKV;
    s->row0 = c->n_head * hd; s->out = c->n_kv_head * hd;
    break;
  case ST_LORA_V:
    s->proj = ST_LORA_PROJ_QKV; s->proj_out = QKV;
    s->row0 = (c->n_head + c->n_kv_head) * hd; s->out = c->n_kv_head * hd;
    break;
  case ST_LORA_O: s->proj = ST_LORA_PROJ_ATTN; s->proj_out = s->out = C; break;
  case ST_LORA_GATE: s->proj = ST_LORA_PROJ_FC; s->proj_out = FC; s->out = F; break;
  case ST_LORA_UP:
    s->proj = ST_LORA_PROJ_FC; s->proj_out = FC;
    s->row0 = swiglu ? F : 0; s->out = F;
    break;
  default: /* ST_LORA_DOWN */
    s->proj = ST_LORA_PROJ_MLP; s->proj_out = s->out = C; s->in = F;
    break;
  }
}

int st_lora_table_build(const st_model_config *cfg, const st_lora_config *lora,
                        st_lora_table *tab) {
  memset(tab, 0, sizeof *tab);
  st_model_config c = *cfg;
  st_model_fill_derived(&c);
  for (int t = 0; t < ST_LORA_NTARGETS; t++) tab->per_layer += (lora->targets >> t) & 1;
  if (lora->rank < 1 || tab->per_layer == 0)
    return st_error_set("internal: LoRA table for rank %d with no targets", lora->rank);
  tab->n = c.n_layer * tab->per_layer;
  tab->slot = calloc((size_t)(tab->n > 0 ? tab->n : 1), sizeof *tab->slot);
  if (!tab->slot) return st_error_set("out of host memory for the LoRA table");
  const int64_t r = lora->rank;
  int64_t off = 0;
  int k = 0;
  for (int l = 0; l < c.n_layer; l++)
    for (int t = 0; t < ST_LORA_NTARGETS; t++) {
      if (!(lora->targets >> t & 1)) continue;
      st_lora_slot *s = &tab->slot[k++];
      s->layer = l;
      s->target = (st_lora_target)t;
      target_geometry(&c, s->target, s);
      s->a_off = off;
      off += r * s->in;
      s->b_off = off;
      off += (int64_t)s->out * r;
      if (s->in > tab->max_in) tab->max_in = s->in;
      if (s->out > tab->max_out) tab->max_out = s->out;
    }
  tab->total = off;
  tab->layer_numel = c.n_layer > 0 ? off / c.n_layer : 0;
  return 0;
}

void st_lora_table_free(st_lora_table *tab) {
  free(tab->slot);
  memset(tab, 0, sizeof *tab);
}

int st_lora_param_table(const st_model_config *cfg, const st_lora_table *lt,
                        st_param_table *tab) {
  (void)cfg;
  memset(tab, 0, sizeof *tab);
  tab->n = 2 * lt->n;
  tab->t = calloc((size_t)(tab->n > 0 ? tab->n : 1), sizeof *tab->t);
  if (!tab->t) return st_error_set("out of host memory for the LoRA parameter table");
  const int64_t r = lt->n > 0 ? (lt->slot[0].b_off - lt->slot[0].a_off) / lt->slot[0].in : 0;
  for (int i = 0; i < lt->n; i++) {
    const st_lora_slot *s = &lt->slot[i];
    st_tensor *a = &tab->t[2 * i], *b = &tab->t[2 * i + 1];
    snprintf(a->name, ST_MAX_NAME, "h.%d.lora_%s.A", s->layer, k_names[s->target]);
    snprintf(b->name, ST_MAX_NAME, "h.%d.lora_%s.B", s->layer, k_names[s->target]);
    a->ndim = b->ndim = 2;
    a->shape[0] = r;
    a->shape[1] = s->in;
    b->shape[0] = s->out;
    b->shape[1] = r;
    a->offset = s->a_off;
    b->offset = s->b_off;
    a->numel = r * s->in;
    b->numel = (int64_t)s->out * r;
    a->decay = b->decay = 1;
  }
  tab->total = lt->total;
  tab->block_first = 0;
  tab->block_tensors = 2 * lt->per_layer;
  return 0;
}

void st_lora_init(const st_lora_table *tab, float *host, st_rng *rng) {
  memset(host, 0, (size_t)tab->total * sizeof(float));
  for (int i = 0; i < tab->n; i++) {
    const st_lora_slot *s = &tab->slot[i];
    const int64_t na = tab->slot[i].b_off - s->a_off;
    /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/in) = 1/sqrt(in) */
    const float bound = 1.0f / sqrtf((float)s->in);
    for (int64_t k = 0; k < na; k++)
      host[s->a_off + k] = bound * (2.0f * st_rng_uniform(rng) - 1.0f);
  }
}

int st_lora_merge(const st_lora_table *tab, const st_lora_config *lora,
                  const st_param_table *base_tab, float *base, const float *ad) {
  static const char *const proj_name[] = {"attn.qkv.weight", "attn.proj.weight",
                                          "mlp.fc.weight", "mlp.proj.weight"};
  const float scale = st_lora_scale(lora);
  const int r = lora->rank;
  for (int i = 0; i < tab->n; i++) {
    const st_lora_slot *s = &tab->slot[i];
    char name[ST_MAX_NAME];
    snprintf(name, sizeof name, "h.%d.%s", s->layer, proj_name[s->proj]);
    const int ti = st_param_find(base_tab, name);
    if (ti < 0) return st_error_set("LoRA merge: the base has no tensor %s", name);
    float *W = base + base_tab->t[ti].offset; /* [proj_out, in] */
    const float *A = ad + s->a_off, *B = ad + s->b_off;
    for (int o = 0; o < s->out; o++) {
      float *wr = W + (int64_t)(s->row0 + o) * s->in;
      for (int k = 0; k < r; k++) {
        const float bk = scale * B[(int64_t)o * r + k];
        const float *ak = A + (int64_t)k * s->in;
        for (int c = 0; c < s->in; c++) wr[c] += bk * ak[c];
      }
    }
  }
  return 0;
}

int st_lora_base_digest(const st_param_table *tab, const float *w, char hex[65]) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
  for (int i = 0; ok && i < tab->n; i++) {
    const st_tensor *t = &tab->t[i];
    unsigned char shape[16];
    for (int k = 0; k < 16; k++) shape[k] = (unsigned char)((uint64_t)t->shape[k / 8] >> (8 * (k % 8)));
    ok = EVP_DigestUpdate(c, t->name, strlen(t->name) + 1) == 1 &&
         EVP_DigestUpdate(c, shape, sizeof shape) == 1 &&
         EVP_DigestUpdate(c, w + t->offset, (size_t)t->numel * sizeof(float)) == 1; /* x86/ARM: LE */
  }
  unsigned char md[32];
  unsigned len = 0;
  ok = ok && EVP_DigestFinal_ex(c, md, &len) == 1 && len == 32;
  EVP_MD_CTX_free(c);
  if (!ok) return st_error_set("SHA-256 of the LoRA base failed (OpenSSL)");
  for (int k = 0; k < 32; k++) snprintf(hex + 2 * k, 3, "%02x", md[k]);
  return 0;
}

/* config_fields.c - the model description's fields as one table (see
 * config_fields.h). */
#include "rank/model/config_fields.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"

static const char *const k_arch_names[] = {"gpt2", "llama", "qwen2", NULL};
static const char *const k_norm_names[] = {"layernorm", "rmsnorm", NULL};
static const char *const k_pos_names[] = {"learned", "rope", NULL};
static const char *const k_mlp_names[] = {"gelu", "swiglu", NULL};
static const char *const k_scaling_names[] = {"none", "llama3", NULL};

/* Keys are Hugging Face's where it has one (rope_theta, rope_scaling's
 * factors), so a config reads the same in both. */
static const st_model_field k_fields[ST_MF_COUNT] = {
    [ST_MF_LAYERS] = {"n_layer", "--layers", "--layers", ST_MF_INT, NULL, 1},
    [ST_MF_HEADS] = {"n_head", "--heads", "--heads", ST_MF_INT, NULL, 1},
    [ST_MF_DIM] = {"n_embd", "--dim", "--dim", ST_MF_INT, NULL, 1},
    /* no flag sets the positions apart from --seq-len (a fresh GPT-2 has
     * T of them; a family preset and --init-from have the model's own) */
    [ST_MF_POSITIONS] = {"block_size", NULL, "the model's positions", ST_MF_INT, NULL, 1},
    [ST_MF_VOCAB] = {"vocab_size", "--vocab-size", "--vocab-size", ST_MF_INT, NULL, 1},
    [ST_MF_ARCH] = {"arch", "--arch", "--arch", ST_MF_ENUM, k_arch_names, 0},
    [ST_MF_KV_HEADS] = {"n_kv_head", "--kv-heads", "--kv-heads", ST_MF_INT, NULL, 0},
    [ST_MF_FFN] = {"ffn_dim", "--ffn-dim", "--ffn-dim", ST_MF_INT, NULL, 0},
    [ST_MF_NORM] = {"norm", NULL, "the norm", ST_MF_ENUM, k_norm_names, 0},
    [ST_MF_NORM_EPS] = {"norm_eps", "--norm-eps", "--norm-eps", ST_MF_FLOAT, NULL, 0},
    [ST_MF_POS] = {"pos", NULL, "the positions' kind", ST_MF_ENUM, k_pos_names, 0},
    [ST_MF_ROPE_THETA] = {"rope_theta", "--rope-theta", "--rope-theta", ST_MF_FLOAT, NULL, 0},
    [ST_MF_ROPE_SCALING] = {"rope_scaling", NULL, "the rope scaling", ST_MF_ENUM,
                            k_scaling_names, 0},
    [ST_MF_ROPE_FACTOR] = {"rope_factor", NULL, "the rope scaling factor", ST_MF_FLOAT, NULL, 0},
    [ST_MF_ROPE_LOW] = {"rope_low_freq_factor", NULL, "the rope low_freq_factor", ST_MF_FLOAT,
                        NULL, 0},
    [ST_MF_ROPE_HIGH] = {"rope_high_freq_factor", NULL, "the rope high_freq_factor",
                         ST_MF_FLOAT, NULL, 0},
    [ST_MF_ROPE_ORIG] = {"rope_original_max_position_embeddings", NULL,
                         "the rope original_max_position_embeddings", ST_MF_INT, NULL, 0},
    [ST_MF_MLP] = {"mlp", NULL, "the MLP", ST_MF_ENUM, k_mlp_names, 0},
    [ST_MF_QKV_BIAS] = {"qkv_bias", NULL, "the q/k/v bias", ST_MF_BOOL, NULL, 0},
    [ST_MF_PROJ_BIAS] = {"proj_bias", NULL, "the attention projection's bias", ST_MF_BOOL, NULL,
                         0},
    [ST_MF_MLP_BIAS] = {"mlp_bias", NULL, "the MLP biases", ST_MF_BOOL, NULL, 0},
    [ST_MF_TIED] = {"tied", "--tied", "--tied", ST_MF_BOOL, NULL, 0},
};

const st_model_field *st_model_field_info(st_model_field_id id) { return &k_fields[id]; }

double st_model_field_get(const st_model_config *c, st_model_field_id id) {
  const st_rope_scaling *r = &c->rope_scaling;
  switch (id) {
  case ST_MF_LAYERS: return c->n_layer;
  case ST_MF_HEADS: return c->n_head;
  case ST_MF_DIM: return c->n_embd;
  case ST_MF_POSITIONS: return c->block_size;
  case ST_MF_VOCAB: return c->vocab_size;
  case ST_MF_ARCH: return (double)c->arch;
  case ST_MF_KV_HEADS: return c->n_kv_head;
  case ST_MF_FFN: return c->ffn_dim;
  case ST_MF_NORM: return (double)c->norm;
  case ST_MF_NORM_EPS: return st_float_decimal(c->norm_eps);
  case ST_MF_POS: return (double)c->pos;
  case ST_MF_ROPE_THETA: return st_float_decimal(c->rope_theta);
  case ST_MF_ROPE_SCALING: return (double)r->kind;
  case ST_MF_ROPE_FACTOR: return st_float_decimal(r->factor);
  case ST_MF_ROPE_LOW: return st_float_decimal(r->low_freq_factor);
  case ST_MF_ROPE_HIGH: return st_float_decimal(r->high_freq_factor);
  case ST_MF_ROPE_ORIG: return r->original_max_pos;
  case ST_MF_MLP: return (double)c->mlp;
  case ST_MF_QKV_BIAS: return !(c->no_bias & ST_NO_BIAS_QKV);
  case ST_MF_PROJ_BIAS: return !(c->no_bias & ST_NO_BIAS_PROJ);
  case ST_MF_MLP_BIAS: return !(c->no_bias & ST_NO_BIAS_MLP);
  case ST_MF_TIED: return !c->untied;
  case ST_MF_COUNT: break;
  }
  return 0;
}

static void set_bit(unsigned *bits, unsigned bit, int bias_present) {
  if (bias_present) *bits &= ~bit;
  else *bits |= bit;
}

void st_model_field_set(st_model_config *c, st_model_field_id id, double v) {
  st_rope_scaling *r = &c->rope_scaling;
  const int i = (int)v;
  switch (id) {
  case ST_MF_LAYERS: c->n_layer = i; break;
  case ST_MF_HEADS: c->n_head = i; break;
  case ST_MF_DIM: c->n_embd = i; break;
  case ST_MF_POSITIONS: c->block_size = i; break;
  case ST_MF_VOCAB: c->vocab_size = i; break;
  case ST_MF_ARCH: c->arch = (st_arch)i; break;
  case ST_MF_KV_HEADS: c->n_kv_head = i; break;
  case ST_MF_FFN: c->ffn_dim = i; break;
  case ST_MF_NORM: c->norm = (st_norm_kind)i; break;
  case ST_MF_NORM_EPS: c->norm_eps = (float)v; break;
  case ST_MF_POS: c->pos = (st_pos_kind)i; break;
  case ST_MF_ROPE_THETA: c->rope_theta = (float)v; break;
  case ST_MF_ROPE_SCALING: r->kind = (st_rope_scaling_kind)i; break;
  case ST_MF_ROPE_FACTOR: r->factor = (float)v; break;
  case ST_MF_ROPE_LOW: r->low_freq_factor = (float)v; break;
  case ST_MF_ROPE_HIGH: r->high_freq_factor = (float)v; break;
  case ST_MF_ROPE_ORIG: r->original_max_pos = i; break;
  case ST_MF_MLP: c->mlp = (st_mlp_kind)i; break;
  case ST_MF_QKV_BIAS: set_bit(&c->no_bias, ST_NO_BIAS_QKV, i != 0); break;
  case ST_MF_PROJ_BIAS: set_bit(&c->no_bias, ST_NO_BIAS_PROJ, i != 0); break;
  case ST_MF_MLP_BIAS: set_bit(&c->no_bias, ST_NO_BIAS_MLP, i != 0); break;
  case ST_MF_TIED: c->untied = i == 0; break;
  case ST_MF_COUNT: break;
  }
}

const char *st_model_field_show(const st_model_config *c, st_model_field_id id, char *buf,
                                size_t cap) {
  const st_model_field *f = &k_fields[id];
  const double v = st_model_field_get(c, id);
  if (f->kind == ST_MF_ENUM) {
    int n = 0;
    while (f->names[n]) n++;
    const int i = (int)v;
    snprintf(buf, cap, "%s", i >= 0 && i < n ? f->names[i] : "?");
  } else if (f->kind == ST_MF_BOOL) {
    /* as its flag takes it (--tied 0|1), else as the JSON has it */
    snprintf(buf, cap, "%s", f->flag ? (v != 0 ? "1" : "0") : v != 0 ? "true" : "false");
  } else {
    snprintf(buf, cap, "%.7g", v);
  }
  return buf;
}

st_model_config st_model_effective(const st_model_config *c) {
  st_model_config e = *c;
  if (e.n_kv_head == 0) e.n_kv_head = e.n_head;
  if (e.ffn_dim == 0) e.ffn_dim = 4 * e.n_embd;
  if (e.norm_eps == 0) e.norm_eps = 1e-5f;
  if (e.pos == ST_POS_ROPE) {
    if (e.rope_theta == 0) e.rope_theta = 10000.0f;
    if (e.rope_scaling.kind == ST_ROPE_SCALING_NONE) memset(&e.rope_scaling, 0, sizeof e.rope_scaling);
  } else {
    e.rope_theta = 0;
    memset(&e.rope_scaling, 0, sizeof e.rope_scaling);
  }
  return e;
}

/* 1 when c is GPT-2 in every choice (shape aside). */
static int plain_gpt2(const st_model_config *c) {
  const st_model_config e = st_model_effective(c);
  return e.arch == ST_ARCH_GPT2 && e.n_kv_head == e.n_head && e.ffn_dim == 4 * e.n_embd &&
         e.norm == ST_NORM_LAYERNORM && e.pos == ST_POS_LEARNED && e.mlp == ST_MLP_GELU &&
         e.no_bias == 0 && !e.untied;
}

#define PUT(...)                                                   \
  do {                                                             \
    size_t n_ = strlen(buf);                                       \
    if (n_ < cap) snprintf(buf + n_, cap - n_, __VA_ARGS__);       \
  } while (0)

const char *st_model_describe(const st_model_config *c, char *buf, size_t cap) {
  if (!cap) return buf;
  buf[0] = 0;
  if (plain_gpt2(c)) return buf;
  const st_model_config e = st_model_effective(c);
  const int hd = e.n_head > 0 ? e.n_embd / e.n_head : 0;
  PUT("%s: %d KV heads of %d, FFN %d %s, %s", st_arch_name(e.arch), e.n_kv_head, hd, e.ffn_dim,
      e.mlp == ST_MLP_SWIGLU ? "SwiGLU" : "GELU", e.norm == ST_NORM_RMSNORM ? "RMSNorm" : "LayerNorm");
  if (e.norm == ST_NORM_RMSNORM) PUT(" eps %g", (double)e.norm_eps);
  if (e.pos == ST_POS_ROPE) {
    PUT(", RoPE theta %g", (double)e.rope_theta);
    if (e.rope_scaling.kind == ST_ROPE_SCALING_LLAMA3)
      PUT(" (llama3 scaling x%g of %d)", (double)e.rope_scaling.factor,
          e.rope_scaling.original_max_pos);
  } else {
    PUT(", learned positions");
  }
  const unsigned nb = e.no_bias & ST_NO_BIAS_ALL;
  PUT(", %s", nb == 0                                    ? "biases"
              : nb == ST_NO_BIAS_ALL                     ? "no biases"
              : nb == (ST_NO_BIAS_ALL & ~ST_NO_BIAS_QKV) ? "q/k/v biases only"
                                                          : "some biases");
  PUT(", %s head", e.untied ? "untied" : "tied");
  return buf;
}

const char *st_model_flags(const st_model_config *c, char *buf, size_t cap) {
  if (!cap) return buf;
  buf[0] = 0;
  PUT("--layers %d --heads %d --dim %d --vocab-size %d", c->n_layer, c->n_head, c->n_embd,
      c->vocab_size);
  if (plain_gpt2(c)) return buf;
  const st_model_config e = st_model_effective(c);
  PUT(" --arch %s --kv-heads %d --ffn-dim %d", st_arch_name(e.arch), e.n_kv_head, e.ffn_dim);
  if (e.pos == ST_POS_ROPE) PUT(" --rope-theta %g", (double)e.rope_theta);
  if (e.norm == ST_NORM_RMSNORM) PUT(" --norm-eps %g", (double)e.norm_eps);
  PUT(" --tied %d", !e.untied);
  return buf;
}
#undef PUT

/* peft_names.c - PEFT's module names for our LoRA targets, and the tensor
 * name prefix of each family (see peft_export.h). */
#include <string.h>

#include "io/peft_export.h"
#include "io/peft_names.h"

typedef struct {
  const char *target; /* our name (train --lora targets=) */
  const char *module; /* PEFT module path under the layer */
} target_map;

/* In the order of the flat adapter layout (rank/model/lora.h): qkv, q, k,
 * v, o, gate, up, down. */
static const target_map GPT2[] = {
    {"qkv", "attn.c_attn"}, {"o", "attn.c_proj"}, {"up", "mlp.c_fc"}, {"down", "mlp.c_proj"}};
static const target_map LLAMA[] = {
    {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"},  {"v", "self_attn.v_proj"},
    {"o", "self_attn.o_proj"}, {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"},
    {"down", "mlp.down_proj"}};

static const target_map *family(st_arch arch, int *n) {
  if (arch == ST_ARCH_GPT2) {
    *n = (int)(sizeof GPT2 / sizeof GPT2[0]);
    return GPT2;
  }
  *n = (int)(sizeof LLAMA / sizeof LLAMA[0]);
  return LLAMA;
}

const char *st_peft_module_of(st_arch arch, const char *target) {
  int n;
  const target_map *m = family(arch, &n);
  for (int i = 0; i < n; i++)
    if (strcmp(m[i].target, target) == 0) return m[i].module;
  return NULL;
}

const char *st_peft_prefix(st_arch arch) {
  return arch == ST_ARCH_GPT2 ? "base_model.model.transformer.h."
                              : "base_model.model.model.layers.";
}

int st_peft_n_modules(st_arch arch) {
  int n;
  family(arch, &n);
  return n;
}

const char *st_peft_module_at(st_arch arch, int i) {
  int n;
  const target_map *m = family(arch, &n);
  return i >= 0 && i < n ? m[i].module : NULL;
}

int st_peft_module_known(st_arch arch, const char *module) {
  int n;
  const target_map *m = family(arch, &n);
  for (int i = 0; i < n; i++)
    if (strcmp(m[i].module, module) == 0) return 1;
  return 0;
}

const char *st_peft_leaf(const char *module) {
  const char *dot = strrchr(module, '.');
  return dot ? dot + 1 : module;
}

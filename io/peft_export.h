/* peft_export.h - LoRA adapters as a Hugging Face PEFT adapter directory.
 *
 * The directory PeftModel.save_pretrained writes and
 * PeftModel.from_pretrained(base, DIR) loads:
 *   adapter_config.json        LoraConfig's fields (peft/tuners/lora/config.py)
 *   adapter_model.safetensors  one lora_A and one lora_B weight per module
 * Tensor names are the PeftModel's state-dict keys with the adapter name
 * removed (peft/utils/save_and_load.py, get_peft_model_state_dict: the
 * module "lora_A.default" is saved as "lora_A"):
 *   GPT-2        base_model.model.transformer.h.L.<module>.lora_{A,B}.weight
 *   Llama/Qwen2  base_model.model.model.layers.L.<module>.lora_{A,B}.weight
 * lora_A.weight is [r, in] and lora_B.weight [out, r] for every module,
 * GPT-2's Conv1D included: PEFT wraps each target in nn.Linear(in, r) and
 * nn.Linear(r, out) (peft/tuners/lora/layer.py, LoraLayer.update_layer; for a
 * Conv1D in, out = weight.shape, Conv1D storing [in, out]). fan_in_fan_out
 * (true for GPT-2) only transposes the merged delta scale * B @ A onto the
 * Conv1D weight (Linear.get_delta_weight); the adapters are the same.
 * The output of a module is base(x) + (alpha / r) * B (A x) (no rsLoRA,
 * no DoRA, no bias on lora_B).
 */
#ifndef ST_PEFT_EXPORT_H
#define ST_PEFT_EXPORT_H

#include "kernels/dtype.h"
#include "rank/model/config.h"

#define ST_PEFT_MODULE_MAX 32

/* One adapter: A [r, in] and B [out, r], row-major fp32, on module `module`
 * (a PEFT module path under the layer, e.g. "self_attn.q_proj",
 * "mlp.down_proj", "attn.c_attn", "mlp.c_fc") of layer `layer`. */
typedef struct {
  int layer;
  char module[ST_PEFT_MODULE_MAX];
  int in, out;
  const float *A;
  const float *B;
} st_peft_adapter;

/* What adapter_config.json says. */
typedef struct {
  st_arch arch;           /* GPT-2, or the Llama naming (Llama and Qwen2) */
  int r;                  /* rank, > 0 */
  float alpha;            /* lora_alpha: scale = alpha / r */
  float dropout;          /* lora_dropout, in [0, 1) */
  st_dtype dtype;         /* of the tensors written: ST_FP32 (the default), ST_BF16, ST_FP16 */
  const char *base_model; /* base_model_name_or_path; NULL or "": null */
} st_peft_config;

/* The PEFT module path of one of our LoRA target names (the contract of
 * `train --lora ... targets=`): GPT-2 qkv, o, up, down -> attn.c_attn,
 * attn.c_proj, mlp.c_fc, mlp.c_proj; Llama/Qwen2 q, k, v, o, gate, up, down
 * -> self_attn.q_proj .. mlp.down_proj. NULL for a name the family lacks. */
const char *st_peft_module_of(st_arch arch, const char *target);

/* Write the adapter directory out_dir from the n adapters (any order; the
 * file is laid out in name order). target_modules is derived from them: the
 * sorted unique module leaf names ("q_proj", "c_attn"), or the module path
 * ("attn.c_proj") where a leaf name alone would also match a module of the
 * family that carries no adapter (PEFT matches target_modules as a suffix
 * of the module's name: GPT-2's attn.c_proj and mlp.c_proj share "c_proj").
 * PEFT puts an adapter on every layer's module that target_modules names;
 * a layer given no adapter here is loaded with PEFT's initial A and B = 0,
 * which adds nothing.
 *
 * Refuses (exit 3, ST_EXIT_CHECKPOINT, as `ckpt export`) an out_dir that
 * exists: never overwrites. An out_dir that cannot be made (its parent
 * missing or not writable) is exit 1 (ST_EXIT_ERROR), naming out_dir. Writes into out_dir.tmp.XXXXXX and renames it
 * at the end, so a failure leaves nothing at out_dir and removes the
 * temporary directory. Bad arguments (r <= 0, a module the family does not
 * have, a duplicate (layer, module), in/out <= 0, a non-finite value, a
 * dropout outside [0, 1)) are exit 3 too, naming the adapter.
 * 0, or -1 with st_error set. */
int st_peft_export(const char *out_dir, const st_peft_config *cfg, const st_peft_adapter *ad,
                   int n);

/* An adapter directory read back: adapters sorted by layer, then in the
 * family's module order (that of the flat layout: attention before MLP,
 * q k v o, gate up down), A and B pointing into `data` (fp32, converted
 * from the file's dtype);
 * cfg.base_model points into base_model (NULL when null). */
typedef struct {
  st_peft_config cfg;
  char base_model[1024];
  int n;
  st_peft_adapter *ad;
  float *data;
  int fan_in_fan_out;     /* as written in the config */
  int n_targets;
  char (*targets)[ST_PEFT_MODULE_MAX]; /* target_modules as written */
} st_peft_set;

/* Read the adapter directory dir into *s (zeroed here). cfg.arch is
 * ST_ARCH_GPT2 or ST_ARCH_LLAMA (the Llama naming, also Qwen2's: the files
 * cannot tell them apart); cfg.dtype is the first tensor's dtype. Missing
 * lora_alpha / lora_dropout take LoraConfig's defaults (8, 0). Exit 3 with one
 * line naming the file and field for: a missing file, JSON that is not an
 * object, peft_type other than LORA, r not a positive integer, lora_alpha
 * not a number, use_rslora or use_dora true, bias other than "none",
 * rank_pattern or alpha_pattern not empty (a scale we would not apply), a
 * tensor name that is not a lora_A/lora_B weight of a module of the family
 * (modules_to_save, embeddings), an A without its B or the other way round,
 * shapes other than A [r, in] and B [out, r], names of both families mixed.
 * 0, or -1 with st_error set (and *s freed). */
int st_peft_read(const char *dir, st_peft_set *s);
void st_peft_free(st_peft_set *s);

#endif

/* peft_names.h - the module names and tensor prefixes shared by the PEFT
 * adapter writer and reader (io/peft_export.c, io/peft_read.c). */
#ifndef ST_PEFT_NAMES_H
#define ST_PEFT_NAMES_H

#include "rank/model/config.h"

/* "base_model.model.transformer.h." (GPT-2) or
 * "base_model.model.model.layers." (Llama, Qwen2): a tensor is
 * PREFIX + L + "." + module + ".lora_A.weight" (or lora_B). */
const char *st_peft_prefix(st_arch arch);
/* The family's adaptable modules, i in [0, st_peft_n_modules). */
int st_peft_n_modules(st_arch arch);
const char *st_peft_module_at(st_arch arch, int i);
/* 1 when module is one of the family's module paths. */
int st_peft_module_known(st_arch arch, const char *module);
/* The last dot-separated part of a module path ("c_proj" of "attn.c_proj"). */
const char *st_peft_leaf(const char *module);

#endif

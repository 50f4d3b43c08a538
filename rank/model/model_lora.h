/* model_lora.h - the LoRA adapter path of the schedule (rank/model/model.c
 * calls it around each base projection). Internal to rank/model/. */
#ifndef ST_MODEL_LORA_H
#define ST_MODEL_LORA_H

#include "rank/model/model.h"

/* y [BT, proj_out] += scale * (dropout(x) A^T) B^T on each of layer l's
 * adapters of projection proj; x [BT, in]. No-op without LoRA. */
void st_model_lora_forward(st_model *m, int l, st_lora_proj proj, void *y, const void *x, int BT);
/* After the base's backward wrote dx from dy: dA, dB and dx += the adapter
 * path's share, with the forward's dropout masks. No-op without LoRA. */
void st_model_lora_backward(st_model *m, int l, st_lora_proj proj, const void *dy, void *dx,
                            const void *x, int BT);

#endif

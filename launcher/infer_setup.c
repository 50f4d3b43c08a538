/* infer_setup.c - model loading and flag values for sample and eval (see
 * infer_setup.h). */
#include "launcher/infer_setup.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/tokenizer.h"
#include "launcher/env.h"
#include "rank/train/device_select.h"
#include "util/error.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif

int st_flag_long(const char *flag, const char *v, long lo, long hi, long *out) {
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return st_error_setc(ST_EXIT_USAGE, "%s %s: give a whole number from %ld to %ld", flag, v,
                         lo, hi);
  *out = x;
  return 0;
}

int st_flag_double(const char *flag, const char *v, double *out) {
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !isfinite(x))
    return st_error_setc(ST_EXIT_USAGE, "%s %s: give a finite number", flag, v);
  *out = x;
  return 0;
}

static int pick_backend(const char *device, const char *precision, st_loaded_model *m) {
  const int U = ST_EXIT_USAGE;
  if (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "auto"))
    return st_error_setc(U, "--device %s: give cpu, cuda or auto", device);
  if (strcmp(precision, "fp32") && strcmp(precision, "bf16") && strcmp(precision, "fp16") &&
      strcmp(precision, "auto"))
    return st_error_setc(U, "--precision %s: give fp32, bf16, fp16 or auto", precision);
  st_env env; /* one process on this node */
  memset(&env, 0, sizeof env);
  env.world = env.local_world = env.node_count = 1;
  if (gethostname(env.hostname, sizeof env.hostname) != 0) snprintf(env.hostname, 8, "local");
  env.hostname[sizeof env.hostname - 1] = 0;
  st_device dev;
  if (st_device_select(device, &env, &dev)) return -1;
  snprintf(m->device, sizeof m->device, "%s", dev.name);
  m->ops = st_ops_cpu();
  if (dev.index < 0) {
    if (strcmp(precision, "auto") && strcmp(precision, "fp32"))
      return st_error_setc(U, "--precision %s: the CPU backend is the fp32 reference; use "
                           "--precision fp32 (or auto) on the CPU, or --device cuda", precision);
    snprintf(m->precision, sizeof m->precision, "fp32");
    return 0;
  }
#ifdef SHARDTRAIN_HAVE_CUDA
  const char *p = strcmp(precision, "auto") == 0 ? "bf16" : precision;
  snprintf(m->precision, sizeof m->precision, "%s", p);
  m->ops = st_ops_cuda(strcmp(p, "bf16") == 0 ? ST_BF16 : strcmp(p, "fp16") == 0 ? ST_FP16
                                                                                : ST_FP32);
#endif
  return 0;
}

int st_load_model(const char *init, const char *device, const char *precision,
                  st_loaded_model *out) {
  memset(out, 0, sizeof *out);
  if (st_model_source_open(init, &out->src)) return st_error_prefix("--init");
  if (st_model_validate(&out->src.cfg)) {
    st_error_code(ST_EXIT_CHECKPOINT);
    return st_error_prefix("--init %s: its shape", init);
  }
  if (pick_backend(device, precision, out)) return -1;
  if (st_param_table_build(&out->src.cfg, &out->tab)) return -1;
  out->weights = malloc((size_t)out->tab.total * sizeof(float));
  if (!out->weights)
    return st_error_setc(ST_EXIT_OOM, "cannot allocate %.1f MiB of host memory for the weights of "
                         "%s", out->tab.total * 4.0 / 1048576.0, init);
  if (st_model_source_read(&out->src, &out->tab, out->weights))
    return st_error_prefix("--init");
  return 0;
}

void st_loaded_model_free(st_loaded_model *m) {
  free(m->weights);
  st_param_table_free(&m->tab);
  memset(m, 0, sizeof *m);
}

int st_loaded_model_tokenizer(const st_loaded_model *m, char *name, char *digest) {
  name[0] = digest[0] = 0;
  cJSON *j = m->src.config_json[0] ? cJSON_Parse(m->src.config_json) : NULL;
  const cJSON *k = cJSON_GetObjectItem(j, "tokenizer");
  const cJSON *kn = cJSON_GetObjectItem(k, "name"), *kd = cJSON_GetObjectItem(k, "digest");
  if (cJSON_IsString(kd) && kd->valuestring[0]) {
    snprintf(name, 32, "%s", cJSON_IsString(kn) ? kn->valuestring : "");
    snprintf(digest, 72, "%s", kd->valuestring);
  }
  cJSON_Delete(j);
  if (digest[0]) return 1;
  if (!m->src.tokenizer_dir[0]) return 0;
  st_tokenizer *t = st_tokenizer_load(m->src.tokenizer_dir);
  if (!t) return 0; /* unreadable files say nothing about the ids; sample reports them */
  snprintf(name, 32, "%s", st_tokenizer_name(t));
  snprintf(digest, 72, "%s", st_tokenizer_digest(t));
  st_tokenizer_free(t);
  return 1;
}

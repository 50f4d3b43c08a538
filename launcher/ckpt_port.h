/* ckpt_port.h - `shardtrain ckpt import` and `shardtrain ckpt export`: a
 * model brought in from (or taken out to) Hugging Face safetensors or an
 * llm.c model file. One process, no MPI. */
#ifndef ST_CKPT_PORT_H
#define ST_CKPT_PORT_H

/* shardtrain ckpt import SRC --out RUN_DIR
 *   SRC: any model source (io/model_source.h). Writes RUN_DIR/ckpt/step_00000000
 *   (step 0, zero Adam moments, world 1, ZeRO 0; the config JSON holds the
 *   shape, "imported_from" and the source's bos/eos/pad ids as
 *   "hf_special_ids") and RUN_DIR/tokenizer/ with the source's
 *   tokenizer files. An --out holding checkpoints is refused (exit 3).
 * argv[0] is "import". Returns the exit code. */
int st_cmd_ckpt_import(int argc, char **argv);

/* shardtrain ckpt export SRC --out PATH [--dtype fp32|bf16] [--format hf|llmc]
 *   hf: PATH is a directory (config.json, model.safetensors, tokenizer files);
 *   its config.json has the source's bos/eos/pad ids when it records them
 *   (st_model_source_special_ids); llmc: PATH is the llm.c model file.
 *   Written under a temporary name and renamed; an existing PATH is refused
 *   (exit 3).
 * argv[0] is "export". Returns the exit code. */
int st_cmd_ckpt_export(int argc, char **argv);

#endif

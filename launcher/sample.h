/* sample.h - `shardtrain sample`: continue a prompt with a model from any
 * source (run or step directory, Hugging Face directory, llm.c file), on
 * the CPU or a GPU, with a KV cache (rank/model/infer.h). One process, no MPI.
 * Exit codes: 2 bad flag, 3 unreadable model, 4 tokenizer/data. */
#ifndef ST_SAMPLE_H
#define ST_SAMPLE_H

/* argv[0] is "sample". Returns the exit code. */
int st_cmd_sample(int argc, char **argv);

#endif

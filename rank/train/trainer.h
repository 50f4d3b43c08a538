/* trainer.h - the training job of one rank: data, model, ZeRO reduction,
 * optimizer, validation, metrics and checkpoints, step after step. */
#ifndef ST_TRAINER_H
#define ST_TRAINER_H

#include "collectives/collectives.h"
#include "rank/train/run_config.h"
#include "launcher/env.h"

/* Run `shardtrain train` on this rank. Collective over comm. Returns an exit
 * code (ST_EXIT_*); on failure rank 0 has printed the reason. */
int st_train(st_run_config *rc, const st_env *env, st_comm *comm);

#endif

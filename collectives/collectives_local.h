/* collectives_local.h - the device collectives of a run with one rank,
 * without NCCL.
 *
 * With one rank every collective is the identity: an all-reduce or a
 * broadcast leaves the buffer as it is, a reduce-scatter or an all-gather
 * copies send into recv. NCCL would do the same through a communicator
 * whose init and first collectives keep device memory that a one-GPU run
 * has no use for (docs/memory.md, "The rest"), so train installs these on
 * one GPU instead (ST_NCCL_ONE_RANK=1 keeps NCCL, for comparison). Copies
 * are asynchronous on the legacy default stream, the compute stream: what
 * reads recv later on that stream, or on a stream that waits for an event
 * recorded on it (the checkpoint copy stream), sees them. wait and the
 * started operations' tags need nothing. */
#ifndef ST_COLLECTIVES_LOCAL_H
#define ST_COLLECTIVES_LOCAL_H

#include "collectives/collectives.h"

/* Replace c's device collectives (the ones on backend memory) with the
 * one-rank copies. c->world must be 1; its host collectives (broadcast,
 * barrier, scalar reductions) are left as they are. */
void st_comm_local_install(st_comm *c);

#endif

/* nccl_buffsize.h - NCCL_BUFFSIZE, read strictly. NCCL reads the variable
 * itself at init; the memory plan reserves its buffers from the same value,
 * so a value NCCL and we might read differently ("4MiB", "1.5", "abc", a
 * number past 2^63) is refused before either reads it. */
#ifndef ST_NCCL_BUFFSIZE_H
#define ST_NCCL_BUFFSIZE_H

/* The most NCCL_BUFFSIZE (and --nccl-buffsize) may be: 16 GiB per
 * connection, far past any useful value and far from overflow. */
#define ST_NCCL_BUFFSIZE_MAX (1LL << 34)

/* NCCL_BUFFSIZE from the environment, in bytes: 0 with *bytes = 0 when the
 * variable is unset, 0 with *bytes = the value when it is a whole number of
 * bytes in 1..ST_NCCL_BUFFSIZE_MAX written in digits; otherwise -1 with a
 * one-line message naming the variable (exit class ST_EXIT_USAGE). */
int st_nccl_buffsize_env(long long *bytes);

/* ST_NCCL_ONE_RANK from the environment: *on = 1 when a one-rank run makes
 * an NCCL communicator anyway ("1"), 0 when it does not (unset, "" or "0":
 * its device collectives are copies, collectives/collectives_local.h).
 * 0, or -1 for any other value with a one-line message naming the
 * variable (ST_EXIT_USAGE). train and plan both read it here. */
int st_nccl_one_rank_env(int *on);

#endif

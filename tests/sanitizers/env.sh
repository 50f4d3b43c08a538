# Sanitizer run-time options, sourced by scripts/sanitizers.sh and by the
# self-test tests/sanitizers/self_test.sh (so both run under the same ones).
# abort_on_error: a finding ends the process with SIGABRT (exit 134), never
# the exit 1 an error-path test expects. Leaks are checked at exit; Open
# MPI's are suppressed by library name (lsan.supp), which needs whole stacks
# (fast_unwind_on_malloc=0: Open MPI is built without frame pointers) and its
# plugins still mapped at exit (disable_dlclose), else their frames print as
# "<unknown module>" and no suppression can match. allocator_may_return_null:
# an allocation too big to make returns NULL, as glibc's does, so the out-of-
# memory paths (e2e_oom's injected allocation of 2^62 bytes) run as in
# production instead of ASan aborting at the request.
# intercept_tls_get_addr=0: GCC 12's runtime (Debian's) takes a dynamic TLS
# block that starts 16 bytes into a page for a pre-2.25 glibc header and
# reads the words before it as a block's address and size; LeakSanitizer's
# tracer then dies on that garbage at exit ("Tracer caught signal 11",
# "DTLS 11 at 0x3b6d-0x400004c6f" with log_threads=1), aborting a process
# that was exiting cleanly, wherever malloc happened to place the block
# (e2e_model_flags, e2e_import_finetune_ids, e2e_bench_collectives since
# 2026-12-02). Only dlopen'ed libraries (Open MPI's plugins) use dynamic TLS;
# ours is static TLS, which the leak check still scans.
_st_san_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:fast_unwind_on_malloc=0:allocator_may_return_null=1:intercept_tls_get_addr=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
export LSAN_OPTIONS="suppressions=$_st_san_dir/lsan.supp:print_suppressions=0"
export OMPI_MCA_mca_base_component_disable_dlclose=1
# Tests that repeat, in the sanitizer stage, work with no C path of its own
# read this to leave it out (e2e_tokenizer_parity's live oracles).
export ST_TEST_SANITIZER=1

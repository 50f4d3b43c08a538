/* no_dlclose.c - linked into every executable of the sanitizer build only
 * (CMakeLists.txt, SHARDTRAIN_SANITIZE), never into a release binary.
 *
 * Open MPI and PMIx unload their plugins (mca_*.so) in MPI_Init and
 * MPI_Finalize, even with mca_base_component_disable_dlclose set, while
 * allocations they made stay alive to the end. At exit LeakSanitizer
 * matches each of those leaks against tests/sanitizers/lsan.supp frame by
 * frame, and every frame in an unloaded plugin makes its symbolizer re-read
 * /proc/self/maps: about 3,000 re-reads for one `shardtrain train`, 1.2 s
 * of kernel time in a process that spent 1.4 s on everything else. An
 * executable's dlclose comes before libc's in the lookup order of every
 * library, so this one keeps every plugin mapped until the process ends,
 * and the leak check symbolizes each frame from the module list it has.
 * Returns 0 (success) like dlclose on a valid handle. */
int dlclose(void *handle);

int dlclose(void *handle) {
  (void)handle;
  return 0;
}

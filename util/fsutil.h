/* fsutil.h - small filesystem helpers: mkdir -p, existence, atomic text write,
 * whole-file reads. */
#ifndef ST_FSUTIL_H
#define ST_FSUTIL_H

/* Create dir and its parents (mode 0755). 0 or -1 with st_error set. */
int st_mkdir_p(const char *dir);
/* 1 if path exists (file or directory), else 0. */
int st_path_exists(const char *path);
int st_is_dir(const char *path);
/* Write text to path atomically: write path.tmp, fsync, rename over path,
 * fsync the directory. Readers see the old or the new content, never half. */
int st_write_file_atomic(const char *path, const char *text);
/* Read a whole small text file into buf (NUL-terminated, trailing newline
 * stripped). 0, or -1 with st_error set. */
int st_read_small_file(const char *path, char *buf, int cap);
/* Read a whole file of fewer than max bytes into a malloc'd, NUL-terminated
 * buffer the caller frees. NULL, with no st_error set, when it cannot be
 * opened, sized or read, holds max bytes or more, or memory runs out: the
 * caller's message says which file it was and what it should have been. */
char *st_read_text(const char *path, long max);
/* Remove a directory tree (used only on our own temporary step directories). */
int st_rm_rf(const char *dir);
/* fsync a directory so a rename inside it is durable. */
int st_fsync_dir(const char *dir);

#endif

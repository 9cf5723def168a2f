/*
 * Names and whole files through the registry (store.h), for the dataset
 * readers and writers, sluice_list/remove/copy and Python: a path is
 * whatever the store that claims it says (a local file, an s3:// object or
 * prefix, an http(s):// file or directory), never what its scheme is.
 */
#ifndef SL_NAMES_H
#define SL_NAMES_H

#include <sys/stat.h>

#include "core/core.h"

/*
 * names.c.  sl__fs_stat: a regular file (S_IFREG, its size) or a
 * directory (S_IFDIR: a local one, a prefix with keys below it, a web
 * directory); -errno.  sl__fs_list: the regular files directly in dir,
 * or with recursive every one below it (whole names, sorted, each and the
 * array malloc'd).  sl__fs_local: a path to open(2): path itself where its
 * store is of local files, else its cached copy of the version tag names
 * ("" : the file's version now, which tag then holds; another: -ESTALE).  sl__fs_is_local: 1 where
 * path's store is of local files (opened in place, written by ranges).
 */
/* A file's version tag as its store gives it (store.h's struct sl__entry), at most this long with its NUL. */
#define SL_TAG_MAX 256
SL_HIDDEN int sl__fs_stat(const char *path, struct stat *st);
SL_HIDDEN int sl__fs_list(const char *dir, int recursive, char ***names, unsigned *n);
SL_HIDDEN int sl__fs_local(const char *path, char tag[SL_TAG_MAX], char *local, size_t cap);
/*
 * The version path is now ("" where its store gives none): what pins it.
 * A local file's is its device, inode, mtime and size (sl__fs_local_tag
 * of a stat), checked by the dataset layer; a remote file's is given to
 * sl__fs_local.
 */
SL_HIDDEN int sl__fs_version(const char *path, char tag[SL_TAG_MAX]);
SL_HIDDEN void sl__fs_local_tag(const struct stat *st, char tag[SL_TAG_MAX]);
SL_HIDDEN int sl__fs_is_local(const char *path);
/* 1 where path's store names files by URLs (http(s)): a file's name in its path is percent-encoded. */
SL_HIDDEN int sl__fs_url_names(const char *path);
/* A remote name's trailing slashes cut (never a scheme's "//"): "s3://b/p/" and "s3://b/p" are one directory. */
SL_HIDDEN void sl__trim_slashes(char *path);
/*
 * What a poller (a copy's progress) may read of one whole-file transfer
 * underway: the file being written, whose blocks allocated so far are its
 * bytes so far (a download's pieces land in any order, in a file sized
 * first), and the bytes an upload has read of its file.  lock guards fd;
 * fd -1 when none is written.
 */
struct sl__fs_watch {
	pthread_mutex_t lock;
	int fd;
	_Atomic uint64_t sent;
};
/*
 * Whole files between a local path and any store.  sl__fs_upload: the
 * local file as path (the store's put); sl__fs_upload_fd the same of a
 * file already open (local names it in errors), w (or NULL) counting what
 * is read.  sl__fs_download: path as the file name in the directory dirfd
 * (AT_FDCWD: a path; shown: how errors name it), written under a
 * temporary name beside it (sl__tmp_open's: those of copies killed before
 * their rename are removed) and renamed there, both through dirfd (a link
 * swapped in above it afterwards changes nothing): it appears whole or
 * not at all; from src_fd (>= 0: a local file the caller opened) rather
 * than by path's store; *verified (or NULL): checked against the file's
 * checksum, sum_name (or NULL): which, or why none; w (or NULL) sees the
 * file written.  sl__fs_link: a symbolic link to target as name in dirfd,
 * made beside it and renamed there (a file or link there replaced, a
 * directory refused).  sl__fs_remove: the store's remove.
 * sl__fs_staging: a new empty directory in the cache's directory (on the
 * fast local disk), for files on their way to a remote store.
 */
SL_HIDDEN int sl__fs_upload(const char *local, const char *path);
SL_HIDDEN int sl__fs_upload_fd(int fd, const char *local, const char *path, struct sl__fs_watch *w);
SL_HIDDEN int sl__fs_download(const char *path, int src_fd, int dirfd, const char *name, const char *shown,
			       int *verified, char sum_name[48], struct sl__fs_watch *w);
SL_HIDDEN int sl__fs_link(const char *target, int dirfd, const char *name, const char *shown);
/*
 * Set by tests: called by sluice_copy between its listing and its first
 * file (a link swapped in there), and by sl__fs_download between the
 * temporary's last byte and its rename (a kill -9 there).
 */
SL_HIDDEN extern void (*sl__test_copy_listed)(void);
SL_HIDDEN extern void (*sl__test_part_written)(void);
SL_HIDDEN int sl__fs_remove(const char *path);
SL_HIDDEN int sl__fs_staging(char *out, size_t cap);

/*
 * cache.c: the local copies of remote files (datasets' files on any store
 * that is not of local files).  SLUICE_CACHE_DIR (default
 * $XDG_CACHE_HOME/sluice, else ~/.cache/sluice) holds at most
 * SLUICE_CACHE_LIMIT bytes (default half of its file system), least
 * recently used out.  A copy is keyed on its store, the store's endpoint
 * and the path; a fetch asks the store what the file is now (its size and
 * version tag) and uses the copy only where both match, else downloads it
 * again; the ranks of one machine share the directory, and each file is
 * downloaded once (a file lock is held through the check and the
 * download: the others wait, then find it).
 *
 * sl__cache_fetch: the local path of path's copy into local (cap bytes),
 * of the version tag names: "" the file's version now (tag then holds it),
 * another: that one, else -ESTALE.  A copy never changes once made.
 */
SL_HIDDEN int sl__cache_fetch(const char *path, char tag[SL_TAG_MAX], char *local, size_t cap);
/*
 * sl__cache_release: path's copy of version tag (if any) is the first the cache lets go
 * when it needs room (a file its reader is done with for now); its
 * readers keep reading it until then.
 */
SL_HIDDEN void sl__cache_release(const char *path, const char *tag);
/*
 * Fetches paths[0..n) (bytes[k] each) in order on a thread of its own, so
 * that readers find them there: the longest run from the first that fits
 * in the cache's limit beside each other; the rest waits for its first
 * reader.  sl__cache_prefetch_stop cancels what is left and waits; NULL is
 * a no-op.
 */
struct sl__prefetch;
SL_HIDDEN struct sl__prefetch *sl__cache_prefetch(char *const *paths, unsigned n, const uint64_t *bytes);
SL_HIDDEN void sl__cache_prefetch_stop(struct sl__prefetch *p);

#endif

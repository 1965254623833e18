/* An LD_PRELOAD shim that counts, and fails on demand, the libc calls a process makes on the
 * files below one folder (the store's root).
 *
 * Only calls on a path inside the armed root, or on a descriptor (or DIR stream) opened there,
 * are counted: the interpreter's own imports, pipes and logs are never touched. Armed through
 * the exported shim_* functions (called with ctypes):
 *
 *   shim_arm(root, k, err)  count calls from now on; the k-th (1-based) fails with errno `err`
 *                           without being made (close: made, then reported failed, as Linux
 *                           does), or, with err == -9, the process SIGKILLs itself at it.
 *                           k == 0: count only; every call is logged ("function path\n").
 *   shim_pause(on)          stop/restart counting (the caller's own writes into a staging folder)
 *   shim_disarm()           pass everything through again
 *   shim_count(), shim_fired(), shim_log()
 *
 * Calls from several threads (the direct writer's worker writes while the caller goes on) are
 * counted and logged one at a time, under one lock: the log always holds `count` lines.
 *
 * Written for glibc on Linux (the symbols CPython 3.11+ calls: open64, openat64, stat64,
 * fstatat64, ...); compiled at test time with `cc -shared -fPIC -O1 -o faultshim.so faultshim.c
 * -ldl -pthread`.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 65536
#define LOG_SIZE (1 << 20)

static char root[4096];
static size_t root_len;
static volatile int armed, paused, fired;
static long target, count;
static int fault;
static unsigned char inside_fd[MAX_FD];
static char logbuf[LOG_SIZE];
static size_t log_len;

#define REAL(ret, name, ...)                                                                     \
    static ret (*real_##name)(__VA_ARGS__);                                                      \
    if (!real_##name) *(void **)(&real_##name) = dlsym(RTLD_NEXT, #name)

void shim_arm(const char *r, long k, int err) {
    size_t n = strlen(r);
    if (n >= sizeof root) n = sizeof root - 1;
    memcpy(root, r, n);
    root[n] = 0;
    while (n > 1 && root[n - 1] == '/') root[--n] = 0;
    root_len = n;
    target = k;
    fault = err;
    count = 0;
    fired = 0;
    paused = 0;
    log_len = 0;
    logbuf[0] = 0;
    armed = 1;
}

void shim_disarm(void) { armed = 0; }
void shim_pause(int on) { paused = on; }
long shim_count(void) { return count; }
int shim_fired(void) { return fired; }
const char *shim_log(void) { return logbuf; }

static int fd_in(int fd) { return fd >= 0 && fd < MAX_FD && inside_fd[fd]; }

static void fd_mark(int fd, int in) {
    if (fd >= 0 && fd < MAX_FD) inside_fd[fd] = (unsigned char)in;
}

static int path_in(int dirfd, const char *path) {
    if (!path) return 0;
    if (path[0] == '/')
        return root_len && strncmp(path, root, root_len) == 0 &&
               (path[root_len] == 0 || path[root_len] == '/');
    if (dirfd == AT_FDCWD) return 0;
    return fd_in(dirfd);
}

static void log_call(const char *fn, const char *path) {
    if (target != 0) return;
    int n = snprintf(logbuf + log_len, LOG_SIZE - log_len, "%s %s\n", fn, path ? path : "");
    if (n > 0 && log_len + (size_t)n < LOG_SIZE) log_len += (size_t)n;
}

/* 0: make the call; else the errno to fail it with (after SIGKILL for err == -9). */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

static int hook(const char *fn, int in, const char *path) {
    if (!armed || paused || !in) return 0;
    pthread_mutex_lock(&hook_lock);
    long n = ++count;
    log_call(fn, path);
    pthread_mutex_unlock(&hook_lock);
    if (target == 0 || n != target) return 0;
    fired = 1;
    if (fault == -9) kill(getpid(), SIGKILL);
    return fault;
}

#define FAIL(ret)                                                                                \
    do {                                                                                         \
        errno = e;                                                                               \
        return ret;                                                                              \
    } while (0)

/* ---- opening ------------------------------------------------------------------------------ */
static int mode_of(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
}

#define OPEN_AT(name)                                                                            \
    int name(int dirfd, const char *path, int flags, ...) {                                      \
        va_list ap;                                                                              \
        va_start(ap, flags);                                                                     \
        int mode = mode_of(flags, ap);                                                           \
        va_end(ap);                                                                              \
        REAL(int, name, int, const char *, int, ...);                                            \
        int in = path_in(dirfd, path);                                                           \
        int e = hook(#name, in, path);                                                           \
        if (e) FAIL(-1);                                                                         \
        int fd = real_##name(dirfd, path, flags, mode);                                          \
        fd_mark(fd, in);                                                                         \
        return fd;                                                                               \
    }
OPEN_AT(openat)
OPEN_AT(openat64)

#define OPEN(name)                                                                               \
    int name(const char *path, int flags, ...) {                                                 \
        va_list ap;                                                                              \
        va_start(ap, flags);                                                                     \
        int mode = mode_of(flags, ap);                                                           \
        va_end(ap);                                                                              \
        REAL(int, name, const char *, int, ...);                                                 \
        int in = path_in(AT_FDCWD, path);                                                        \
        int e = hook(#name, in, path);                                                           \
        if (e) FAIL(-1);                                                                         \
        int fd = real_##name(path, flags, mode);                                                 \
        fd_mark(fd, in);                                                                         \
        return fd;                                                                               \
    }
OPEN(open)
OPEN(open64)

int close(int fd) {
    REAL(int, close, int);
    int in = fd_in(fd);
    int e = hook("close", in, "");
    fd_mark(fd, 0);
    int rc = real_close(fd);
    if (e) FAIL(-1);
    return rc;
}

static int dup_common(int old, int fd) {
    if (fd >= 0) fd_mark(fd, fd_in(old));
    return fd;
}

int dup(int old) {
    REAL(int, dup, int);
    return dup_common(old, real_dup(old));
}

int dup2(int old, int new) {
    REAL(int, dup2, int, int);
    return dup_common(old, real_dup2(old, new));
}

#define FCNTL(name)                                                                              \
    int name(int fd, int cmd, ...) {                                                             \
        va_list ap;                                                                              \
        va_start(ap, cmd);                                                                       \
        void *arg = va_arg(ap, void *);                                                          \
        va_end(ap);                                                                              \
        REAL(int, name, int, int, ...);                                                          \
        int rc = real_##name(fd, cmd, arg);                                                      \
        if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) dup_common(fd, rc);                        \
        return rc;                                                                               \
    }
FCNTL(fcntl)
FCNTL(fcntl64)

/* ---- data --------------------------------------------------------------------------------- */
ssize_t read(int fd, void *buf, size_t n) {
    REAL(ssize_t, read, int, void *, size_t);
    int e = hook("read", fd_in(fd), "");
    if (e) FAIL(-1);
    return real_read(fd, buf, n);
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(ssize_t, write, int, const void *, size_t);
    int e = hook("write", fd_in(fd), "");
    if (e) FAIL(-1);
    return real_write(fd, buf, n);
}

#define PIO(name, ret, bufty)                                                                    \
    ret name(int fd, bufty buf, size_t n, off_t off) {                                           \
        REAL(ret, name, int, bufty, size_t, off_t);                                              \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(fd, buf, n, off);                                                     \
    }
PIO(pread, ssize_t, void *)
PIO(pread64, ssize_t, void *)
PIO(pwrite, ssize_t, const void *)
PIO(pwrite64, ssize_t, const void *)

#define FD_CALL(name)                                                                            \
    int name(int fd) {                                                                           \
        REAL(int, name, int);                                                                    \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(fd);                                                                  \
    }
FD_CALL(fsync)
FD_CALL(fdatasync)

int flock(int fd, int op) {
    REAL(int, flock, int, int);
    int e = hook("flock", fd_in(fd), "");
    if (e) FAIL(-1);
    return real_flock(fd, op);
}

#define TRUNC(name)                                                                              \
    int name(int fd, off_t len) {                                                                \
        REAL(int, name, int, off_t);                                                             \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(fd, len);                                                             \
    }
TRUNC(ftruncate)
TRUNC(ftruncate64)

int sync_file_range(int fd, off_t off, off_t n, unsigned int flags) {
    REAL(int, sync_file_range, int, off_t, off_t, unsigned int);
    int e = hook("sync_file_range", fd_in(fd), "");
    if (e) FAIL(-1);
    return real_sync_file_range(fd, off, n, flags);
}

/* These two report the error as their result, not through errno. */
#define ADVISE(name)                                                                             \
    int name(int fd, off_t off, off_t n, int advice) {                                           \
        REAL(int, name, int, off_t, off_t, int);                                                 \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) return e;                                                                         \
        return real_##name(fd, off, n, advice);                                                  \
    }
ADVISE(posix_fadvise)
ADVISE(posix_fadvise64)

#define FALLOC(name)                                                                             \
    int name(int fd, off_t off, off_t n) {                                                       \
        REAL(int, name, int, off_t, off_t);                                                      \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) return e;                                                                         \
        return real_##name(fd, off, n);                                                          \
    }
FALLOC(posix_fallocate)
FALLOC(posix_fallocate64)

int fallocate(int fd, int mode, off_t off, off_t n) {
    REAL(int, fallocate, int, int, off_t, off_t);
    int e = hook("fallocate", fd_in(fd), "");
    if (e) FAIL(-1);
    return real_fallocate(fd, mode, off, n);
}

/* ---- metadata ----------------------------------------------------------------------------- */
#define STAT(name, st)                                                                           \
    int name(const char *path, struct st *buf) {                                                 \
        REAL(int, name, const char *, struct st *);                                              \
        int e = hook(#name, path_in(AT_FDCWD, path), path);                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(path, buf);                                                           \
    }
STAT(stat, stat)
STAT(stat64, stat64)
STAT(lstat, stat)
STAT(lstat64, stat64)

#define FSTAT(name, st)                                                                          \
    int name(int fd, struct st *buf) {                                                           \
        REAL(int, name, int, struct st *);                                                       \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(fd, buf);                                                             \
    }
FSTAT(fstat, stat)
FSTAT(fstat64, stat64)

#define FSTATAT(name, st)                                                                        \
    int name(int dirfd, const char *path, struct st *buf, int flags) {                           \
        REAL(int, name, int, const char *, struct st *, int);                                    \
        int in = (path && !path[0] && (flags & AT_EMPTY_PATH)) ? fd_in(dirfd)                    \
                                                                 : path_in(dirfd, path);         \
        int e = hook(#name, in, path);                                                           \
        if (e) FAIL(-1);                                                                         \
        return real_##name(dirfd, path, buf, flags);                                             \
    }
FSTATAT(fstatat, stat)
FSTATAT(fstatat64, stat64)

#define STATVFS(name, st)                                                                        \
    int name(const char *path, struct st *buf) {                                                 \
        REAL(int, name, const char *, struct st *);                                              \
        int e = hook(#name, path_in(AT_FDCWD, path), path);                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(path, buf);                                                           \
    }
STATVFS(statvfs, statvfs)
STATVFS(statvfs64, statvfs64)

#define FSTATVFS(name, st)                                                                       \
    int name(int fd, struct st *buf) {                                                           \
        REAL(int, name, int, struct st *);                                                       \
        int e = hook(#name, fd_in(fd), "");                                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(fd, buf);                                                             \
    }
FSTATVFS(fstatvfs, statvfs)
FSTATVFS(fstatvfs64, statvfs64)

int utimensat(int dirfd, const char *path, const struct timespec t[2], int flags) {
    REAL(int, utimensat, int, const char *, const struct timespec *, int);
    int e = hook("utimensat", path ? path_in(dirfd, path) : fd_in(dirfd), path);
    if (e) FAIL(-1);
    return real_utimensat(dirfd, path, t, flags);
}

int futimens(int fd, const struct timespec t[2]) {
    REAL(int, futimens, int, const struct timespec *);
    int e = hook("futimens", fd_in(fd), "");
    if (e) FAIL(-1);
    return real_futimens(fd, t);
}

/* ---- namespace ---------------------------------------------------------------------------- */
int rename(const char *a, const char *b) {
    REAL(int, rename, const char *, const char *);
    int e = hook("rename", path_in(AT_FDCWD, a) || path_in(AT_FDCWD, b), b);
    if (e) FAIL(-1);
    return real_rename(a, b);
}

int renameat(int da, const char *a, int db, const char *b) {
    REAL(int, renameat, int, const char *, int, const char *);
    int e = hook("renameat", path_in(da, a) || path_in(db, b), b);
    if (e) FAIL(-1);
    return real_renameat(da, a, db, b);
}

int renameat2(int da, const char *a, int db, const char *b, unsigned int flags) {
    REAL(int, renameat2, int, const char *, int, const char *, unsigned int);
    int e = hook("renameat2", path_in(da, a) || path_in(db, b), b);
    if (e) FAIL(-1);
    return real_renameat2(da, a, db, b, flags);
}

int link(const char *a, const char *b) {
    REAL(int, link, const char *, const char *);
    int e = hook("link", path_in(AT_FDCWD, a) || path_in(AT_FDCWD, b), b);
    if (e) FAIL(-1);
    return real_link(a, b);
}

int linkat(int da, const char *a, int db, const char *b, int flags) {
    REAL(int, linkat, int, const char *, int, const char *, int);
    int e = hook("linkat", path_in(da, a) || path_in(db, b), b);
    if (e) FAIL(-1);
    return real_linkat(da, a, db, b, flags);
}

#define PATH_CALL(name)                                                                          \
    int name(const char *path) {                                                                 \
        REAL(int, name, const char *);                                                           \
        int e = hook(#name, path_in(AT_FDCWD, path), path);                                      \
        if (e) FAIL(-1);                                                                         \
        return real_##name(path);                                                                \
    }
PATH_CALL(unlink)
PATH_CALL(rmdir)

int unlinkat(int dirfd, const char *path, int flags) {
    REAL(int, unlinkat, int, const char *, int);
    int e = hook("unlinkat", path_in(dirfd, path), path);
    if (e) FAIL(-1);
    return real_unlinkat(dirfd, path, flags);
}

int mkdir(const char *path, mode_t mode) {
    REAL(int, mkdir, const char *, mode_t);
    int e = hook("mkdir", path_in(AT_FDCWD, path), path);
    if (e) FAIL(-1);
    return real_mkdir(path, mode);
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
    REAL(int, mkdirat, int, const char *, mode_t);
    int e = hook("mkdirat", path_in(dirfd, path), path);
    if (e) FAIL(-1);
    return real_mkdirat(dirfd, path, mode);
}

/* ---- listing ------------------------------------------------------------------------------ */
DIR *opendir(const char *path) {
    REAL(DIR *, opendir, const char *);
    int in = path_in(AT_FDCWD, path);
    int e = hook("opendir", in, path);
    if (e) FAIL(NULL);
    DIR *d = real_opendir(path);
    if (d) fd_mark(dirfd(d), in);
    return d;
}

DIR *fdopendir(int fd) {
    REAL(DIR *, fdopendir, int);
    int e = hook("fdopendir", fd_in(fd), "");
    if (e) FAIL(NULL);
    return real_fdopendir(fd);
}

#define READDIR(name, ent)                                                                       \
    struct ent *name(DIR *d) {                                                                   \
        REAL(struct ent *, name, DIR *);                                                         \
        int e = hook(#name, d && fd_in(dirfd(d)), "");                                           \
        if (e) FAIL(NULL);                                                                       \
        return real_##name(d);                                                                   \
    }
READDIR(readdir, dirent)
READDIR(readdir64, dirent64)

int closedir(DIR *d) {
    REAL(int, closedir, DIR *);
    if (d) fd_mark(dirfd(d), 0);
    return real_closedir(d);
}

/* LD_PRELOAD shim: appends every byte a process writes to a socket to
 * $CCDDP_WIRE_DIR/wire.<pid>, as an attacker on the host (or the wire) would see it.
 * Test-only; built by tests/wire_util.py with the system C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static ssize_t (*real_write)(int, const void *, size_t);

static int is_socket(int fd) {
    struct stat st;
    return fd >= 0 && fd != log_fd && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

static void record(const void *buf, size_t n) {
    if (n == 0) return;
    pthread_mutex_lock(&lock);
    if (!real_write) real_write = dlsym(RTLD_NEXT, "write");
    if (log_fd < 0) {
        const char *dir = getenv("CCDDP_WIRE_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/wire.%d", dir ? dir : "/tmp", (int)getpid());
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    }
    const char *p = buf;
    while (log_fd >= 0 && n > 0) {
        ssize_t w = real_write(log_fd, p, n);
        if (w <= 0) break;
        p += w;
        n -= (size_t)w;
    }
    pthread_mutex_unlock(&lock);
}

static void record_iov(const struct iovec *iov, int cnt, ssize_t total) {
    for (int i = 0; i < cnt && total > 0; i++) {
        size_t n = iov[i].iov_len < (size_t)total ? iov[i].iov_len : (size_t)total;
        record(iov[i].iov_base, n);
        total -= (ssize_t)n;
    }
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*f)(int, const void *, size_t);
    if (!f) f = dlsym(RTLD_NEXT, "write");
    ssize_t r = f(fd, buf, n);
    int saved = errno;
    if (r > 0 && is_socket(fd)) record(buf, (size_t)r);
    errno = saved;
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    static ssize_t (*f)(int, const struct iovec *, int);
    if (!f) f = dlsym(RTLD_NEXT, "writev");
    ssize_t r = f(fd, iov, cnt);
    int saved = errno;
    if (r > 0 && is_socket(fd)) record_iov(iov, cnt, r);
    errno = saved;
    return r;
}

ssize_t send(int fd, const void *buf, size_t n, int flags) {
    static ssize_t (*f)(int, const void *, size_t, int);
    if (!f) f = dlsym(RTLD_NEXT, "send");
    ssize_t r = f(fd, buf, n, flags);
    int saved = errno;
    if (r > 0) record(buf, (size_t)r);
    errno = saved;
    return r;
}

ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *a, socklen_t al) {
    static ssize_t (*f)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
    if (!f) f = dlsym(RTLD_NEXT, "sendto");
    ssize_t r = f(fd, buf, n, flags, a, al);
    int saved = errno;
    if (r > 0) record(buf, (size_t)r);
    errno = saved;
    return r;
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
    static ssize_t (*f)(int, const struct msghdr *, int);
    if (!f) f = dlsym(RTLD_NEXT, "sendmsg");
    ssize_t r = f(fd, m, flags);
    int saved = errno;
    if (r > 0) record_iov(m->msg_iov, (int)m->msg_iovlen, r);
    errno = saved;
    return r;
}

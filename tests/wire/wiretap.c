/* LD_PRELOAD shim: appends every byte a process writes to a socket to
 * $CCDDP_WIRE_DIR/wire.<pid>, as an attacker on the host (or the wire) would see it.
 * With CCDDP_WIRE_BY_PEER set, each TCP connection's bytes go to
 * wire.<pid>.<peer port> instead, so a test can tell where they went.
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
#include <netinet/in.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static ssize_t (*real_write)(int, const void *, size_t);

static int is_socket(int fd) {
    struct stat st;
    return fd >= 0 && fd != log_fd && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

static int peer_port(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getpeername(fd, (struct sockaddr *)&a, &len) != 0) return -1;
    if (a.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}

static void append(int out, const char *p, size_t n) {
    while (out >= 0 && n > 0) {
        ssize_t w = real_write(out, p, n);
        if (w <= 0) break;
        p += w;
        n -= (size_t)w;
    }
}

static void record(int fd, const void *buf, size_t n) {
    if (n == 0) return;
    pthread_mutex_lock(&lock);
    if (!real_write) real_write = dlsym(RTLD_NEXT, "write");
    const char *dir = getenv("CCDDP_WIRE_DIR");
    char path[4096];
    if (getenv("CCDDP_WIRE_BY_PEER")) {
        snprintf(path, sizeof path, "%s/wire.%d.%d", dir ? dir : "/tmp", (int)getpid(), peer_port(fd));
        int out = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        append(out, buf, n);
        if (out >= 0) close(out);
    } else {
        if (log_fd < 0) {
            snprintf(path, sizeof path, "%s/wire.%d", dir ? dir : "/tmp", (int)getpid());
            log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        }
        append(log_fd, buf, n);
    }
    pthread_mutex_unlock(&lock);
}

static void record_iov(int fd, const struct iovec *iov, int cnt, ssize_t total) {
    for (int i = 0; i < cnt && total > 0; i++) {
        size_t n = iov[i].iov_len < (size_t)total ? iov[i].iov_len : (size_t)total;
        record(fd, iov[i].iov_base, n);
        total -= (ssize_t)n;
    }
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*f)(int, const void *, size_t);
    if (!f) f = dlsym(RTLD_NEXT, "write");
    ssize_t r = f(fd, buf, n);
    int saved = errno;
    if (r > 0 && is_socket(fd)) record(fd, buf, (size_t)r);
    errno = saved;
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    static ssize_t (*f)(int, const struct iovec *, int);
    if (!f) f = dlsym(RTLD_NEXT, "writev");
    ssize_t r = f(fd, iov, cnt);
    int saved = errno;
    if (r > 0 && is_socket(fd)) record_iov(fd, iov, cnt, r);
    errno = saved;
    return r;
}

ssize_t send(int fd, const void *buf, size_t n, int flags) {
    static ssize_t (*f)(int, const void *, size_t, int);
    if (!f) f = dlsym(RTLD_NEXT, "send");
    ssize_t r = f(fd, buf, n, flags);
    int saved = errno;
    if (r > 0) record(fd, buf, (size_t)r);
    errno = saved;
    return r;
}

ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *a, socklen_t al) {
    static ssize_t (*f)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
    if (!f) f = dlsym(RTLD_NEXT, "sendto");
    ssize_t r = f(fd, buf, n, flags, a, al);
    int saved = errno;
    if (r > 0) record(fd, buf, (size_t)r);
    errno = saved;
    return r;
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
    static ssize_t (*f)(int, const struct msghdr *, int);
    if (!f) f = dlsym(RTLD_NEXT, "sendmsg");
    ssize_t r = f(fd, m, flags);
    int saved = errno;
    if (r > 0) record_iov(fd, m->msg_iov, (int)m->msg_iovlen, r);
    errno = saved;
    return r;
}

/* flood NAME: loops connect() to the abstract Unix socket @NAME for ever,
 * closing each connection at once: a function flooding the daemon's
 * socket. Every 1024 attempts it rewrites /tmp/flood with its counts,
 * "attempts=N connected=C refused=R other=O errno=E" (R: EPERM, the
 * kernel's refusal; E: the last failure's errno), for the test to read
 * through /proc/PID/root. Linked statically (tests/support/mod.rs). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: flood NAME\n");
        return 2;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(argv[1]);
    if (len + 1 > sizeof addr.sun_path) {
        fprintf(stderr, "name too long\n");
        return 2;
    }
    memcpy(addr.sun_path + 1, argv[1], len);
    socklen_t addr_len = offsetof(struct sockaddr_un, sun_path) + 1 + len;
    unsigned long attempts = 0, connected = 0, refused = 0, other = 0;
    int last = 0;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd >= 0) {
            if (connect(fd, (struct sockaddr *)&addr, addr_len) == 0)
                connected++;
            else if (errno == EPERM)
                refused++, last = errno;
            else
                other++, last = errno;
            close(fd);
        } else {
            other++, last = errno;
        }
        if (++attempts % 1024 == 0) {
            char line[160];
            int n = snprintf(line, sizeof line, "attempts=%lu connected=%lu refused=%lu other=%lu errno=%d\n",
                             attempts, connected, refused, other, last);
            int out = open("/tmp/flood.new", O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (out >= 0) {
                if (write(out, line, n) == n)
                    rename("/tmp/flood.new", "/tmp/flood");
                close(out);
            }
        }
    }
}

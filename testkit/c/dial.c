/* dial NAME: connects to the abstract Unix socket @NAME and says what came
 * back: "served" when the server spoke first (an HTTP/2 server sends its
 * SETTINGS at once), "refused" when it closed the connection without a
 * byte, "unreachable: ..." when connect failed. A test function carries it
 * (busybox has no client for abstract sockets); linked statically. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: dial NAME\n");
        return 2;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(argv[1]);
    if (len + 1 > sizeof addr.sun_path) {
        fprintf(stderr, "name too long\n");
        return 2;
    }
    memcpy(addr.sun_path + 1, argv[1], len);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, offsetof(struct sockaddr_un, sun_path) + 1 + len) < 0) {
        printf("unreachable: %s\n", strerror(errno));
        return 0;
    }
    struct timeval timeout = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    char byte;
    ssize_t n = read(fd, &byte, 1);
    if (n > 0)
        printf("served\n");
    else if (n == 0 || errno == ECONNRESET)
        printf("refused\n");
    else
        printf("no answer: %s\n", strerror(errno));
    return 0;
}

/* The C side of `firsthop bench relay`, built by the bench with `cc -O2` at run time.
 *
 * One binary, three roles (the bench is the only caller; arguments are positional):
 *
 *   fwd  HOST CPU DEST_HOST DEST_PORT
 *       The reference forwarder: the relay's job shape for one fixed destination, in the
 *       plainest C. Client -> dest: recvfrom on the public socket, write the client address
 *       into a PROXY v2 header (ARCHITECTURE §3) that sits in front of the receive buffer,
 *       one sendto from the internal socket. Dest -> client: recvfrom on the internal
 *       socket, drop it unless it came from DEST, sendto the header's dst address from the
 *       public socket with the 28 header bytes stripped. Same loop shape as the relay's data
 *       plane: one epoll set, each ready socket drained until EAGAIN (at most BATCH), so the
 *       syscalls per packet match (one recv, one send) and so do the per-burst ones.
 *       Prints "ready PUBLIC_PORT INTERNAL_PORT", then runs until killed.
 *
 *   sink HOST CPU
 *       The destination (a transceiver's socket): answers the first STUN datagram of each
 *       flow framed (src and dst swapped) so the forwarder marks the flow established, and
 *       counts RTP-shaped datagrams with their one-way latency. Latency is taken twice:
 *       "sock" = the kernel's receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME; on
 *       loopback it is taken inside the forwarder's sendto) minus the sender's realtime
 *       stamp, which leaves out the sink's own scheduling; "app" = CLOCK_MONOTONIC after
 *       recvmmsg returns minus the sender's monotonic stamp. Prints "ready PORT"; reads
 *       commands on stdin: "reset" (answers "ok"), "report" (one JSON line); EOF ends it.
 *
 *   load SRC_NET CPU TARGET_HOST TARGET_PORT REQUESTS RATE SECONDS TICK_US FRAME
 *       The load generator: one UDP socket per flow, bound to SRC_NET.<i/250>.<i%250+1>
 *       (distinct loopback addresses, as distinct clients are). REQUESTS holds one STUN
 *       Binding request per flow (u16 big-endian length + bytes). Each flow sends its request
 *       (resent every 200 ms) until something comes back on its socket; then "ready FLOWS"
 *       is printed and the generator waits for a line on stdin. Then it sends 160-byte
 *       RTP-shaped packets round-robin over the flows at RATE packets/s for SECONDS, paced
 *       per TICK_US: each tick sends what is due since the start (so a late tick catches
 *       up), then sleeps to the next tick. Every packet is stamped right before its send.
 *       FRAME=1 prepends the PROXY v2 header itself (the "direct" path: no forwarder).
 *       Prints one JSON line with what it sent.
 *
 * CPU: any role given CPU >= 0 pins itself there first. Every role dies with the bench
 * (PR_SET_PDEATHSIG).
 *
 * RTP-shaped payload (160 bytes): 0x80, PT 111, seq16, ts32, ssrc32 = flow id (RFC 3550
 * §5.1 layout, so RFC 7983 demultiplexing sees RTP), then at offset 12, in host byte order:
 * u64 monotonic ns, u64 realtime ns, u32 sequence, u32 flow id.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HDR 28 /* PROXY v2 header, IPv4 DGRAM, no TLVs */
#define MAXDGRAM 2048
#define BATCH 256 /* as services/relay/dataplane.py */
#define SOCKBUF (4 * 1024 * 1024)
#define PAYLOAD 160
#define STAMP_AT 12
#define HIST_US 1000000 /* latency histogram: 1 us bins up to 1 s */
#define MAX_FLOWS 65536
#define SINK_BATCH 64

static const uint8_t SIG[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void pin(int cpu) {
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        perror("sched_setaffinity"); /* not fatal: the bench reports what it asked for */
}

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct sockaddr_in addr_of(const char *host, int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        fprintf(stderr, "bad IPv4 address: %s\n", host);
        exit(2);
    }
    return a;
}

static int udp_socket(struct sockaddr_in *bind_to, int big_buffers) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket");
    if (big_buffers) { /* as the relay does: *BUFFORCE when permitted */
        int size = SOCKBUF;
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    }
    if (bind(fd, (struct sockaddr *)bind_to, sizeof *bind_to) != 0)
        die("bind");
    socklen_t len = sizeof *bind_to;
    getsockname(fd, (struct sockaddr *)bind_to, &len);
    return fd;
}

static void nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        die("O_NONBLOCK");
}

static void put_header(uint8_t *h, const struct sockaddr_in *src, const struct sockaddr_in *dst) {
    memcpy(h, SIG, 12);
    h[12] = 0x21; /* version 2, PROXY */
    h[13] = 0x12; /* AF_INET, DGRAM */
    h[14] = 0;
    h[15] = 12;
    memcpy(h + 16, &src->sin_addr, 4);
    memcpy(h + 20, &dst->sin_addr, 4);
    memcpy(h + 24, &src->sin_port, 2);
    memcpy(h + 26, &dst->sin_port, 2);
}

/* -- fwd ---------------------------------------------------------------------------------- */

static int run_fwd(char **argv) {
    struct sockaddr_in pub_addr = addr_of(argv[0], 0), int_addr = addr_of(argv[0], 0);
    struct sockaddr_in dest = addr_of(argv[2], atoi(argv[3]));
    int pub = udp_socket(&pub_addr, 1), internal = udp_socket(&int_addr, 1);
    nonblocking(pub);
    nonblocking(internal);
    printf("ready %d %d\n", ntohs(pub_addr.sin_port), ntohs(int_addr.sin_port));
    fflush(stdout);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = pub;
    epoll_ctl(ep, EPOLL_CTL_ADD, pub, &ev);
    ev.data.fd = internal;
    epoll_ctl(ep, EPOLL_CTL_ADD, internal, &ev);

    /* Upstream frames are built in place: the header's constant part and dst (= our public
     * address) are written once; each datagram lands right after it and only the client
     * address is filled in (the relay likewise builds a flow's header once). */
    static uint8_t up[HDR + MAXDGRAM], down[MAXDGRAM];
    struct sockaddr_in none = {.sin_family = AF_INET};
    put_header(up, &none, &pub_addr);

    struct epoll_event events[2];
    for (;;) {
        int n = epoll_wait(ep, events, 2, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int e = 0; e < n; e++) {
            if (events[e].data.fd == pub) {
                for (int i = 0; i < BATCH; i++) {
                    struct sockaddr_in client;
                    socklen_t len = sizeof client;
                    ssize_t r = recvfrom(pub, up + HDR, MAXDGRAM, 0, (struct sockaddr *)&client,
                                         &len);
                    if (r < 0) {
                        if (errno == EAGAIN || errno == EWOULDBLOCK)
                            break;
                        continue;
                    }
                    memcpy(up + 16, &client.sin_addr, 4);
                    memcpy(up + 24, &client.sin_port, 2);
                    sendto(internal, up, (size_t)r + HDR, 0, (struct sockaddr *)&dest,
                           sizeof dest);
                }
            } else {
                for (int i = 0; i < BATCH; i++) {
                    struct sockaddr_in from;
                    socklen_t len = sizeof from;
                    ssize_t r = recvfrom(internal, down, sizeof down, 0, (struct sockaddr *)&from,
                                         &len);
                    if (r < 0) {
                        if (errno == EAGAIN || errno == EWOULDBLOCK)
                            break;
                        continue;
                    }
                    if (r < HDR || down[13] != 0x12 || from.sin_port != dest.sin_port ||
                        from.sin_addr.s_addr != dest.sin_addr.s_addr)
                        continue; /* never a reflector: only DEST's frames go out */
                    struct sockaddr_in client = {.sin_family = AF_INET};
                    memcpy(&client.sin_addr, down + 20, 4);
                    memcpy(&client.sin_port, down + 26, 2);
                    sendto(pub, down + HDR, (size_t)r - HDR, 0, (struct sockaddr *)&client,
                           sizeof client);
                }
            }
        }
    }
    return 0; /* not reached: the bench kills the forwarder */
}

/* -- sink --------------------------------------------------------------------------------- */

struct latency {
    uint32_t *bins;
    uint64_t count, negative, over;
    double sum_us, max_us;
};

static void lat_reset(struct latency *l) {
    memset(l->bins, 0, HIST_US * sizeof *l->bins);
    l->count = l->negative = l->over = 0;
    l->sum_us = l->max_us = 0;
}

static void lat_add(struct latency *l, int64_t ns) {
    if (ns < 0) {
        l->negative++;
        ns = 0;
    }
    double us = (double)ns / 1000.0;
    uint64_t bin = (uint64_t)ns / 1000;
    if (bin >= HIST_US) {
        l->over++;
        bin = HIST_US - 1;
    }
    l->bins[bin]++;
    l->count++;
    l->sum_us += us;
    if (us > l->max_us)
        l->max_us = us;
}

static double lat_quantile(const struct latency *l, double q) {
    if (l->count == 0)
        return -1;
    uint64_t want = (uint64_t)(q * (double)l->count), seen = 0;
    if (want >= l->count)
        want = l->count - 1;
    for (uint64_t i = 0; i < HIST_US; i++) {
        seen += l->bins[i];
        if (seen > want)
            return (double)i + 0.5; /* mid-bin, microseconds */
    }
    return (double)HIST_US;
}

static void lat_json(const char *name, const struct latency *l) {
    printf("\"%s\": {\"count\": %llu, \"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f, "
           "\"p999\": %.1f, \"max\": %.1f, \"mean\": %.1f, \"negative\": %llu, \"over_1s\": %llu}",
           name, (unsigned long long)l->count, lat_quantile(l, 0.5), lat_quantile(l, 0.9),
           lat_quantile(l, 0.99), lat_quantile(l, 0.999), l->max_us,
           l->count ? l->sum_us / (double)l->count : -1.0, (unsigned long long)l->negative,
           (unsigned long long)l->over);
}

struct sink_state {
    uint64_t rtp, stun, other, reordered, no_timestamp, flows_seen;
    struct latency sock, app;
    uint32_t *last_seq;
    uint8_t *seen;
};

static void sink_reset(struct sink_state *s) {
    s->rtp = s->stun = s->other = s->reordered = s->no_timestamp = s->flows_seen = 0;
    lat_reset(&s->sock);
    lat_reset(&s->app);
    memset(s->seen, 0, MAX_FLOWS);
}

static void sink_report(const struct sink_state *s) {
    printf("{\"rtp\": %llu, \"stun\": %llu, \"other\": %llu, \"flows\": %llu, "
           "\"reordered\": %llu, \"no_timestamp\": %llu, ",
           (unsigned long long)s->rtp, (unsigned long long)s->stun, (unsigned long long)s->other,
           (unsigned long long)s->flows_seen, (unsigned long long)s->reordered,
           (unsigned long long)s->no_timestamp);
    lat_json("latency_sock_us", &s->sock);
    printf(", ");
    lat_json("latency_app_us", &s->app);
    printf("}\n");
    fflush(stdout);
}

/* A STUN request (RFC 7983: first byte < 4) gets a framed Binding success response with the
 * same transaction id and no attributes: header src and dst swapped, back to the sender. */
static void sink_answer(int fd, const uint8_t *d, const struct sockaddr_in *from) {
    uint8_t reply[HDR + 20];
    memcpy(reply, d, 16);
    memcpy(reply + 16, d + 20, 4); /* src = their dst */
    memcpy(reply + 20, d + 16, 4); /* dst = their src */
    memcpy(reply + 24, d + 26, 2);
    memcpy(reply + 26, d + 24, 2);
    reply[HDR] = 0x01;
    reply[HDR + 1] = 0x01;
    reply[HDR + 2] = reply[HDR + 3] = 0;
    memcpy(reply + HDR + 4, d + HDR + 4, 16);
    sendto(fd, reply, sizeof reply, 0, (const struct sockaddr *)from, sizeof *from);
}

static void sink_count(struct sink_state *s, const uint8_t *p, struct msghdr *msg, uint64_t mono) {
    uint64_t sent_mono, sent_real;
    uint32_t seq, flow;
    memcpy(&sent_mono, p + STAMP_AT, 8);
    memcpy(&sent_real, p + STAMP_AT + 8, 8);
    memcpy(&seq, p + STAMP_AT + 16, 4);
    memcpy(&flow, p + STAMP_AT + 20, 4);
    s->rtp++;
    lat_add(&s->app, (int64_t)(mono - sent_mono));
    int stamped = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            uint64_t k = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            lat_add(&s->sock, (int64_t)(k - sent_real));
            stamped = 1;
        }
    }
    if (!stamped)
        s->no_timestamp++;
    if (flow < MAX_FLOWS) {
        if (!s->seen[flow]) {
            s->seen[flow] = 1;
            s->flows_seen++;
        } else if (seq <= s->last_seq[flow]) {
            s->reordered++;
            return;
        }
        s->last_seq[flow] = seq;
    }
}

static int run_sink(char **argv) {
    struct sockaddr_in me = addr_of(argv[0], 0);
    int fd = udp_socket(&me, 1);
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) != 0)
        die("SO_TIMESTAMPNS");
    printf("ready %d\n", ntohs(me.sin_port));
    fflush(stdout);

    struct sink_state s;
    s.sock.bins = calloc(HIST_US, sizeof(uint32_t));
    s.app.bins = calloc(HIST_US, sizeof(uint32_t));
    s.last_seq = calloc(MAX_FLOWS, sizeof(uint32_t));
    s.seen = calloc(MAX_FLOWS, 1);
    if (!s.sock.bins || !s.app.bins || !s.last_seq || !s.seen)
        die("calloc");
    sink_reset(&s);

    static uint8_t bufs[SINK_BATCH][MAXDGRAM];
    static uint8_t ctrl[SINK_BATCH][CMSG_SPACE(sizeof(struct timespec))];
    static struct sockaddr_in from[SINK_BATCH];
    struct mmsghdr msgs[SINK_BATCH];
    struct iovec iov[SINK_BATCH];
    char cmd[256];
    size_t cmd_len = 0;
    struct pollfd pfd[2] = {{.fd = fd, .events = POLLIN}, {.fd = 0, .events = POLLIN}};

    for (;;) {
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        while (pfd[0].revents & POLLIN) {
            for (int i = 0; i < SINK_BATCH; i++) {
                iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = MAXDGRAM};
                msgs[i].msg_hdr = (struct msghdr){
                    .msg_name = &from[i],
                    .msg_namelen = sizeof from[i],
                    .msg_iov = &iov[i],
                    .msg_iovlen = 1,
                    .msg_control = ctrl[i],
                    .msg_controllen = sizeof ctrl[i],
                };
            }
            int got = recvmmsg(fd, msgs, SINK_BATCH, MSG_DONTWAIT, NULL);
            if (got <= 0)
                break;
            uint64_t mono = now_ns(CLOCK_MONOTONIC);
            for (int i = 0; i < got; i++) {
                const uint8_t *d = bufs[i];
                size_t len = msgs[i].msg_len;
                if (len < HDR + 1 || memcmp(d, SIG, 12) != 0 || d[13] != 0x12)
                    s.other++;
                else if (d[HDR] < 4 && len >= HDR + 20) {
                    sink_answer(fd, d, &from[i]);
                    s.stun++;
                } else if (d[HDR] == 0x80 && len >= HDR + STAMP_AT + 24)
                    sink_count(&s, d + HDR, &msgs[i].msg_hdr, mono);
                else
                    s.other++;
            }
        }
        if (pfd[1].revents & (POLLIN | POLLHUP)) {
            ssize_t r = read(0, cmd + cmd_len, sizeof cmd - 1 - cmd_len);
            if (r <= 0)
                return 0; /* EOF: the bench is done with us */
            cmd_len += (size_t)r;
            char *nl;
            while ((nl = memchr(cmd, '\n', cmd_len)) != NULL) {
                *nl = 0;
                if (strcmp(cmd, "reset") == 0) {
                    sink_reset(&s);
                    printf("ok\n");
                    fflush(stdout);
                } else if (strcmp(cmd, "report") == 0) {
                    sink_report(&s);
                }
                size_t used = (size_t)(nl - cmd) + 1;
                memmove(cmd, nl + 1, cmd_len - used);
                cmd_len -= used;
            }
            if (cmd_len == sizeof cmd - 1)
                cmd_len = 0; /* a line that long is not a command */
        }
    }
}

/* -- load --------------------------------------------------------------------------------- */

static uint8_t *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc((size_t)n + 1);
    if (!data || fread(data, 1, (size_t)n, f) != (size_t)n)
        die("read requests");
    fclose(f);
    *size = (size_t)n;
    return data;
}

static int run_load(char **argv) {
    const char *src_net = argv[0];
    struct sockaddr_in target = addr_of(argv[2], atoi(argv[3]));
    size_t file_size;
    uint8_t *requests = read_file(argv[4], &file_size);
    double rate = atof(argv[5]), seconds = atof(argv[6]);
    uint64_t tick_ns = (uint64_t)atoll(argv[7]) * 1000ull;
    int frame = atoi(argv[8]);
    if (tick_ns == 0)
        tick_ns = 1000000;

    /* requests: u16 BE length + bytes, one per flow */
    int flows = 0;
    static size_t offsets[MAX_FLOWS], lengths[MAX_FLOWS];
    for (size_t at = 0; at + 2 <= file_size && flows < MAX_FLOWS; flows++) {
        size_t len = ((size_t)requests[at] << 8) | requests[at + 1];
        if (at + 2 + len > file_size)
            break;
        offsets[flows] = at + 2;
        lengths[flows] = len;
        at += 2 + len;
    }
    if (flows == 0) {
        fprintf(stderr, "no requests in %s\n", argv[4]);
        return 2;
    }
    int *fds = calloc((size_t)flows, sizeof(int));
    struct sockaddr_in *local = calloc((size_t)flows, sizeof *local);
    uint8_t(*pkt)[HDR + PAYLOAD] = calloc((size_t)flows, sizeof *pkt);
    uint32_t *seq = calloc((size_t)flows, sizeof(uint32_t));
    uint8_t *answered = calloc((size_t)flows, 1);
    struct pollfd *pfds = calloc((size_t)flows, sizeof *pfds);
    if (!fds || !local || !pkt || !seq || !answered || !pfds)
        die("calloc");
    size_t off = frame ? HDR : 0, pkt_len = off + PAYLOAD;
    for (int i = 0; i < flows; i++) {
        char host[64];
        snprintf(host, sizeof host, "%s.%d.%d", src_net, i / 250, i % 250 + 1);
        local[i] = addr_of(host, 0);
        fds[i] = udp_socket(&local[i], 0);
        if (connect(fds[i], (struct sockaddr *)&target, sizeof target) != 0)
            die("connect");
        pfds[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        uint8_t *p = pkt[i];
        if (frame)
            put_header(p, &local[i], &target);
        p[off] = 0x80;
        p[off + 1] = 111;
        uint32_t ssrc = htonl((uint32_t)i);
        memcpy(p + off + 8, &ssrc, 4);
    }

    /* handshake: each flow's Binding request until its socket hears back */
    uint64_t t_hs = now_ns(CLOCK_MONOTONIC), last_round = 0;
    int done = 0;
    static uint8_t frame_buf[HDR + MAXDGRAM], rx[MAXDGRAM];
    while (done < flows) {
        uint64_t now = now_ns(CLOCK_MONOTONIC);
        if (now - t_hs > 15000000000ull) {
            printf("{\"error\": \"handshake timed out\", \"answered\": %d, \"flows\": %d}\n",
                   done, flows);
            fflush(stdout);
            return 3;
        }
        if (now - last_round >= 200000000ull) {
            last_round = now;
            for (int i = 0; i < flows; i++) {
                if (answered[i])
                    continue;
                const uint8_t *req = requests + offsets[i];
                if (frame) {
                    put_header(frame_buf, &local[i], &target);
                    memcpy(frame_buf + HDR, req, lengths[i]);
                    send(fds[i], frame_buf, HDR + lengths[i], 0);
                } else {
                    send(fds[i], req, lengths[i], 0);
                }
            }
        }
        if (poll(pfds, (nfds_t)flows, 20) > 0) {
            for (int i = 0; i < flows; i++) {
                if ((pfds[i].revents & POLLIN) && recv(fds[i], rx, sizeof rx, MSG_DONTWAIT) >= 0 &&
                    !answered[i]) {
                    answered[i] = 1;
                    done++;
                }
            }
        }
    }
    double handshake_s = (double)(now_ns(CLOCK_MONOTONIC) - t_hs) / 1e9;
    printf("ready %d\n", flows);
    fflush(stdout);
    char go[64];
    if (read(0, go, sizeof go) <= 0)
        return 0;

    prctl(PR_SET_TIMERSLACK, 1UL); /* wake at the tick, not up to 50 us later */
    uint64_t start = now_ns(CLOCK_MONOTONIC), span = (uint64_t)(seconds * 1e9);
    uint64_t due_total = (uint64_t)(rate * seconds), attempted = 0, sent = 0, errors = 0;
    uint64_t ticks = 0, late_ticks = 0, max_burst = 0;
    int f = 0;
    for (;;) {
        uint64_t elapsed = now_ns(CLOCK_MONOTONIC) - start;
        if (elapsed >= span)
            break;
        uint64_t due = (uint64_t)((double)elapsed * rate / 1e9) + 1;
        if (due > due_total)
            due = due_total;
        uint64_t burst = due > attempted ? due - attempted : 0;
        if (burst > max_burst)
            max_burst = burst;
        while (attempted < due) {
            uint8_t *p = pkt[f] + off;
            uint32_t s = seq[f]++;
            uint16_t s16 = htons((uint16_t)s);
            uint32_t ts = htonl(s * 960u);
            memcpy(p + 2, &s16, 2);
            memcpy(p + 4, &ts, 4);
            uint64_t mono = now_ns(CLOCK_MONOTONIC), real = now_ns(CLOCK_REALTIME);
            uint32_t flow = (uint32_t)f;
            memcpy(p + STAMP_AT, &mono, 8);
            memcpy(p + STAMP_AT + 8, &real, 8);
            memcpy(p + STAMP_AT + 16, &s, 4);
            memcpy(p + STAMP_AT + 20, &flow, 4);
            if (send(fds[f], pkt[f], pkt_len, 0) < 0)
                errors++;
            else
                sent++;
            attempted++;
            if (++f == flows)
                f = 0;
        }
        ticks++;
        uint64_t after = now_ns(CLOCK_MONOTONIC) - start;
        if (after - elapsed > tick_ns)
            late_ticks++; /* the burst took longer than a tick: the generator is the limit */
        uint64_t next = (after / tick_ns + 1) * tick_ns;
        if (next >= span)
            next = span;
        struct timespec ts = {.tv_sec = (time_t)((start + next) / 1000000000ull),
                              .tv_nsec = (long)((start + next) % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
    double duration = (double)(now_ns(CLOCK_MONOTONIC) - start) / 1e9;
    printf("{\"flows\": %d, \"attempted\": %llu, \"sent\": %llu, \"errors\": %llu, "
           "\"duration_s\": %.6f, \"handshake_s\": %.3f, \"ticks\": %llu, \"late_ticks\": %llu, "
           "\"max_burst\": %llu}\n",
           flows, (unsigned long long)attempted, (unsigned long long)sent,
           (unsigned long long)errors, duration, handshake_s, (unsigned long long)ticks,
           (unsigned long long)late_ticks, (unsigned long long)max_burst);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* no leftovers if the bench itself is killed */
    if (getppid() == 1)
        return 2;
    if (argc >= 6 && strcmp(argv[1], "fwd") == 0) {
        pin(atoi(argv[3]));
        return run_fwd(argv + 2);
    }
    if (argc >= 4 && strcmp(argv[1], "sink") == 0) {
        pin(atoi(argv[3]));
        return run_sink(argv + 2);
    }
    if (argc >= 11 && strcmp(argv[1], "load") == 0) {
        pin(atoi(argv[3]));
        return run_load(argv + 2);
    }
    fprintf(stderr,
            "usage: %s fwd HOST CPU DEST_HOST DEST_PORT\n"
            "       %s sink HOST CPU\n"
            "       %s load SRC_NET CPU TARGET_HOST TARGET_PORT REQUESTS RATE SECONDS TICK_US "
            "FRAME\n",
            argv[0], argv[0], argv[0]);
    return 2;
}

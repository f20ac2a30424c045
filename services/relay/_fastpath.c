/* The relay data plane's common cases in C: a batch of datagrams received, looked up and
 * forwarded without a Python bytecode per datagram (`dataplane.py` says when it is used).
 *
 * What it does is exactly `FlowTable.known_client` / `known_return` / `known_peer` and the loops
 * around them
 * in `dataplane.py`, on the same Python objects: the flow table stays the only owner of the
 * flows (its dicts are read here, never written), and whatever is not the common case stops
 * the batch at that datagram, so Python takes it down the full path and resumes after it.
 *
 *   fp = Forwarder(count, size, headroom, flow_type, ...)   one arena, allocated once
 *   got = fp.receive(fd, sources)                           one recvmmsg, MSG_DONTWAIT
 *   stop, sent, sent_bytes, dropped = fp.forward_clients(start, flows, upstream_fds, now)
 *   stop, sent, sent_bytes, dropped = fp.forward_returns(start, by_return, peer, now, fd4, fd6,
 *                                                        fd_peer)
 *   stop, sent, sent_bytes, dropped = fp.forward_peers(start, hop_flows, upstream_fds, now)
 *
 * `stop` is the first datagram it did not forward (== got: all of them); everything it
 * queued before `stop` has been sent (one sendmmsg per destination socket, in order), so a
 * flow's datagrams keep their order when Python handles `stop` and calls again at stop + 1.
 *
 * No allocation per datagram: a source address is decoded to its (host, port) tuple once
 * per distinct sockaddr (a bounded table; a flood of spoofed sources costs a decode each,
 * never memory), a destination's sockaddr encoded once per client tuple (bounded the same
 * way), a return header is looked up through one reused bytes object, and a flow's slots
 * (`dest`, `header`, `last_seen`, ...) are read and written at their offsets in the Flow
 * object (the class is checked once, here, and every object's type on each use).
 *
 * Errors never raise: EINTR is retried, EAGAIN ends a receive or drops the rest of a send,
 * any other errno is counted (`errnos`; receive errors also by `take_rx_errors`) and, for a
 * send, skips that datagram.
 *
 * The source table is keyed by a hash with a random seed, and a lookup probes at most
 * MAX_PROBES slots (past them the address is decoded and not kept): sources an attacker
 * spoofs cannot be made to pile into one run of slots, so no datagram costs more than
 * MAX_PROBES compares and a decode.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>

#define SOURCE_SLOTS 8192   /* open addressing, half full at most: MAX_SOURCES entries */
#define MAX_SOURCES 4096
#define MAX_PROBES 16       /* slots a lookup looks at, at most: past them, decode uncached */
#define MAX_DESTINATIONS 4096
#define KEY_MAX 28          /* sizeof(struct sockaddr_in6) */

typedef struct {
    unsigned char key[KEY_MAX];
    uint8_t len;            /* 0: empty */
    PyObject *addr;         /* (host, port), a strong reference */
} SourceSlot;

typedef struct {
    PyObject_HEAD
    unsigned int count;
    Py_ssize_t size, headroom, stride;
    unsigned char *arena;
    struct mmsghdr *rx;
    struct iovec *rx_iov;
    struct sockaddr_storage *names;
    unsigned int got, filled;
    PyObject **sources;     /* per message of the last receive: strong references */
    SourceSlot *cache;
    unsigned int cache_used;
    uint64_t seed;          /* random per Forwarder: sources cannot be chosen to collide */
    /* the batch being sent */
    struct mmsghdr *tx;     /* queued, in arrival order */
    struct iovec *tx_iov;
    int *tx_fd;
    unsigned int tx_n;
    struct mmsghdr *tx_run; /* one destination's datagrams, contiguous, for sendmmsg */
    PyObject *dest_names;   /* client tuple -> bytes (its sockaddr) */
    PyObject *key4, *key6;  /* reused lookup keys for return headers */
    Py_ssize_t v4_header, v6_header;
    int v6_family_min, stun_last;
    Py_ssize_t max_datagram;
    /* Flow's slot offsets */
    PyTypeObject *flow_type;
    Py_ssize_t off_dest, off_header, off_last_seen, off_client, off_established, off_via,
        off_stream;
    unsigned long long rx_errors;
    PyObject *errnos;       /* errno -> count, every error */
    int ready;              /* __init__ completed: every method checks it first */
} Forwarder;

/* A Forwarder whose __init__ failed part-way (or never ran) has NULLs where the methods
 * expect buffers and keys: refused, not used. */
#define NEED_READY(self)                                                          \
    do {                                                                          \
        if (!(self)->ready) {                                                     \
            PyErr_SetString(PyExc_RuntimeError, "Forwarder is not initialised");  \
            return NULL;                                                          \
        }                                                                         \
    } while (0)

static void count_errno(Forwarder *self, int err) {
    PyObject *key = PyLong_FromLong(err);
    if (key == NULL) { PyErr_Clear(); return; }
    PyObject *old = PyDict_GetItemWithError(self->errnos, key);
    long n = old ? PyLong_AsLong(old) : 0;
    PyObject *val = PyLong_FromLong(n + 1);
    if (val == NULL || PyDict_SetItem(self->errnos, key, val) < 0) PyErr_Clear();
    Py_XDECREF(val);
    Py_DECREF(key);
}

static Py_ssize_t slot_offset(PyTypeObject *type, const char *name) {
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);
    if (descr == NULL || !PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s has no slot %s", type->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", type->tp_name, name);
        return -1;
    }
    return member->offset;
}

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static void clear_sources(Forwarder *self) {
    for (unsigned int i = 0; i < self->got; i++) Py_CLEAR(self->sources[i]);
}

static void clear_cache(Forwarder *self) {
    for (unsigned int i = 0; i < SOURCE_SLOTS; i++) {
        if (self->cache[i].len) {
            Py_CLEAR(self->cache[i].addr);
            self->cache[i].len = 0;
        }
    }
    self->cache_used = 0;
}

static int Forwarder_init(Forwarder *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"count", "size", "headroom", "flow_type", "v4_header", "v6_header",
                             "v6_family_min", "stun_last", "max_datagram", NULL};
    unsigned int count;
    Py_ssize_t size, headroom, v4, v6, max_datagram;
    int v6_family_min, stun_last;
    PyObject *flow_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "InnO!nniin", kwlist, &count, &size, &headroom,
                                     &PyType_Type, &flow_type, &v4, &v6, &v6_family_min,
                                     &stun_last, &max_datagram))
        return -1;
    if (self->arena != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Forwarder is initialised once");
        return -1;
    }
    /* (a header is at least 14 bytes: its family byte, at[13], is read) */
    if (count < 1 || count > 1024 || size < 1 || v4 < 14 || headroom < v6 || v4 > v6 ||
        max_datagram < 0) {
        PyErr_SetString(PyExc_ValueError, "bad Forwarder sizes");
        return -1;
    }
    PyTypeObject *type = (PyTypeObject *)flow_type;
    if ((self->off_dest = slot_offset(type, "dest")) < 0 ||
        (self->off_header = slot_offset(type, "header")) < 0 ||
        (self->off_last_seen = slot_offset(type, "last_seen")) < 0 ||
        (self->off_client = slot_offset(type, "client")) < 0 ||
        (self->off_established = slot_offset(type, "established")) < 0 ||
        (self->off_via = slot_offset(type, "via")) < 0 ||
        (self->off_stream = slot_offset(type, "stream")) < 0)
        return -1;
    Py_INCREF(type);
    self->flow_type = type;
    self->count = count;
    self->size = size;
    self->headroom = headroom;
    self->stride = (headroom + size + 7) / 8 * 8;
    self->v4_header = v4;
    self->v6_header = v6;
    self->v6_family_min = v6_family_min;
    self->stun_last = stun_last;
    self->max_datagram = max_datagram;
    if (getrandom(&self->seed, sizeof self->seed, 0) != sizeof self->seed) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->arena = PyMem_Calloc(count, self->stride);
    self->rx = PyMem_Calloc(count, sizeof(struct mmsghdr));
    self->rx_iov = PyMem_Calloc(count, sizeof(struct iovec));
    self->names = PyMem_Calloc(count, sizeof(struct sockaddr_storage));
    self->sources = PyMem_Calloc(count, sizeof(PyObject *));
    self->cache = PyMem_Calloc(SOURCE_SLOTS, sizeof(SourceSlot));
    self->tx = PyMem_Calloc(count, sizeof(struct mmsghdr));
    self->tx_iov = PyMem_Calloc(count, sizeof(struct iovec));
    self->tx_fd = PyMem_Calloc(count, sizeof(int));
    self->tx_run = PyMem_Calloc(count, sizeof(struct mmsghdr));
    self->dest_names = PyDict_New();
    self->errnos = PyDict_New();
    self->key4 = PyBytes_FromStringAndSize(NULL, v4);
    self->key6 = PyBytes_FromStringAndSize(NULL, v6);
    if (!self->arena || !self->rx || !self->rx_iov || !self->names || !self->sources ||
        !self->cache || !self->tx || !self->tx_iov || !self->tx_fd || !self->tx_run) {
        PyErr_NoMemory();
        return -1;
    }
    if (!self->dest_names || !self->errnos || !self->key4 || !self->key6) return -1;
    for (unsigned int i = 0; i < count; i++) {
        self->rx_iov[i].iov_base = self->arena + i * self->stride + headroom;
        self->rx_iov[i].iov_len = size;
        self->rx[i].msg_hdr.msg_iov = &self->rx_iov[i];
        self->rx[i].msg_hdr.msg_iovlen = 1;
        self->rx[i].msg_hdr.msg_name = &self->names[i];
        self->rx[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
        self->tx[i].msg_hdr.msg_iov = &self->tx_iov[i];
        self->tx[i].msg_hdr.msg_iovlen = 1;
    }
    self->ready = 1;
    return 0;
}

static void Forwarder_dealloc(Forwarder *self) {
    if (self->sources) clear_sources(self);
    if (self->cache) clear_cache(self);
    PyMem_Free(self->arena);
    PyMem_Free(self->rx);
    PyMem_Free(self->rx_iov);
    PyMem_Free(self->names);
    PyMem_Free(self->sources);
    PyMem_Free(self->cache);
    PyMem_Free(self->tx);
    PyMem_Free(self->tx_iov);
    PyMem_Free(self->tx_fd);
    PyMem_Free(self->tx_run);
    Py_XDECREF(self->dest_names);
    Py_XDECREF(self->errnos);
    Py_XDECREF(self->key4);
    Py_XDECREF(self->key6);
    Py_XDECREF(self->flow_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* (host, port) of a sockaddr, as `mmsg.decode_sockaddr` makes it (("", 0): another family) */
static PyObject *decode_sockaddr(const struct sockaddr_storage *ss) {
    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    int port = 0;
    host[0] = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
        port = ntohs(sin->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host);
        port = ntohs(sin6->sin6_port);
        if (sin6->sin6_scope_id) {
            size_t at = strlen(host);
            char name[IF_NAMESIZE];
            if (if_indextoname(sin6->sin6_scope_id, name) != NULL)
                snprintf(host + at, sizeof host - at, "%%%s", name);
            else
                snprintf(host + at, sizeof host - at, "%%%u", sin6->sin6_scope_id);
        }
    }
    return Py_BuildValue("(si)", host, port);
}

/* The (host, port) of a datagram's source: a new reference, from the table when it is there */
static PyObject *source_of(Forwarder *self, const struct sockaddr_storage *ss) {
    unsigned char key[KEY_MAX];
    uint8_t len;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
        len = 8;
        memcpy(key, &sin->sin_family, 2);
        memcpy(key + 2, &sin->sin_port, 2);
        memcpy(key + 4, &sin->sin_addr, 4);
    } else {
        len = KEY_MAX;
        memcpy(key, ss, KEY_MAX);
        if (ss->ss_family == AF_INET6) memset(key + 4, 0, 4);  /* flowinfo is no part of it */
    }
    uint64_t h = self->seed;  /* FNV-1a over the key, from a secret start */
    for (unsigned int i = 0; i < len; i++) h = (h ^ key[i]) * 1099511628211ull;
    h ^= h >> 29;
    unsigned int at = (unsigned int)h & (SOURCE_SLOTS - 1), probes = 0;
    while (self->cache[at].len) {
        SourceSlot *slot = &self->cache[at];
        if (slot->len == len && memcmp(slot->key, key, len) == 0) {
            Py_INCREF(slot->addr);
            return slot->addr;
        }
        if (++probes >= MAX_PROBES) return decode_sockaddr(ss);  /* crowded: not kept */
        at = (at + 1) & (SOURCE_SLOTS - 1);
    }
    if (self->cache_used >= MAX_SOURCES) {  /* full: start again (each entry costs a decode) */
        clear_cache(self);
        at = (unsigned int)h & (SOURCE_SLOTS - 1);
    }
    PyObject *addr = decode_sockaddr(ss);
    if (addr == NULL) return NULL;
    SourceSlot *slot = &self->cache[at];
    memcpy(slot->key, key, len);
    slot->len = len;
    slot->addr = addr;  /* the table's reference; the caller gets its own */
    self->cache_used++;
    Py_INCREF(addr);
    return addr;
}

/* One recvmmsg on `fd` (sources: decode each datagram's source address): how many came, 0
 * for none or an error (counted), -1 with a Python error set. */
static int do_receive(Forwarder *self, int fd, int sources) {
    clear_sources(self);
    self->got = 0;
    /* the kernel wrote the length it used into msg_namelen: give the room back */
    for (unsigned int i = 0; i < self->filled; i++)
        self->rx[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
    self->filled = 0;
    int got, err = 0;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        got = recvmmsg(fd, self->rx, self->count, MSG_DONTWAIT, NULL);
        err = errno;
        Py_END_ALLOW_THREADS
        if (got >= 0 || err != EINTR) break;
    }
    if (got < 0) {
        /* e.g. ECONNREFUSED on a connected socket: reported once, later datagrams follow */
        if (err != EAGAIN && err != EWOULDBLOCK) {
            count_errno(self, err);
            self->rx_errors++;
        }
        return 0;
    }
    self->filled = got;
    if (sources) {
        for (int i = 0; i < got; i++) {
            PyObject *addr = source_of(self, &self->names[i]);  /* a new reference */
            if (addr == NULL) {
                self->got = i;
                return -1;
            }
            self->sources[i] = addr;
        }
    }
    self->got = got;
    return got;
}

static PyObject *Forwarder_receive(Forwarder *self, PyObject *args) {
    int fd, sources = 1;
    NEED_READY(self);
    if (!PyArg_ParseTuple(args, "i|p", &fd, &sources)) return NULL;
    int got = do_receive(self, fd, sources);
    return got < 0 ? NULL : PyLong_FromLong(got);
}

static int check_index(Forwarder *self, Py_ssize_t i) {
    if (i < 0 || (size_t)i >= self->got) {
        PyErr_SetString(PyExc_IndexError, "no such datagram in the last receive");
        return -1;
    }
    return 0;
}

static PyObject *Forwarder_datagram(Forwarder *self, PyObject *arg) {
    NEED_READY(self);
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if ((i == -1 && PyErr_Occurred()) || check_index(self, i) < 0) return NULL;
    return PyBytes_FromStringAndSize((char *)self->arena + i * self->stride + self->headroom,
                                     self->rx[i].msg_len);
}

static PyObject *Forwarder_source(Forwarder *self, PyObject *arg) {
    NEED_READY(self);
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if ((i == -1 && PyErr_Occurred()) || check_index(self, i) < 0) return NULL;
    PyObject *addr = self->sources[i];
    if (addr == NULL) {
        PyErr_SetString(PyExc_ValueError, "that receive decoded no sources");
        return NULL;
    }
    Py_INCREF(addr);
    return addr;
}

static inline void queue(Forwarder *self, int fd, void *base, size_t len, void *name,
                         socklen_t namelen) {
    unsigned int j = self->tx_n++;
    self->tx_iov[j].iov_base = base;
    self->tx_iov[j].iov_len = len;
    self->tx[j].msg_hdr.msg_name = name;
    self->tx[j].msg_hdr.msg_namelen = namelen;
    self->tx_fd[j] = fd;
}

/* Send what is queued: one sendmmsg run per destination socket, each in its order. Returns
 * how many were dropped. */
static unsigned int flush(Forwarder *self) {
    unsigned int n = self->tx_n, dropped = 0;
    if (n == 0) return 0;
    char done_fd[1024] = {0};  /* count <= 1024 */
    for (unsigned int first = 0; first < n; first++) {
        if (done_fd[first]) continue;
        int fd = self->tx_fd[first];
        unsigned int k = 0;
        for (unsigned int j = first; j < n; j++) {
            if (!done_fd[j] && self->tx_fd[j] == fd) {
                self->tx_run[k++].msg_hdr = self->tx[j].msg_hdr;
                done_fd[j] = 1;
            }
        }
        unsigned int sent = 0;
        while (sent < k) {
            int r, err = 0;
            Py_BEGIN_ALLOW_THREADS
            r = sendmmsg(fd, self->tx_run + sent, k - sent, MSG_DONTWAIT);
            err = errno;
            Py_END_ALLOW_THREADS
            if (r > 0) {
                sent += r;
                continue;
            }
            if (r == 0) err = EIO;
            if (err == EINTR) continue;
            count_errno(self, err);
            if (err == EAGAIN || err == EWOULDBLOCK) {
                dropped += k - sent;
                break;
            }
            dropped++;  /* this one datagram failed (ECONNREFUSED, EMSGSIZE, ...) */
            sent++;
        }
    }
    self->tx_n = 0;
    return dropped;
}

/* The end of a forward call: what it queued is sent (also when an error stops it), and the
 * Python side learns (stop, sent, bytes offered, dropped); bytes, like the Python loop's,
 * count the payloads queued. */
static PyObject *finish(Forwarder *self, unsigned int stop, unsigned int queued,
                        unsigned long long bytes) {
    unsigned int dropped = flush(self);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("IIKI", stop, queued - dropped, bytes, dropped);
}

/* The fd of `dest`'s upstream socket in `upstream_fds` (dest tuple -> fd), or -1. */
static int upstream_fd(PyObject *upstream_fds, PyObject *dest) {
    PyObject *fd = PyDict_GetItemWithError(upstream_fds, dest);
    if (fd == NULL || !PyLong_CheckExact(fd)) return -1;
    long value = PyLong_AsLong(fd);
    if (value < 0 || value > INT_MAX) {
        PyErr_Clear();
        return -1;
    }
    return (int)value;
}

/* flow.last_seen = now (a datagram of it was taken) */
static inline void touch(Forwarder *self, PyObject *flow, PyObject *now) {
    PyObject *old = SLOT(flow, self->off_last_seen);
    Py_INCREF(now);
    SLOT(flow, self->off_last_seen) = now;
    Py_XDECREF(old);
}

/* What a forward pass queued: datagrams and their payload bytes. */
typedef struct {
    unsigned int queued;
    unsigned long long bytes;
} Pass;

static unsigned int clamp_start(Forwarder *self, Py_ssize_t start) {
    return start < 0 ? 0 : start > (Py_ssize_t)self->got ? self->got : (unsigned int)start;
}

static unsigned int clients_pass(Forwarder *self, unsigned int i, PyObject *flows,
                                 PyObject *upstream_fds, PyObject *now, Pass *pass) {
    for (; i < self->got; i++) {
        Py_ssize_t n = self->rx[i].msg_len;
        unsigned char *at = self->arena + i * self->stride + self->headroom;
        PyObject *client = self->sources[i];
        if (client == NULL || n <= 0 || n > self->max_datagram || at[0] <= self->stun_last) break;
        PyObject *flow = PyDict_GetItemWithError(flows, client);
        if (flow == NULL || Py_TYPE(flow) != self->flow_type) break;
        PyObject *dest = SLOT(flow, self->off_dest), *header = SLOT(flow, self->off_header);
        if (dest == NULL || header == NULL || !PyBytes_CheckExact(header)) break;
        int fd = upstream_fd(upstream_fds, dest);
        Py_ssize_t hlen = PyBytes_GET_SIZE(header);
        if (fd < 0 || hlen > self->headroom) break;
        touch(self, flow, now);
        memcpy(at - hlen, PyBytes_AS_STRING(header), hlen);
        queue(self, fd, at - hlen, n + hlen, NULL, 0);
        pass->queued++;
        pass->bytes += n;
    }
    return i;
}

/* A pass over a flow dict toward upstream sockets (clients_pass, peers_pass) as a method:
 * (start, flows, upstream_fds, now) -> (stop, sent, bytes, dropped). */
typedef unsigned int (*upstream_pass)(Forwarder *, unsigned int, PyObject *, PyObject *,
                                      PyObject *, Pass *);

static PyObject *forward_upstream(Forwarder *self, PyObject *args, upstream_pass run) {
    Py_ssize_t start;
    PyObject *flows, *upstream_fds, *now;
    NEED_READY(self);
    if (!PyArg_ParseTuple(args, "nO!O!O!", &start, &PyDict_Type, &flows, &PyDict_Type,
                          &upstream_fds, &PyFloat_Type, &now))
        return NULL;
    Pass pass = {0, 0};
    unsigned int stop = run(self, clamp_start(self, start), flows, upstream_fds, now, &pass);
    return finish(self, stop, pass.queued, pass.bytes);
}

/* Datagrams from clients, from `start`: each one with a flow in `flows` (client tuple ->
 * Flow) whose destination has an upstream socket in `upstream_fds` (dest tuple -> fd) goes
 * there with the flow's header in front of it, as `known_client` and `_drain_public` do. */
static PyObject *Forwarder_forward_clients(Forwarder *self, PyObject *args) {
    return forward_upstream(self, args, clients_pass);
}

/* The sockaddr of a (host, port) tuple, encoded once (None, no error: not one this path
 * sends to, e.g. a scoped IPv6 address); `*v6` says its family. */
static PyObject *dest_name(Forwarder *self, PyObject *client, int *v6) {
    PyObject *name = PyDict_GetItemWithError(self->dest_names, client);
    if (name != NULL) {
        *v6 = PyBytes_GET_SIZE(name) == sizeof(struct sockaddr_in6);
        return name;
    }
    if (PyErr_Occurred()) return NULL;
    if (!PyTuple_CheckExact(client) || PyTuple_GET_SIZE(client) != 2) return NULL;
    PyObject *hostobj = PyTuple_GET_ITEM(client, 0), *portobj = PyTuple_GET_ITEM(client, 1);
    if (!PyUnicode_Check(hostobj) || !PyLong_Check(portobj)) return NULL;
    const char *host = PyUnicode_AsUTF8(hostobj);
    long port = host == NULL ? -1 : PyLong_AsLong(portobj);
    if (host == NULL || port < 0 || port > 65535 || strchr(host, '%')) {
        PyErr_Clear();
        return NULL;  /* a scoped address: the Python path */
    }
    struct sockaddr_in6 ss;
    memset(&ss, 0, sizeof ss);
    Py_ssize_t len;
    *v6 = strchr(host, ':') != NULL;
    if (*v6) {
        if (inet_pton(AF_INET6, host, &ss.sin6_addr) != 1) return NULL;
        ss.sin6_family = AF_INET6;
        ss.sin6_port = htons((uint16_t)port);
        len = sizeof(struct sockaddr_in6);
    } else {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        if (inet_pton(AF_INET, host, &sin->sin_addr) != 1) return NULL;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        len = sizeof(struct sockaddr_in);
    }
    name = PyBytes_FromStringAndSize((const char *)&ss, len);
    if (name == NULL) return NULL;
    int r = PyDict_SetItem(self->dest_names, client, name);
    Py_DECREF(name);  /* the dict holds it until the next call's start at least */
    return r < 0 ? NULL : name;
}

static PyObject *return_key(Forwarder *self, PyObject **slot, const unsigned char *header,
                            Py_ssize_t hlen) {
    PyObject *key = *slot;
#if PY_VERSION_HEX < 0x030E0000
    /* Ours alone (a dict lookup keeps no key): rewritten in place, its cached hash forgotten
     * (ob_shash: deprecated for readers since 3.11, still the bytes hash cache through 3.13). */
    if (Py_REFCNT(key) == 1) {
        memcpy(PyBytes_AS_STRING(key), header, hlen);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        ((PyBytesObject *)key)->ob_shash = -1;
#pragma GCC diagnostic pop
        return key;
    }
#endif
    PyObject *fresh = PyBytes_FromStringAndSize((const char *)header, hlen);
    if (fresh == NULL) return NULL;
    Py_SETREF(*slot, fresh);
    return fresh;
}

static unsigned int returns_pass(Forwarder *self, unsigned int i, PyObject *by_return,
                                 PyObject *peer, PyObject *now, int fd4, int fd6, int fd_peer,
                                 Pass *pass) {
    if (PyDict_Size(self->dest_names) >= MAX_DESTINATIONS) PyDict_Clear(self->dest_names);
    for (; i < self->got; i++) {
        Py_ssize_t n = self->rx[i].msg_len;
        unsigned char *at = self->arena + i * self->stride + self->headroom;
        int v6 = n >= self->v6_header && at[13] >= self->v6_family_min;
        Py_ssize_t hlen = v6 ? self->v6_header : self->v4_header;
        if (n < hlen || n - hlen > self->max_datagram) break;
        PyObject *key = return_key(self, v6 ? &self->key6 : &self->key4, at, hlen);
        if (key == NULL) break;
        PyObject *flow = PyDict_GetItemWithError(by_return, key);
        if (flow == NULL || Py_TYPE(flow) != self->flow_type) break;
        PyObject *dest = SLOT(flow, self->off_dest), *via = SLOT(flow, self->off_via);
        if (SLOT(flow, self->off_established) != Py_True || SLOT(flow, self->off_stream) != Py_False ||
            dest == NULL || via == NULL)
            break;
        if (dest != peer && PyObject_RichCompareBool(dest, peer, Py_EQ) != 1) break;
        int to_v6;
        PyObject *to = via == Py_None ? SLOT(flow, self->off_client) : via;
        PyObject *name = to == NULL ? NULL : dest_name(self, to, &to_v6);
        if (name == NULL) break;
        touch(self, flow, now);
        char *sa = PyBytes_AS_STRING(name);
        socklen_t salen = (socklen_t)PyBytes_GET_SIZE(name);
        if (via == Py_None)
            queue(self, to_v6 ? fd6 : fd4, at + hlen, n - hlen, sa, salen);
        else
            queue(self, fd_peer, at, n, sa, salen);
        pass->queued++;
        pass->bytes += n - hlen;  /* payloads, as the Python loop counts them */
    }
    return i;
}

/* Framed replies from `peer` (a connected upstream socket's destination), from `start`: each
 * one whose exact header is an established UDP flow's return key in `by_return`, that flow
 * pointing at `peer`, goes as `known_return` and `_drain_upstream` say: to the flow's client
 * from the public socket of its family (fd4, fd6), header cut off; on a second hop, as it is
 * to the first-hop relay (`via`) from the peer socket (fd_peer). */
static PyObject *Forwarder_forward_returns(Forwarder *self, PyObject *args) {
    Py_ssize_t start;
    PyObject *by_return, *peer, *now;
    int fd4, fd6, fd_peer;
    NEED_READY(self);
    if (!PyArg_ParseTuple(args, "nO!OO!iii", &start, &PyDict_Type, &by_return, &peer,
                          &PyFloat_Type, &now, &fd4, &fd6, &fd_peer))
        return NULL;
    Pass pass = {0, 0};
    unsigned int stop = returns_pass(self, clamp_start(self, start), by_return, peer, now, fd4,
                                     fd6, fd_peer, &pass);
    return finish(self, stop, pass.queued, pass.bytes);
}

static unsigned int peers_pass(Forwarder *self, unsigned int i, PyObject *hop_flows,
                               PyObject *upstream_fds, PyObject *now, Pass *pass) {
    for (; i < self->got; i++) {
        Py_ssize_t n = self->rx[i].msg_len;
        unsigned char *at = self->arena + i * self->stride + self->headroom;
        PyObject *src = self->sources[i];
        int v6 = n > self->v6_header && at[13] >= self->v6_family_min;
        Py_ssize_t hlen = v6 ? self->v6_header : self->v4_header;
        if (src == NULL || n <= hlen || n - hlen > self->max_datagram || at[hlen] <= self->stun_last)
            break;
        PyObject *key = return_key(self, v6 ? &self->key6 : &self->key4, at, hlen);
        if (key == NULL) break;
        PyObject *flow = PyDict_GetItemWithError(hop_flows, key);
        if (flow == NULL || Py_TYPE(flow) != self->flow_type) break;
        PyObject *via = SLOT(flow, self->off_via), *dest = SLOT(flow, self->off_dest);
        if (via == NULL || via == Py_None || dest == NULL) break;
        if (via != src && PyObject_RichCompareBool(via, src, Py_EQ) != 1) break;
        int fd = upstream_fd(upstream_fds, dest);
        if (fd < 0) break;
        touch(self, flow, now);
        queue(self, fd, at, n, NULL, 0);
        pass->queued++;
        pass->bytes += n - hlen;
    }
    return i;
}

/* Framed datagrams from first-hop relays, from `start`: each one whose exact header is a
 * second-hop flow's in `hop_flows`, from that flow's first hop (`via`), carrying a non-STUN
 * payload, goes as it is to the flow's destination's upstream socket in `upstream_fds`, as
 * `known_peer` and `_drain_peer` do. */
static PyObject *Forwarder_forward_peers(Forwarder *self, PyObject *args) {
    return forward_upstream(self, args, peers_pass);
}

/* serve(): the worker's wait and its wake-ups, for as long as they are all common cases.
 *
 * One epoll_wait on the worker's set (`epfd`), with the GIL released; when every ready
 * descriptor is a datagram socket in `routes` (fd -> 0: a public socket, 1: the peer socket,
 * (host, port): a connected upstream socket, that destination), each is received (one
 * recvmmsg) and its batch forwarded by the passes above, and the wait starts again, without
 * a bytecode. It returns to Python when:
 *   SERVE_TIMEOUT  `timeout` seconds went by (the worker's tick, the gather's rate window);
 *   SERVE_OTHER    a ready descriptor is not in `routes` (commands, ICE-TCP, the shared
 *                  upstream socket): nothing of that wake-up was read; Python polls again
 *                  (epoll is level-triggered) and handles it all;
 *   SERVE_SLOW     datagram `stop` of the batch just received on `fd` is not a common case:
 *                  what came before it has been sent, and Python takes it down the full
 *                  path and goes on from stop + 1 (as after a forward_* call);
 *   SERVE_BUSY     a wake-up that Python's gather looks at: it filled a batch (`more`),
 *                  carried `min_batch` datagrams, or any while `busy`.
 * -> (why, fd, got, stop, handled, last, more, up, up_bytes, down, down_bytes, dropped,
 *     recv_errors, upstream_errors): `handled` datagrams received in all (for the gather's
 *     rate), `last` in the last wake-up; what was forwarded upstream (to transceivers and
 *     second hops) and down (to clients and first hops), what the kernel refused to send,
 *     and receive errors on public and peer sockets and on upstream ones. */
#define SERVE_TIMEOUT 0
#define SERVE_OTHER 1
#define SERVE_SLOW 2
#define SERVE_BUSY 3
#define SERVE_EVENTS 64

static double clock_seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    unsigned long long up, up_bytes, down, down_bytes, dropped, recv_errors, upstream_errors;
} Served;

static PyObject *Forwarder_serve(Forwarder *self, PyObject *args) {
    int epfd, fd4, fd6, fd_peer, busy, min_batch;
    double timeout;
    PyObject *routes, *flows, *by_return, *hop_flows, *upstream_fds;
    NEED_READY(self);
    if (!PyArg_ParseTuple(args, "idO!O!O!O!O!iiipi", &epfd, &timeout, &PyDict_Type, &routes,
                          &PyDict_Type, &flows, &PyDict_Type, &by_return, &PyDict_Type,
                          &hop_flows, &PyDict_Type, &upstream_fds, &fd4, &fd6, &fd_peer, &busy,
                          &min_batch))
        return NULL;
    if (!(timeout >= 0 && timeout <= 3600)) {  /* (NaN too: it would wait for ever) */
        PyErr_SetString(PyExc_ValueError, "serve's timeout is 0-3600 seconds");
        return NULL;
    }
    struct epoll_event events[SERVE_EVENTS];
    Served done = {0, 0, 0, 0, 0, 0, 0};
    int why = SERVE_TIMEOUT, fd = -1, more = 0;
    unsigned int got = 0, stop = 0;
    unsigned long long handled = 0, last = 0;
    double deadline = clock_seconds(CLOCK_MONOTONIC) + timeout;
    for (;;) {
        double left = deadline - clock_seconds(CLOCK_MONOTONIC);
        if (left <= 0) break;
        int n, err = 0, ms = (int)(left * 1000.0) + 1;
        Py_BEGIN_ALLOW_THREADS
        n = epoll_wait(epfd, events, SERVE_EVENTS, ms);
        err = errno;
        Py_END_ALLOW_THREADS
        if (n < 0) {
            if (err == EINTR) continue;
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        PyObject *kinds[SERVE_EVENTS];
        int others = 0;
        for (int e = 0; e < n; e++) {
            PyObject *key = PyLong_FromLong(events[e].data.fd);
            if (key == NULL) return NULL;
            kinds[e] = PyDict_GetItemWithError(routes, key);  /* borrowed */
            Py_DECREF(key);
            if (kinds[e] == NULL) {
                if (PyErr_Occurred()) return NULL;
                others = 1;
            }
        }
        if (others) {  /* (nothing of this wake-up was read) */
            why = SERVE_OTHER;
            last = 0;
            break;
        }
        if (n == 0) continue;
        PyObject *now = PyFloat_FromDouble(clock_seconds(CLOCK_REALTIME));  /* time.time() */
        if (now == NULL) return NULL;
        last = 0;
        for (int e = 0; e < n && why == SERVE_TIMEOUT; e++) {
            fd = events[e].data.fd;
            PyObject *kind = kinds[e];
            int upstream = !PyLong_CheckExact(kind), peer = !upstream && PyLong_AsLong(kind) == 1;
            int r = do_receive(self, fd, !upstream);
            if (self->rx_errors) {
                *(upstream ? &done.upstream_errors : &done.recv_errors) += self->rx_errors;
                self->rx_errors = 0;
            }
            if (r < 0) {
                Py_DECREF(now);
                return NULL;
            }
            got = (unsigned int)r;
            handled += got;
            last += got;
            more |= got == self->count;
            Pass pass = {0, 0};
            if (upstream)
                stop = returns_pass(self, 0, by_return, kind, now, fd4, fd6, fd_peer, &pass);
            else if (peer)
                stop = peers_pass(self, 0, hop_flows, upstream_fds, now, &pass);
            else
                stop = clients_pass(self, 0, flows, upstream_fds, now, &pass);
            unsigned int dropped = flush(self);
            done.dropped += dropped;
            *(upstream ? &done.down : &done.up) += pass.queued - dropped;
            *(upstream ? &done.down_bytes : &done.up_bytes) += pass.bytes;
            if (PyErr_Occurred()) {
                Py_DECREF(now);
                return NULL;
            }
            if (stop < got) why = SERVE_SLOW;
        }
        Py_DECREF(now);
        if (why != SERVE_TIMEOUT) break;
        if (more || last >= (unsigned long long)min_batch || (busy && last > 0)) {
            why = SERVE_BUSY;
            break;
        }
    }
    return Py_BuildValue("iiIIKKiKKKKKKK", why, fd, got, stop, handled, last, more, done.up,
                         done.up_bytes, done.down, done.down_bytes, done.dropped,
                         done.recv_errors, done.upstream_errors);
}

static PyObject *Forwarder_take_rx_errors(Forwarder *self, PyObject *Py_UNUSED(ignored)) {
    unsigned long long n = self->rx_errors;
    self->rx_errors = 0;
    return PyLong_FromUnsignedLongLong(n);
}

static PyMethodDef Forwarder_methods[] = {
    {"receive", (PyCFunction)Forwarder_receive, METH_VARARGS,
     "receive(fd, sources=True) -> datagrams received (0: none, or an error, counted)"},
    {"datagram", (PyCFunction)Forwarder_datagram, METH_O, "datagram(i) -> a copy of it"},
    {"source", (PyCFunction)Forwarder_source, METH_O, "source(i) -> (host, port)"},
    {"forward_clients", (PyCFunction)Forwarder_forward_clients, METH_VARARGS,
     "forward_clients(start, flows, upstream_fds, now) -> (stop, sent, bytes, dropped)"},
    {"forward_returns", (PyCFunction)Forwarder_forward_returns, METH_VARARGS,
     "forward_returns(start, by_return, peer, now, fd4, fd6, fd_peer) -> (stop, sent, bytes, "
     "dropped)"},
    {"forward_peers", (PyCFunction)Forwarder_forward_peers, METH_VARARGS,
     "forward_peers(start, hop_flows, upstream_fds, now) -> (stop, sent, bytes, dropped)"},
    {"serve", (PyCFunction)Forwarder_serve, METH_VARARGS,
     "serve(epfd, timeout, routes, flows, by_return, hop_flows, upstream_fds, fd4, fd6, "
     "fd_peer, busy, min_batch) -> (why, fd, got, stop, handled, last, more, up, up_bytes, "
     "down, down_bytes, dropped, recv_errors, upstream_errors)"},
    {"take_rx_errors", (PyCFunction)Forwarder_take_rx_errors, METH_NOARGS,
     "receive errors since the last call (every error, by errno: `errnos`, cumulative)"},
    {NULL}};

static PyObject *Forwarder_get_errnos(Forwarder *self, void *closure) {
    return PyDict_Copy(self->errnos);
}

static PyObject *Forwarder_get_sources_cached(Forwarder *self, void *closure) {
    return PyLong_FromUnsignedLong(self->cache_used);
}

static PyGetSetDef Forwarder_getset[] = {
    {"errnos", (getter)Forwarder_get_errnos, NULL, "errno -> count, since it was made", NULL},
    {"sources_cached", (getter)Forwarder_get_sources_cached, NULL, "decoded sources kept", NULL},
    {NULL}};

static PyTypeObject ForwarderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "firsthop.services.relay._fastpath.Forwarder",
    .tp_basicsize = sizeof(Forwarder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of datagrams received, looked up in the flow table's dicts and forwarded",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Forwarder_init,
    .tp_dealloc = (destructor)Forwarder_dealloc,
    .tp_methods = Forwarder_methods,
    .tp_getset = Forwarder_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "The relay data plane's common cases in C (see dataplane.py).", -1, NULL, NULL, NULL, NULL,
    NULL};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&ForwarderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ForwarderType);
    if (PyModule_AddObject(m, "Forwarder", (PyObject *)&ForwarderType) < 0) {
        Py_DECREF(&ForwarderType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_SOURCES", MAX_SOURCES);
    PyModule_AddIntConstant(m, "MAX_DESTINATIONS", MAX_DESTINATIONS);
    PyModule_AddIntConstant(m, "SERVE_TIMEOUT", SERVE_TIMEOUT);
    PyModule_AddIntConstant(m, "SERVE_OTHER", SERVE_OTHER);
    PyModule_AddIntConstant(m, "SERVE_SLOW", SERVE_SLOW);
    PyModule_AddIntConstant(m, "SERVE_BUSY", SERVE_BUSY);
    return m;
}

"""recvmmsg(2) and sendmmsg(2) for Python sockets, through ctypes on libc (Linux).

Python's socket module has one datagram per call; a relay pays the interpreter's cost of a
call, the syscall's entry and exit and the GIL's release and re-take for each. These move
up to N datagrams per syscall.

Strategy: everything a call needs is allocated once, when the batch object is made: one
bytearray `arena` of N slots (`stride` bytes each), the `mmsghdr` array, one iovec per
message and one `sockaddr_storage` per message. The kernel writes lengths and source
addresses into those arrays; Python reads and writes them through memoryviews cast to
machine words ('I', 'P') at offsets taken from the ctypes structures, which costs an index
each instead of a ctypes attribute. A received datagram is read in place (slot i starts at
`i * stride`, its payload `headroom` bytes in, so a header can be written in front of it
without copying the payload); a datagram to send is named by its address in memory and its
length (`Sender.add`), typically a slice of a `Receiver`'s arena, or handed over as a buffer
(`Sender.add_buffer`): a writable one is sent from where it is, `bytes` are copied into the
`Sender`'s own arena (a slot per entry: one copy, no allocation per datagram).

Source addresses are decoded to `(host, port)` once per distinct sockaddr: a bounded dict
from the sockaddr's bytes (for IPv4, the first machine word: family, port and address) to
the tuple; when full the oldest entry goes (a flood of spoofed sources costs a decode each,
never memory). A `Sender` keeps the reverse: destination `(host, port)` -> a sockaddr,
bounded the same way.

Errors never raise: EINTR is retried; EAGAIN ends a receive (0 datagrams) or drops the
unsent rest of a send; any other errno is counted (`errors`, by errno in `errnos`) and, for a
send, the message it belongs to is skipped and the rest sent. `sendmmsg` may send fewer than
asked (returns k < n): the rest is sent by further calls. Datagrams larger than a slot are
truncated by the kernel to the slot's size (MSG_TRUNC, `Receiver.truncated(i)`): give slots
room for the largest datagram you accept plus one byte, and such a datagram reads as oversize.

Invariants: a `Receiver`'s arena is reused by the next `receive`, so whatever points into it
(a pending `Sender` entry) must be flushed first. A `Sender` holds a reference to every
buffer and sockaddr its pending entries point to until `flush`.
"""

from __future__ import annotations

import collections
import ctypes
import errno as errno_codes
import socket
from collections.abc import Iterable
from typing import Any

Address = tuple[str, int]

MSG_DONTWAIT = 0x40  # <bits/socket.h>
MSG_TRUNC = 0x20
SOCKADDR_STORAGE = 128  # sizeof(struct sockaddr_storage)
SOCKADDR_IN = 16
SOCKADDR_IN6 = 28
MAX_SOURCES = 4096  # decoded source addresses kept per Receiver
MAX_DESTINATIONS = 4096  # encoded destination addresses kept per Sender
SLOT = 2048  # bytes per entry of a Sender's own arena (a datagram of ours is under 1,600)
_AGAIN = (errno_codes.EAGAIN, errno_codes.EWOULDBLOCK)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),  # socklen_t
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


_libc = ctypes.CDLL(None, use_errno=True)  # CDLL: the GIL is released during each call
_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int
_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
_sendmmsg.restype = ctypes.c_int

# Word indices into an mmsghdr array viewed as 'P' (pointer-sized) and 'I' (u32) words.
_PTR = ctypes.sizeof(ctypes.c_void_p)
_HDR = ctypes.sizeof(_MMsgHdr)
assert _HDR % _PTR == 0
_P_PER_MSG = _HDR // _PTR
_I_PER_MSG = _HDR // 4
_P_NAME = _MsgHdr.msg_name.offset // _PTR
_I_NAMELEN = _MsgHdr.msg_namelen.offset // 4
_I_FLAGS = _MsgHdr.msg_flags.offset // 4
_I_LEN = _MMsgHdr.msg_len.offset // 4
_P_PER_IOV = ctypes.sizeof(_IoVec) // _PTR
_STORAGE_P = SOCKADDR_STORAGE // _PTR


def _address_of(buffer: Any) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _messages(count: int) -> tuple[Any, Any, memoryview, memoryview, memoryview]:
    """An mmsghdr array with one iovec each (msg_iov set), in bytearrays, and word views
    of both."""
    raw, iov_raw = bytearray(count * _HDR), bytearray(count * ctypes.sizeof(_IoVec))
    msgs = (_MMsgHdr * count).from_buffer(raw)
    iovs = (_IoVec * count).from_buffer(iov_raw)
    for i in range(count):
        msgs[i].msg_hdr.msg_iov = ctypes.pointer(iovs[i])
        msgs[i].msg_hdr.msg_iovlen = 1
    words = memoryview(raw)
    return msgs, iovs, words.cast("P"), words.cast("I"), memoryview(iov_raw).cast("P")


def encode_sockaddr(addr: Address) -> bytes:
    """The sockaddr_in or sockaddr_in6 for (host, port); a host with '%scope' keeps it."""
    host, port = addr[0], addr[1]
    if ":" in host:
        name, _, scope = host.partition("%")
        scope_id = 0
        if scope:
            scope_id = int(scope) if scope.isdigit() else socket.if_nametoindex(scope)
        return (
            socket.AF_INET6.to_bytes(2, "little")
            + port.to_bytes(2, "big")
            + bytes(4)
            + socket.inet_pton(socket.AF_INET6, name)
            + scope_id.to_bytes(4, "little")
        )
    return (
        socket.AF_INET.to_bytes(2, "little")
        + port.to_bytes(2, "big")
        + socket.inet_aton(host)
        + bytes(8)
    )


def decode_sockaddr(raw: bytes | bytearray | memoryview) -> Address | None:
    """(host, port) of a sockaddr_in or sockaddr_in6 (None: another family)."""
    family = int.from_bytes(raw[:2], "little")
    port = int.from_bytes(raw[2:4], "big")
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, bytes(raw[4:8])), port
    if family == socket.AF_INET6:
        host = socket.inet_ntop(socket.AF_INET6, bytes(raw[8:24]))
        scope_id = int.from_bytes(raw[24:28], "little")
        if scope_id:
            try:
                host += "%" + socket.if_indextoname(scope_id)
            except OSError:
                host += f"%{scope_id}"
        return host, port
    return None


class Receiver:
    """Up to `count` datagrams per `receive`, each into its own slot of `arena`.

    After `receive(fd)` returned k: datagram i < k is `arena[i * stride + headroom :][:
    lengths[i]]` and came from `sources[i]` (when asked for). Slots are reused by the next
    call. One Receiver may serve any number of sockets, one call at a time."""

    def __init__(
        self, count: int, size: int, *, headroom: int = 0, max_sources: int = MAX_SOURCES
    ) -> None:
        if count < 1 or size < 1 or headroom < 0:
            raise ValueError("count and size must be positive, headroom not negative")
        self.count = count
        self.headroom = headroom
        # slots start on a word boundary, so a header written in front is aligned too
        self.stride = -(-(headroom + size) // 8) * 8
        self.arena = bytearray(count * self.stride)
        self.view = memoryview(self.arena)
        self.base = _address_of(self.arena)
        self.lengths: list[int] = [0] * count
        self.sources: list[Address] = [("", 0)] * count
        self.max_sources = max_sources
        self.size = size
        self.errors = 0
        self.errnos: collections.Counter[int] = collections.Counter()
        self._filled = count  # messages whose msg_namelen the kernel may have shortened
        self._names = bytearray(count * SOCKADDR_STORAGE)
        self._names_p = memoryview(self._names).cast("P")
        names_base = _address_of(self._names)
        self._cache: dict[Any, Address] = {}
        self._msgs, self._iovs, self._p, self._i, iov_p = _messages(count)
        self._msgs_at = ctypes.addressof(self._msgs)
        for i in range(count):
            iov_p[i * _P_PER_IOV] = self.base + i * self.stride + headroom
            iov_p[i * _P_PER_IOV + 1] = size
            self._p[i * _P_PER_MSG + _P_NAME] = names_base + i * SOCKADDR_STORAGE

    def receive(self, fd: int, *, sources: bool = True) -> int:
        """Receive what is queued on `fd`, up to `count` datagrams, without blocking.
        Returns how many came (0: none, or an error, counted)."""
        msgs_at, count = self._msgs_at, self.count
        ints = self._i
        # The kernel reads msg_namelen as the room it has and writes the length it used,
        # in the messages it filled: those get their room back.
        for i in range(self._filled):
            ints[i * _I_PER_MSG + _I_NAMELEN] = SOCKADDR_STORAGE
        self._filled = 0
        while True:
            got: int = _recvmmsg(fd, msgs_at, count, MSG_DONTWAIT, None)
            if got >= 0:
                break
            err = ctypes.get_errno()
            if err == errno_codes.EINTR:
                continue
            if err not in _AGAIN:
                # e.g. ECONNREFUSED on a connected socket (an ICMP port unreachable): the
                # error is reported once, datagrams behind it come with the next call
                self.errors += 1
                self.errnos[err] += 1
            return 0
        self._filled = got
        lengths = self.lengths
        for i in range(got):
            lengths[i] = ints[i * _I_PER_MSG + _I_LEN]
        if sources:
            self._decode_sources(got)
        return got

    def _decode_sources(self, got: int) -> None:
        names_p, out, cache = self._names_p, self.sources, self._cache
        for i in range(got):
            # IPv4: family, port and address are the first word of the sockaddr_in
            word = names_p[i * _STORAGE_P]
            if word & 0xFFFF == socket.AF_INET:
                key: Any = word
            else:
                at = i * SOCKADDR_STORAGE
                key = bytes(self._names[at : at + SOCKADDR_IN6])
            source = cache.get(key)
            if source is None:
                at = i * SOCKADDR_STORAGE
                source = decode_sockaddr(self._names[at : at + SOCKADDR_IN6]) or ("", 0)
                if len(cache) >= self.max_sources:
                    del cache[next(iter(cache))]  # the oldest
                cache[key] = source
            out[i] = source

    def truncated(self, i: int) -> bool:
        """Was datagram i of the last receive longer than its slot (MSG_TRUNC)? Its length
        then reads as the slot's size."""
        flags: int = self._i[i * _I_PER_MSG + _I_FLAGS]
        return bool(flags & MSG_TRUNC)

    def payload(self, i: int) -> memoryview:
        """Datagram i of the last receive (a view into the arena, valid until the next)."""
        start = i * self.stride + self.headroom
        return self.view[start : start + self.lengths[i]]


class Sender:
    """Up to `count` datagrams queued, then sent by one `flush(fd)` (sendmmsg).

    `add(address, length)` queues `length` bytes at a memory address (a Receiver's slot:
    `receiver.base + offset`), for a connected socket; `add_to` names a destination too.
    `add_buffer` queues any buffer (writable ones are not copied). After a flush, `sent`
    and `dropped` say what became of the last batch (`would_block` of `dropped`: left unsent
    because the socket's buffer was full); `errors`/`errnos` accumulate."""

    def __init__(
        self, count: int, *, connected: bool = False, max_destinations: int = MAX_DESTINATIONS
    ) -> None:
        if count < 1:
            raise ValueError("count must be positive")
        self.count = count
        self.connected = connected
        self.pending = 0
        self.sent = 0
        self.dropped = 0
        self.would_block = 0
        self.errors = 0
        self.errnos: collections.Counter[int] = collections.Counter()
        self.max_destinations = max_destinations
        self._msgs, self._iovs, self._p, self._i, self._iov_p = _messages(count)
        self._msgs_at = ctypes.addressof(self._msgs)
        self._keep: list[Any] = [None] * count  # what pending entries point into
        self._names: dict[Address, tuple[Any, int, int]] = {}
        self._arena = bytearray(count * SLOT)  # `add_buffer`'s copies: entry j at j * SLOT
        self._arena_c = (ctypes.c_char * len(self._arena)).from_buffer(self._arena)
        self._arena_at = ctypes.addressof(self._arena_c)

    def full(self) -> bool:
        return self.pending >= self.count

    def add(self, address: int, length: int) -> None:
        """Queue `length` bytes at `address` (to the connected peer). Caller checks `full`."""
        j = self.pending
        iov_p = self._iov_p
        iov_p[j * _P_PER_IOV] = address
        iov_p[j * _P_PER_IOV + 1] = length
        if not self.connected:
            self._p[j * _P_PER_MSG + _P_NAME] = 0
        self.pending = j + 1

    def add_to(self, address: int, length: int, dest: Address) -> None:
        """Queue `length` bytes at `address` to `dest` (host, port)."""
        j = self.pending
        name = self._names.get(dest)
        if name is None:
            name = self._name(dest)
        keep, name_at, name_len = name
        p = self._p
        p[j * _P_PER_MSG + _P_NAME] = name_at
        self._i[j * _I_PER_MSG + _I_NAMELEN] = name_len
        iov_p = self._iov_p
        iov_p[j * _P_PER_IOV] = address
        iov_p[j * _P_PER_IOV + 1] = length
        self._keep[j] = keep  # (an evicted name stays alive until the flush)
        self.pending = j + 1

    def _name(self, dest: Address) -> tuple[Any, int, int]:
        raw = encode_sockaddr(dest)
        buf = ctypes.create_string_buffer(raw, len(raw))
        names = self._names
        if len(names) >= self.max_destinations:
            del names[next(iter(names))]  # the oldest
        name = names[dest] = (buf, ctypes.addressof(buf), len(raw))
        return name

    def add_buffer(self, data: Any, dest: Address | None = None) -> None:
        """Queue a buffer (bytes, bytearray, memoryview). A writable one is sent from where
        it is; `bytes` of up to `SLOT` are copied into the sender's own arena (one copy, no
        allocation), another read-only one into a buffer of its own. Caller checks `full`."""
        if type(data) is bytes and len(data) <= SLOT:
            j = self.pending
            start = j * SLOT
            self._arena[start : start + len(data)] = data
            if dest is None:
                self.add(self._arena_at + start, len(data))
            else:
                self.add_to(self._arena_at + start, len(data), dest)
            return
        view = memoryview(data).cast("B")
        length = view.nbytes
        if length == 0:
            keep: Any = None
            address = 0
        elif view.readonly:
            keep = ctypes.create_string_buffer(view.tobytes(), length)
            address = ctypes.addressof(keep)
        else:
            keep = (ctypes.c_char * length).from_buffer(view)
            address = ctypes.addressof(keep)
        j = self.pending
        if dest is None:
            self.add(address, length)
        else:
            self.add_to(address, length, dest)
            keep = (keep, self._keep[j])
        self._keep[j] = keep

    def flush(self, fd: int) -> int:
        """Send what is queued on `fd`. Returns how many were sent; `dropped` is the rest
        (EAGAIN: the socket's buffer is full; other errors: that datagram only)."""
        n = self.pending
        done = dropped = would_block = 0
        msgs_at = self._msgs_at
        while done < n:
            k: int = _sendmmsg(fd, msgs_at + done * _HDR, n - done, MSG_DONTWAIT)
            if k > 0:
                done += k  # fewer than asked: carry on with the rest
                continue
            err = ctypes.get_errno() if k < 0 else errno_codes.EIO
            if err == errno_codes.EINTR:
                continue
            self.errors += 1
            self.errnos[err] += 1
            if err in _AGAIN:
                would_block = n - done
                dropped += would_block
                break
            dropped += 1  # this one datagram failed (ECONNREFUSED, EMSGSIZE, ...)
            done += 1
        self.sent = n - dropped
        self.dropped = dropped
        self.would_block = would_block
        self.pending = 0
        keep = self._keep
        for j in range(n):
            keep[j] = None
        return self.sent


def send_batch(
    sock: socket.socket | int, items: Iterable[tuple[Any, Address | None]], count: int = 64
) -> tuple[int, int]:
    """Send (buffer, address or None) pairs on `sock` with as few sendmmsg calls as fit
    `count` at a time. Returns (sent, dropped). A convenience; hot paths keep a Sender."""
    fd = sock if isinstance(sock, int) else sock.fileno()
    sender = Sender(count)
    sent = dropped = 0
    for data, dest in items:
        if sender.full():
            sent += sender.flush(fd)
            dropped += sender.dropped
        sender.add_buffer(data, dest)
    if sender.pending:
        sent += sender.flush(fd)
        dropped += sender.dropped
    return sent, dropped

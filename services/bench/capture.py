"""A passive capture of one UDP port on loopback: the transceiver's residence under load.

`bench echo` puts a forwarding tap in front of the media socket; at a hundred calls and more
that tap would be a Python hop forwarding 10,000 datagrams a second on the bench's core, its
own delay inside every "residence" it stamps. This one forwards nothing: an AF_PACKET socket
on `lo` (CAP_NET_RAW) with a classic BPF filter in the kernel (IPv4 UDP to or from the port,
the receiving copy only, first `SNAP` bytes) sees each datagram as the kernel hands it over,
with the kernel's timestamp (SO_TIMESTAMPNS). A relay datagram into the transceiver is
stamped when the relay sent it (before it waits in the transceiver's socket queue), the echo
when the transceiver sent it: what `echo.residence` matches, per call, burst onset to burst
onset (the client is in each datagram's PROXY v2 header).

Run as `python -m firsthop.services.bench.capture PORT`: prints "ready" (or "error REASON"
when the socket cannot be had), then on each "dump" one JSON line, `echo.residence`'s
result over what it saw since the last dump plus the kernel's drop count; exits at EOF.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import socket
import struct
import sys
from typing import Any

from firsthop.services.bench.echo import residence
from firsthop.shared.wire.proxy_v2 import ProxyError, parse_proxy_v2

SNAP = 192  # Ethernet 14 + IPv4 20 + UDP 8 + PROXY v2 28 (+ TLVs) + the RTP header's first bytes
ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
SKF_AD_PKTTYPE = 0xFFFFF000 + 4  # SKF_AD_OFF + SKF_AD_PKTTYPE (linux/filter.h)


def bpf_program(port: int) -> list[tuple[int, int, int, int]]:
    """Classic BPF (code, jt, jf, k) for Ethernet frames on lo: keep the first SNAP bytes of
    a received (not the outgoing copy) IPv4 UDP datagram, unfragmented, to or from `port`."""
    drop, keep = 14, 13
    return [
        (0x28, 0, 0, SKF_AD_PKTTYPE),  # 0: ld pkttype
        (0x15, drop - 2, 0, PACKET_OUTGOING),  # 1: the sender's copy: drop
        (0x28, 0, 0, 12),  # 2: ldh ethertype
        (0x15, 0, drop - 4, 0x0800),  # 3: IPv4 or drop
        (0x30, 0, 0, 23),  # 4: ldb protocol
        (0x15, 0, drop - 6, 17),  # 5: UDP or drop
        (0x28, 0, 0, 20),  # 6: ldh flags + fragment offset
        (0x45, drop - 8, 0, 0x1FFF),  # 7: a fragment: drop
        (0xB1, 0, 0, 14),  # 8: ldxb 4 * (ihl)
        (0x48, 0, 0, 14),  # 9: ldh source port
        (0x15, keep - 11, 0, port),  # 10: from the port: keep
        (0x48, 0, 0, 16),  # 11: ldh destination port
        (0x15, 0, 1, port),  # 12: to the port: keep, else drop
        (0x06, 0, 0, SNAP),  # 13: keep
        (0x06, 0, 0, 0),  # 14: drop
    ]


def open_capture(port: int) -> tuple[socket.socket, Any]:
    """The filtered AF_PACKET socket (and the filter's buffer, which must outlive it)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    code = b"".join(struct.pack("HBBI", *insn) for insn in bpf_program(port))
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    try:  # past net.core.rmem_max: CAP_NET_ADMIN, which CAP_NET_RAW alone does not give
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)  # (capped, drops counted)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind(("lo", ETH_P_ALL))
    return sock, buf


def note(frame: bytes, stamp: int, port: int) -> tuple[int, str, str, int] | None:
    """(stamp ns, "up"|"down", client, SRTP bytes) of an RTP datagram to (up) or from (down)
    the port, framed by the relay; None for anything else (STUN, RTCP, DTLS, unframed)."""
    try:
        ihl = (frame[14] & 0x0F) * 4
        sport, dport, length = struct.unpack_from("!HHH", frame, 14 + ihl)
        header = parse_proxy_v2(frame[14 + ihl + 8 :])
    except (IndexError, struct.error, ProxyError):
        return None
    rtp = frame[14 + ihl + 8 + header.payload_offset :]
    # RFC 7983: 128..191 is RTP/RTCP; RTCP packet types 192..223 in the second byte.
    if len(rtp) < 2 or not 128 <= rtp[0] <= 191 or 192 <= rtp[1] <= 223:
        return None
    size = length - 8 - header.payload_offset
    if dport == port:
        return stamp, "up", f"{header.src[0]}:{header.src[1]}", size
    if sport == port:
        return stamp, "down", f"{header.dst[0]}:{header.dst[1]}", size
    return None


def _drops(sock: socket.socket) -> int:
    _, dropped = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    return int(dropped)  # since the last read (the kernel resets them)


def main(port: int, period_s: float) -> None:
    try:
        sock, _filter = open_capture(port)
    except OSError as exc:
        print(f"error {exc}", flush=True)
        return
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "packet")
    selector.register(0, selectors.EVENT_READ, "control")
    frames: list[tuple[int, bytes]] = []
    control = b""
    space = socket.CMSG_SPACE(16)
    _drops(sock)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "packet":
                # Drain what is queued: the parsing waits until "dump", off the clock.
                while True:
                    try:
                        data, ancillary, _, _ = sock.recvmsg(SNAP, space, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break
                    stamp = 0
                    for level, kind, raw in ancillary:
                        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                            sec, nsec = struct.unpack("qq", raw[:16])
                            stamp = sec * 1_000_000_000 + nsec
                    frames.append((stamp, data))
                continue
            chunk = os.read(0, 4096)
            if not chunk:
                return
            control += chunk
            while b"\n" in control:
                line, _, control = control.partition(b"\n")
                if line.strip() == b"dump":
                    records = [r for s, f in frames if (r := note(f, s, port)) is not None]
                    found = residence(records, period_s)
                    found["captured"] = len(frames)
                    found["kernel_drops"] = _drops(sock)
                    frames = []
                    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)

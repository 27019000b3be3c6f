"""Server-sent events as they crossed the wire: a small pcap reader for ``bench_proxy.py``.

Theory of operation
-------------------
A capture (``tcpdump -w``) of loopback HTTP/1.1 traffic in, and for each HTTP exchange the
request's body and the response's SSE events out, each event dated by the capture time of
the packet that carried its **last byte** (its terminating blank line): the moment its
sender's TCP stack handed the whole event to the network, whatever the receiver did next.

Stages, each a plain function over values (nothing here does I/O):

1. :func:`read_pcap`: the savefile's global header and record headers (pcap-savefile(5),
   https://www.tcpdump.org/manpages/pcap-savefile.5.html: magic 0xa1b2c3d4 for microsecond
   and 0xa1b23c4d for nanosecond time stamps, written in the writer's byte order, so the
   magic read swapped means every field is swapped; a 24-byte global header whose last
   field is the link-layer type, then per packet a 16-byte header: seconds, micro- or
   nanoseconds, captured length, original length).
2. :func:`tcp_segment`: link layer (https://www.tcpdump.org/linktypes.html: LINKTYPE_NULL 0,
   a 4-byte address family in the writer's byte order; LINKTYPE_ETHERNET 1, which is what
   Linux's ``lo`` gives, with zero MAC addresses; LINKTYPE_RAW 101; LINKTYPE_LINUX_SLL 113,
   a 16-byte header ending with the protocol type, what ``-i any`` gave before libpcap 1.10;
   LINKTYPE_LINUX_SLL2 276, a 20-byte header starting with it), then IPv4 (RFC 791: header
   length in 32-bit words, total length, protocol) or IPv6 (RFC 8200: 40 bytes, next header,
   payload length; hop-by-hop, routing and destination options skipped), then TCP (RFC 9293:
   ports, sequence number, data offset in 32-bit words, flags). Anything else is skipped.
3. :func:`reassemble`: per direction of each connection, the bytes in sequence order (a new
   SYN on the same addresses starts a new connection; sequence numbers are taken modulo
   2**32 from the first one seen; a retransmitted byte keeps the time of its first capture;
   at a hole, missing from the capture, the direction stops and says so).
4. :func:`exchanges`: HTTP/1.1 messages of both directions of a connection, requests and
   responses paired in order (RFC 9112: no pipelining by the clients measured, so the n-th
   response answers the n-th request), bodies by ``Content-Length`` or chunked coding.
5. :func:`sse_events`: a response body cut on blank lines (the WHATWG event-stream rules:
   CRLF, LF or CR end a line; ``data:`` lines joined with LF; comments skipped).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "Direction",
    "Exchange",
    "PcapError",
    "Segment",
    "connections",
    "exchanges",
    "read_pcap",
    "reassemble",
    "sse_events",
    "tcp_segment",
]


class PcapError(ValueError):
    """The bytes are not a pcap savefile this reader understands (or are cut short)."""


# --- 1. the savefile ------------------------------------------------------------------------

MAGIC_US = 0xA1B2C3D4  # pcap-savefile(5): time stamps in seconds and microseconds
MAGIC_NS = 0xA1B23C4D  # ... in seconds and nanoseconds
PCAPNG = 0x0A0D0D0A  # a pcapng Section Header Block (another format: tcpdump -w writes pcap)


def read_pcap(data: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    """The link-layer type and the packets ``(time stamp in ns, captured bytes)`` of a pcap
    savefile. Raises :class:`PcapError` for another magic, or a header or packet cut short
    (a capture still being written may end inside its last record: that one is an error too,
    so stop the writer first)."""
    if len(data) < 24:
        raise PcapError(f"{len(data)} bytes: shorter than a pcap global header (24)")
    for order in "<>":
        (magic,) = struct.unpack_from(order + "I", data)
        if magic in (MAGIC_US, MAGIC_NS):
            break
    else:
        if struct.unpack_from("<I", data)[0] == PCAPNG:
            raise PcapError("a pcapng file: write pcap (tcpdump -w without --pcapng)")
        raise PcapError(f"not a pcap savefile (magic {data[:4].hex()})")
    scale = 1000 if magic == MAGIC_US else 1
    # magic, major, minor, reserved1, reserved2, snaplen, linktype (FCS bits in the top four)
    linktype = struct.unpack_from(order + "IHHIIII", data)[6] & 0x0FFFFFFF
    record = struct.Struct(order + "IIII")
    packets: list[tuple[int, bytes]] = []
    at = 24
    while at < len(data):
        if at + 16 > len(data):
            raise PcapError(f"a record header cut short at byte {at}")
        sec, frac, caplen, _wirelen = record.unpack_from(data, at)
        at += 16
        if at + caplen > len(data):
            raise PcapError(f"a packet of {caplen} bytes cut short at byte {at}")
        packets.append((sec * 1_000_000_000 + frac * scale, data[at : at + caplen]))
        at += caplen
    return linktype, packets


# --- 2. headers -----------------------------------------------------------------------------

ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN = 0x0800, 0x86DD, 0x8100
IPPROTO_TCP = 6
IPV6_SKIPPED = {0, 43, 60}  # hop-by-hop, routing, destination options: (next, len/8 - 1)
SYN, RST, FIN = 0x02, 0x04, 0x01


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One TCP segment as captured."""

    at_ns: int
    """The packet's capture time stamp."""
    src: tuple[str, int]
    """Source address and port."""
    dst: tuple[str, int]
    """Destination address and port."""
    seq: int
    """The sequence number of its first byte (of the SYN, for a SYN)."""
    flags: int
    """TCP flags (SYN, FIN, RST...)."""
    payload: bytes
    """Its data (empty for a bare ACK)."""


def tcp_segment(linktype: int, frame: bytes, at_ns: int) -> Segment | None:
    """The TCP segment in one captured frame, or None (not IP, not TCP, a fragment, an
    unknown link type, or cut short by the capture's snapshot length)."""
    try:
        network = _network(linktype, frame)
        if network is None:
            return None
        ethertype, ip = network
        if ethertype == ETHERTYPE_IPV4:
            parsed = _ipv4(ip)
        elif ethertype == ETHERTYPE_IPV6:
            parsed = _ipv6(ip)
        else:
            return None
        if parsed is None:
            return None
        src, dst, tcp = parsed
        sport, dport, seq, _ack, offset_flags = struct.unpack_from("!HHIIH", tcp)
        header = (offset_flags >> 12) * 4
        if header < 20 or header > len(tcp):
            return None
        return Segment(
            at_ns=at_ns,
            src=(src, sport),
            dst=(dst, dport),
            seq=seq,
            flags=offset_flags & 0x1FF,
            payload=tcp[header:],
        )
    except struct.error:  # a header cut short
        return None


def _network(linktype: int, frame: bytes) -> tuple[int, bytes] | None:
    """(ethertype, the network-layer bytes) under the link-layer header."""
    if linktype == 1:  # LINKTYPE_ETHERNET: dst MAC, src MAC, type (then maybe one 802.1Q tag)
        ethertype, at = struct.unpack_from("!H", frame, 12)[0], 14
        if ethertype == ETHERTYPE_VLAN:
            ethertype, at = struct.unpack_from("!H", frame, 16)[0], 18
        return ethertype, frame[at:]
    if linktype == 113:  # LINKTYPE_LINUX_SLL: type, ARPHRD, address length, address[8], proto
        return struct.unpack_from("!H", frame, 14)[0], frame[16:]
    if linktype == 276:  # LINKTYPE_LINUX_SLL2: proto, reserved, ifindex, ARPHRD, type, len, addr
        return struct.unpack_from("!H", frame, 0)[0], frame[20:]
    if linktype == 101:  # LINKTYPE_RAW: the IP version in the first nibble
        version = frame[0] >> 4
        return (ETHERTYPE_IPV4 if version == 4 else ETHERTYPE_IPV6), frame
    if linktype == 0:  # LINKTYPE_NULL: the address family, in the writer's byte order
        family = struct.unpack_from("<I", frame)[0]
        if family > 0xFFFF:
            family = struct.unpack_from(">I", frame)[0]
        return (ETHERTYPE_IPV4 if family == 2 else ETHERTYPE_IPV6), frame[4:]
    return None


def _ipv4(ip: bytes) -> tuple[str, str, bytes] | None:
    version_ihl, _tos, total, _ident, frag, _ttl, proto = struct.unpack_from("!BBHHHBB", ip)
    header = (version_ihl & 0x0F) * 4
    if version_ihl >> 4 != 4 or proto != IPPROTO_TCP or frag & 0x3FFF or header < 20:
        return None  # not IPv4, not TCP, or a fragment (more fragments, or an offset)
    if total > len(ip):
        return None  # cut short by the snapshot length: its data would be wrong
    src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
    return src, dst, ip[header:total]  # total: without an Ethernet frame's padding


def _ipv6(ip: bytes) -> tuple[str, str, bytes] | None:
    if ip[0] >> 4 != 6:
        return None
    payload_len, nxt = struct.unpack_from("!HB", ip, 4)
    if 40 + payload_len > len(ip):
        return None
    src, dst = _ipv6_text(ip[8:24]), _ipv6_text(ip[24:40])
    rest = ip[40 : 40 + payload_len]
    while nxt in IPV6_SKIPPED:
        nxt, length = rest[0], (rest[1] + 1) * 8
        rest = rest[length:]
    return (src, dst, rest) if nxt == IPPROTO_TCP else None


def _ipv6_text(raw: bytes) -> str:
    return ":".join(f"{g:x}" for g in struct.unpack("!8H", raw))  # uncompressed, one spelling


# --- 3. TCP directions ----------------------------------------------------------------------


@dataclass(slots=True)
class Direction:
    """One direction of one TCP connection, its bytes in sequence order."""

    src: tuple[str, int]
    dst: tuple[str, int]
    generation: int = 0
    """0 for the first connection on these addresses in the capture, 1 for the next..."""
    data: bytearray = field(default_factory=bytearray)
    starts: list[int] = field(default_factory=list)
    """Offsets in ``data`` where a packet's new bytes begin..."""
    times: list[int] = field(default_factory=list)
    """... and that packet's time stamp (ns)."""
    hole_at: int | None = None
    """The offset of the first byte missing from the capture (the data ends there), or None."""

    def time_at(self, offset: int) -> int:
        """The time stamp of the packet that carried the byte at ``offset``."""
        if not 0 <= offset < len(self.data):
            raise IndexError(offset)
        return self.times[bisect_right(self.starts, offset) - 1]


Pair = tuple[tuple[str, int], tuple[str, int]]


def reassemble(segments: Iterable[Segment]) -> list[Direction]:
    """Every direction that carried data, in the order its first segment was captured. A SYN
    with a new sequence number on addresses already seen starts a new connection (its
    directions get the next ``generation``; a retransmitted SYN does not)."""
    flows: dict[tuple[Pair, int], list[Segment]] = {}
    syns: dict[tuple[Pair, int], int] = {}
    generation: dict[Pair, int] = {}
    for seg in segments:
        pair = (seg.src, seg.dst)
        key = (pair, generation.get(pair, 0))
        if seg.flags & SYN:
            if key in flows and syns.get(key) != seg.seq:
                generation[pair] = key[1] + 1
                key = (pair, key[1] + 1)
            syns.setdefault(key, seg.seq)
        flows.setdefault(key, []).append(seg)
    out = [_direction(segs, gen) for (_, gen), segs in flows.items()]
    return [d for d in out if d.data]


def _direction(segs: list[Segment], generation: int) -> Direction:
    syn = next((s for s in segs if s.flags & SYN), None)
    first = (syn.seq + 1) if syn is not None else segs[0].seq
    # A segment captured before an earlier-numbered one (reordered) still sorts by number:
    # positions relative to the first, modulo 2**32, and captures in order among equals.
    carrying = [
        ((s.seq + (1 if s.flags & SYN else 0) - first) % 2**32, i, s)
        for i, s in enumerate(segs)
        if s.payload
    ]
    carrying.sort(key=lambda x: (x[0], x[1]))
    d = Direction(segs[0].src, segs[0].dst, generation)
    for start, _, seg in carrying:
        end = start + len(seg.payload)
        if start > 2**31:  # before the first byte seen (capture began mid-segment): skip
            continue
        if end <= len(d.data):
            continue  # a retransmission of bytes already held: they keep their first time
        if start > len(d.data):
            d.hole_at = len(d.data)
            break
        d.starts.append(len(d.data))
        d.times.append(seg.at_ns)
        d.data += seg.payload[len(d.data) - start :]
    return d


def connections(directions: Iterable[Direction]) -> list[tuple[Direction, Direction | None]]:
    """(client to server, server to client or None) per connection, the client's direction
    being the one that starts with an HTTP request line."""
    by_key = {(d.src, d.dst, d.generation): d for d in directions}
    return [
        (d, by_key.get((d.dst, d.src, d.generation)))
        for d in by_key.values()
        if _request_line(d.data)
    ]


METHODS = (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"PATCH ")


def _request_line(data: bytes | bytearray) -> bool:
    return bytes(data[:8]).startswith(METHODS)


# --- 4. HTTP/1.1 ----------------------------------------------------------------------------


@dataclass(slots=True)
class Body:
    """A message body, its chunked coding removed, each byte's offset in its direction kept."""

    data: bytearray = field(default_factory=bytearray)
    starts: list[int] = field(default_factory=list)
    """Offsets in ``data`` where a piece begins..."""
    raw: list[int] = field(default_factory=list)
    """... and that piece's offset in the direction's bytes."""
    complete: bool = True
    """False when the direction ended (or had a hole) before the body's end."""

    def add(self, raw_at: int, piece: bytes | bytearray) -> None:
        if piece:
            self.starts.append(len(self.data))
            self.raw.append(raw_at)
            self.data += piece

    def raw_offset(self, offset: int) -> int:
        """Where the body's byte at ``offset`` lies in its direction."""
        i = bisect_right(self.starts, offset) - 1
        return self.raw[i] + offset - self.starts[i]


@dataclass(slots=True, kw_only=True)
class Exchange:
    """One HTTP request and the response that answered it (None: not captured)."""

    request_line: str
    request_body: Body
    status: int | None
    response_headers: dict[str, str]
    response_body: Body | None
    response: Direction | None
    """The direction the response came on (for the time of its bytes)."""


def exchanges(client: Direction, server: Direction | None) -> list[Exchange]:
    """The requests on ``client`` paired in order with the responses on ``server`` (1xx
    interim responses skipped). Raises :class:`PcapError` on a malformed message head or
    chunk size (a message cut short by the capture's end is returned with
    ``complete=False``)."""
    out: list[Exchange] = []
    at = 0
    requests: list[tuple[str, Body]] = []
    while at < len(client.data):
        head = _head(client.data, at)
        if head is None:
            break
        line, headers, at = head
        body, at = _body(client.data, at, headers, until_end=False)
        requests.append((line, body))
    responses: list[tuple[int, dict[str, str], Body]] = []
    at = 0
    data = server.data if server is not None else bytearray()
    while at < len(data) and len(responses) < len(requests):
        head = _head(data, at)
        if head is None:
            break
        line, headers, at = head
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise PcapError(f"not an HTTP status line: {line[:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            continue
        body, at = _body(data, at, headers, until_end=True)
        responses.append((status, headers, body))
    for i, (line, body) in enumerate(requests):
        answered = i < len(responses)
        out.append(
            Exchange(
                request_line=line,
                request_body=body,
                status=responses[i][0] if answered else None,
                response_headers=responses[i][1] if answered else {},
                response_body=responses[i][2] if answered else None,
                response=server,
            )
        )
    return out


def _head(data: bytearray, at: int) -> tuple[str, dict[str, str], int] | None:
    """(start line, headers with lower-case names, offset after the head), or None if the
    head is not all there."""
    end = data.find(b"\r\n\r\n", at)
    if end < 0:
        return None
    lines = bytes(data[at:end]).decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        name, sep, value = raw.partition(":")
        if not sep:
            raise PcapError(f"not an HTTP header line: {raw[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, end + 4


def _body(
    data: bytearray, at: int, headers: dict[str, str], *, until_end: bool
) -> tuple[Body, int]:
    """The body starting at ``at`` and the offset after it. Without a length or chunked
    coding, a response's body runs to the direction's end (``until_end``), a request's is
    empty."""
    body = Body()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _chunked(data, at, body)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise PcapError(f"Content-Length {length!r}")
        end = at + int(length)
        body.complete = end <= len(data)
        end = min(end, len(data))
        body.add(at, data[at:end])
        return body, end
    if until_end:
        body.add(at, data[at:])
        return body, len(data)
    return body, at


def _chunked(data: bytearray, at: int, body: Body) -> tuple[Body, int]:
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            body.complete = False
            return body, len(data)
        size_text = bytes(data[at:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise PcapError(f"not a chunk size: {size_text[:40]!r}") from None
        start = line_end + 2
        if size == 0:  # the last chunk, then trailer fields (none here) and CRLF
            end = data.find(b"\r\n", start)
            return body, (end + 2 if end >= 0 else len(data))
        body.add(start, data[start : start + size])
        if start + size + 2 > len(data):
            body.complete = False
            return body, len(data)
        at = start + size + 2


# --- 5. server-sent events ------------------------------------------------------------------


def sse_events(body: Body, direction: Direction) -> list[tuple[int, bytes]]:
    """Each event of an event stream that has data: (the time stamp of the packet that
    carried its last byte, its data lines joined with LF). An event the body ends inside
    (no blank line after it) is not included."""
    out: list[tuple[int, bytes]] = []
    text = bytes(body.data)
    lines: list[bytes] = []
    at = 0
    while at < len(text):
        cr, lf = text.find(b"\r", at), text.find(b"\n", at)
        if cr < 0 and lf < 0:
            break  # an unfinished line
        end = lf if cr < 0 or 0 <= lf < cr else cr
        if text[end : end + 2] == b"\r\n":
            last = end + 1
        elif end == cr and end + 1 == len(text):
            break  # a CR at the end: the LF of a CRLF may be yet to come
        else:
            last = end
        line, at = text[at:end], last + 1
        if line:
            lines.append(line)
            continue
        payload = [_data_value(ln) for ln in lines if ln == b"data" or ln.startswith(b"data:")]
        lines = []
        if payload:
            out.append((direction.time_at(body.raw_offset(last)), b"\n".join(payload)))
    return out


def _data_value(line: bytes) -> bytes:
    """A ``data`` field's value: after the colon, one leading space removed."""
    return line[5:].removeprefix(b" ")

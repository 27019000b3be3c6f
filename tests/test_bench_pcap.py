"""The pcap reader behind bench_proxy.py's wire columns (benchmarks/pcap_wire.py).

Each pcap here is built byte by byte by the test (pcap-savefile(5),
https://www.tcpdump.org/manpages/pcap-savefile.5.html; link types from
https://www.tcpdump.org/linktypes.html), so the suite needs no tcpdump; one test captures a
real loopback exchange with tcpdump where it can, and skips (CI included) where it cannot.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    """A module of benchmarks/ by file (benchmarks/ is not a package; bench_proxy imports
    pcap_wire by its plain name, as `python benchmarks/bench_proxy.py` finds it)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pw = _load("pcap_wire")
bench = _load("bench_proxy")

T0 = 1_765_000_000  # a time stamp's seconds
CLIENT, SERVER = ("127.0.0.1", 40000), ("127.0.0.1", 8000)
S1, WARM, LIVE = "51" * 8, "a0" * 8, "1e" * 8  # streams' tags, as bench_proxy makes them
SYN, ACK, PSH = 0x02, 0x10, 0x08


# --- building packets ---------------------------------------------------------------------


def tcp(src, dst, seq, payload=b"", flags=ACK | PSH):
    fields = (src[1], dst[1], seq % 2**32, 0, (5 << 12) | flags, 65535, 0, 0)
    return struct.pack("!HHIIHHHH", *fields) + payload


def ipv4(src, dst, segment, *, frag=0):
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(segment),
        1,
        frag,
        64,
        6,
        0,
        socket.inet_aton(src[0]),
        socket.inet_aton(dst[0]),
    )
    return header + segment


def ipv6(src, dst, segment, *, hop_by_hop=False):
    nxt = 0 if hop_by_hop else 6
    ext = bytes([6, 0, 1, 4, 0, 0, 0, 0]) if hop_by_hop else b""  # next: TCP, 8 bytes, PadN
    header = struct.pack("!IHBB", 6 << 28, len(ext) + len(segment), nxt, 64)
    return (
        header
        + socket.inet_pton(socket.AF_INET6, src[0])
        + socket.inet_pton(socket.AF_INET6, dst[0])
        + ext
        + segment
    )


def ethernet(ip, ethertype=0x0800, pad=0):
    return bytes(12) + struct.pack("!H", ethertype) + ip + bytes(pad)  # lo: zero MACs


def sll(ip, ethertype=0x0800):
    return struct.pack("!HHH8sH", 0, 772, 0, bytes(8), ethertype) + ip  # LINUX_SLL, 16 bytes


def sll2(ip, ethertype=0x0800):
    return struct.pack("!HHIHBB8s", ethertype, 0, 1, 772, 0, 0, bytes(8)) + ip  # 20 bytes


def pcap(frames, *, linktype=1, nano=True, order="<"):
    """A savefile of ``frames``: (ns since T0, frame bytes)."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = struct.pack(order + "IHHIIII", magic, 2, 4, 0, 0, 262144, linktype)
    for at_ns, frame in frames:
        frac = at_ns % 1_000_000_000 if nano else at_ns % 1_000_000_000 // 1000
        out += struct.pack(
            order + "IIII", T0 + at_ns // 1_000_000_000, frac, len(frame), len(frame)
        )
        out += frame
    return out


def packet(src, dst, seq, payload=b"", flags=ACK | PSH):
    return ethernet(ipv4(src, dst, tcp(src, dst, seq, payload, flags)))


def segments(data):
    linktype, packets = pw.read_pcap(data)
    return [s for at, f in packets if (s := pw.tcp_segment(linktype, f, at)) is not None]


def ms(n):
    return n * 1_000_000


def request(user, path="/v1/chat/completions"):
    """A request for the stream ``user`` (16 hex digits: tagged as bench_proxy tags it)."""
    question = {"role": "user", "content": f"Weather? (bench stream {user})"}
    body = json.dumps({"model": "bench", "messages": [question], "user": user}).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data):
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse(obj):
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def text_event(text):
    return sse({"choices": [{"index": 0, "delta": {"content": text}}]})


def args_event(index, fragment):
    call = {"index": index, "function": {"arguments": fragment}}
    return sse({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})


# --- the savefile -------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("nano", [True, False])
def test_read_pcap_time_stamps_in_either_byte_order_and_precision(order, nano):
    frame = packet(CLIENT, SERVER, 1, b"x")
    linktype, packets = pw.read_pcap(
        pcap([(1_500_000_123, frame)], nano=nano, order=order, linktype=113)
    )
    assert linktype == 113
    want = (T0 + 1) * 1_000_000_000 + (500_000_123 if nano else 500_000_000)
    assert packets == [(want, frame)]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x0a\x0d\x0d\x0a" + bytes(40), "pcapng"),
        (b"\xde\xad\xbe\xef" + bytes(40), "not a pcap"),
        (bytes(10), "shorter"),
        (pcap([(0, b"abcdef")])[:-2], "cut short"),
        (pcap([(0, b"abcdef")])[:30], "record header cut short"),
    ],
)
def test_read_pcap_refuses_what_it_cannot_read(data, says):
    with pytest.raises(pw.PcapError, match=says):
        pw.read_pcap(data)


# --- headers ------------------------------------------------------------------------------


def test_tcp_segment_over_each_link_type_and_ip_version():
    seg = tcp(CLIENT, SERVER, 7, b"hello")
    v6c, v6s = ("::1", 40000), ("::1", 8000)
    seg6 = tcp(v6c, v6s, 7, b"hello")
    frames = {
        1: ethernet(ipv4(CLIENT, SERVER, seg), pad=6),  # padding after the IP packet
        113: sll(ipv4(CLIENT, SERVER, seg)),
        276: sll2(ipv4(CLIENT, SERVER, seg)),
        101: ipv4(CLIENT, SERVER, seg),
        0: struct.pack("<I", 2) + ipv4(CLIENT, SERVER, seg),
    }
    for linktype, frame in frames.items():
        got = pw.tcp_segment(linktype, frame, 5)
        assert got == pw.Segment(
            at_ns=5, src=CLIENT, dst=SERVER, seq=7, flags=ACK | PSH, payload=b"hello"
        ), linktype
    for frame in (
        ethernet(ipv6(v6c, v6s, seg6), ethertype=0x86DD),
        ethernet(ipv6(v6c, v6s, seg6, hop_by_hop=True), ethertype=0x86DD),
    ):
        got = pw.tcp_segment(1, frame, 5)
        assert got is not None
        loopback = "0:0:0:0:0:0:0:1"
        assert (got.src, got.dst, got.payload) == ((loopback, 40000), (loopback, 8000), b"hello")


def test_tcp_segment_skips_what_is_not_a_whole_tcp_segment():
    seg = tcp(CLIENT, SERVER, 7, b"hello")
    udp = bytearray(ipv4(CLIENT, SERVER, seg))
    udp[9] = 17
    assert pw.tcp_segment(1, ethernet(bytes(udp)), 0) is None
    assert pw.tcp_segment(1, ethernet(ipv4(CLIENT, SERVER, seg, frag=0x2000)), 0) is None
    assert pw.tcp_segment(1, ethernet(ipv4(CLIENT, SERVER, seg))[:-2], 0) is None  # snaplen
    assert pw.tcp_segment(1, ethernet(ipv4(CLIENT, SERVER, seg), ethertype=0x0806), 0) is None
    assert pw.tcp_segment(147, ipv4(CLIENT, SERVER, seg), 0) is None  # a link type we lack
    assert pw.tcp_segment(1, bytes(10), 0) is None


# --- reassembly, HTTP, events -------------------------------------------------------------


def exchange_capture(user="u1", *, drop=None, isn=2**32 - 30, client_isn=1000):
    """One exchange, with its trouble: the request in two packets; the response's second
    event split over two packets captured in reverse order; an early packet retransmitted
    late. The server's sequence numbers wrap around 2**32 within the response."""
    req = request(user)
    first, second, third = text_event("Hel"), text_event("lo "), args_event(0, '{"a": 1}')
    body = chunk(first) + chunk(second) + chunk(third) + b"0\r\n\r\n"
    response = RESPONSE_HEAD + body
    cut1 = len(RESPONSE_HEAD) + len(chunk(first))  # the head and the first event
    cut2 = cut1 + 4 + 10  # inside the second event
    cut3 = cut1 + len(chunk(second))  # its chunk's end
    c, s = client_isn, isn
    pieces = [
        (ms(0), packet(CLIENT, SERVER, c, flags=SYN)),
        (ms(0), packet(SERVER, CLIENT, s, flags=SYN | ACK)),
        (ms(1), packet(CLIENT, SERVER, c + 1, req[:20])),
        (ms(2), packet(CLIENT, SERVER, c + 21, req[20:])),
        (ms(10), packet(SERVER, CLIENT, s + 1, response[:cut1])),
        (ms(30), packet(SERVER, CLIENT, s + 1 + cut2, response[cut2:cut3])),  # its end first
        (ms(20), packet(SERVER, CLIENT, s + 1 + cut1, response[cut1:cut2])),
        (ms(35), packet(SERVER, CLIENT, s + 1, response[:cut1])),  # retransmitted
        (ms(40), packet(SERVER, CLIENT, s + 1 + cut3, response[cut3:])),
    ]
    if drop is not None:
        del pieces[drop]
    return pieces, req


def test_an_event_is_dated_by_the_packet_carrying_its_last_byte():
    frames, req = exchange_capture()
    directions = pw.reassemble(segments(pcap(frames)))
    [(client, server)] = pw.connections(directions)
    assert (client.src, client.dst, bytes(client.data)) == (CLIENT, SERVER, req)
    assert server.hole_at is None
    [ex] = pw.exchanges(client, server)
    assert ex.request_line == "POST /v1/chat/completions HTTP/1.1"
    assert json.loads(ex.request_body.data)["user"] == "u1"
    assert (ex.status, ex.response_headers["content-type"]) == (200, "text/event-stream")
    events = pw.sse_events(ex.response_body, server)
    base = T0 * 1_000_000_000
    # first event: in the first packet (its retransmission at 35 ms does not re-date it);
    # second: split, dated by its end's packet (30 ms, captured before the 20 ms one)
    assert [at - base for at, _ in events] == [ms(10), ms(30), ms(40)]
    assert [json.loads(data)["choices"][0]["delta"] for _, data in events][:2] == [
        {"content": "Hel"},
        {"content": "lo "},
    ]


def test_a_hole_in_the_capture_stops_the_direction_there():
    frames, _ = exchange_capture(drop=6)  # the second event's first part never captured
    [(client, server)] = pw.connections(pw.reassemble(segments(pcap(frames))))
    assert server.hole_at is not None
    [ex] = pw.exchanges(client, server)
    assert ex.response_body.complete is False
    assert len(pw.sse_events(ex.response_body, server)) == 1


def test_addresses_reused_by_a_new_connection_are_two_connections():
    one, _ = exchange_capture("u1", isn=5000)
    two, _ = exchange_capture("u2", isn=90000, client_isn=777_000)
    later = [(at + ms(100), frame) for at, frame in two]
    conns = pw.connections(pw.reassemble(segments(pcap(one + later))))
    users = [json.loads(pw.exchanges(c, s)[0].request_body.data)["user"] for c, s in conns]
    assert users == ["u1", "u2"]


def test_keep_alive_pairs_responses_with_requests_in_order():
    """Two requests on one connection; a 100 Continue before the first answer; the second
    answered with a Content-Length body."""
    req1, req2 = request("a"), request("b")
    answer1 = (
        b"HTTP/1.1 100 Continue\r\n\r\n" + RESPONSE_HEAD + chunk(text_event("x")) + b"0\r\n\r\n"
    )
    plain = text_event("y")
    answer2 = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + f"content-length: {len(plain)}\r\n\r\n".encode()
        + plain
    )
    frames = [
        (ms(1), packet(CLIENT, SERVER, 1, req1)),
        (ms(2), packet(SERVER, CLIENT, 1, answer1)),
        (ms(3), packet(CLIENT, SERVER, 1 + len(req1), req2)),
        (ms(4), packet(SERVER, CLIENT, 1 + len(answer1), answer2)),
    ]
    [(client, server)] = pw.connections(pw.reassemble(segments(pcap(frames))))
    got = [
        (json.loads(ex.request_body.data)["user"], pw.sse_events(ex.response_body, server))
        for ex in pw.exchanges(client, server)
    ]
    base = T0 * 1_000_000_000
    assert [(u, [(at - base, d) for at, d in ev]) for u, ev in got] == [
        ("a", [(ms(2), text_event("x")[6:-2])]),
        ("b", [(ms(4), text_event("y")[6:-2])]),
    ]


def test_sse_events_crlf_cr_comments_and_unfinished():
    body = pw.Body()
    raw = b": ping\r\n\r\ndata: one\r\ndata: two\r\n\r\ndata:three\r\rdata: four\n"
    body.add(0, raw)
    direction = pw.Direction(CLIENT, SERVER)
    direction.data += raw
    direction.starts, direction.times = [0, 20], [100, 200]  # a second packet from byte 20
    assert pw.sse_events(body, direction) == [(200, b"one\ntwo"), (200, b"three")]


def test_a_malformed_chunk_size_is_a_pcap_error():
    frames = [
        (ms(1), packet(CLIENT, SERVER, 1, request("a"))),
        (ms(2), packet(SERVER, CLIENT, 1, RESPONSE_HEAD + b"zz\r\nabc")),
    ]
    [(client, server)] = pw.connections(pw.reassemble(segments(pcap(frames))))
    with pytest.raises(pw.PcapError, match="chunk size"):
        pw.exchanges(client, server)


# --- the bench's use: two legs of one stream, paired by its user --------------------------


def test_wire_level_pairs_the_upstream_leg_with_the_proxy_leg_by_user():
    up_client, upstream = ("127.0.0.1", 41000), ("127.0.0.1", 9000)
    proxy = ("127.0.0.1", 8000)

    def leg(client, server, user, times, events, asked=1_000_000):
        req = request(user)  # in two packets: dated by its last byte's
        frames = [(ms(0), packet(client, server, 1, req[:30]))]
        frames.append((asked, packet(client, server, 31, req[30:])))
        frames.append((asked, packet(server, client, 1, RESPONSE_HEAD)))
        at = 1 + len(RESPONSE_HEAD)
        for t, event in zip(times, events, strict=True):
            frames.append((t, packet(server, client, at, chunk(event))))
            at += len(chunk(event))
        return frames

    events = [text_event("abcd"), text_event("efgh"), args_event(0, "{}"), args_event(1, "{}")]
    frames = leg(up_client, upstream, S1, [ms(10), ms(20), ms(30), ms(40)], events, ms(4))
    frames += leg(CLIENT, proxy, S1, [ms(11), ms(23), ms(41), ms(41)], events)
    frames += leg(("127.0.0.1", 41001), upstream, WARM, [ms(5)], events[:1])  # no proxy leg
    # a request with its "user" but not the tag in its message (LiteLLM's kind): not found
    untagged = leg(("127.0.0.1", 41002), upstream, "b2" * 8, [ms(6)], events[:1])
    frames += [(t, f.replace(b"bench stream", b"bench_stream")) for t, f in untagged]
    level = bench.wire_level(pcap(sorted(frames, key=lambda f: f[0])), 9000, 8000)
    assert (sorted(level.up), sorted(level.down), level.problems) == ([S1, WARM], [S1], [])
    wire = bench.Wire(level.up[S1], level.down[S1])
    assert wire.calls_added() == [0.011, 0.001]
    assert wire.request_relayed() == 0.003
    got = wire.text_added()  # at each of TEXT_ENDS: 4, 8 characters, then none
    assert got[:2] == [0.001, 0.003]
    assert all(v != v for v in got[2:])  # NaN: never carried
    assert wire.flowing() == T0 * 1_000_000_000 + ms(11)
    assert wire.text_added(after=wire.flowing())[0] == 0.003  # sent at 20 ms: after 11 ms


# --- a real capture, where tcpdump can make one -------------------------------------------


def test_a_real_loopback_capture_when_tcpdump_can_capture(tmp_path):
    """tcpdump's own file (Linux ``lo``: Ethernet with zero MACs, nanosecond stamps) read
    by the reader: two events 80 ms apart on the server's side are 80 ms apart in it. Skips
    (CI too: it may have no tcpdump, or no right to capture) where no capture can start."""
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        pytest.skip("no tcpdump on this machine (Debian: apt-get install tcpdump)")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)
        port = listener.getsockname()[1]
        try:
            capture = bench.Capture(tcpdump, tmp_path / "c.pcap", [port])
        except bench.CaptureError as exc:
            pytest.skip(f"tcpdump cannot capture here: {exc}")
        sent: list[float] = []

        def serve():
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                want = request(LIVE)
                got = b""
                while len(got) < len(want):
                    got += conn.recv(65536)
                conn.sendall(RESPONSE_HEAD + chunk(text_event("abcd")))
                sent.append(time.perf_counter())
                time.sleep(0.08)
                conn.sendall(chunk(text_event("efgh")) + b"0\r\n\r\n")
                sent.append(time.perf_counter())

        server = threading.Thread(target=serve)
        server.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(request(LIVE))
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                got += client.recv(65536)
        server.join()
        data, dropped = capture.finish()
    assert dropped == "0"
    level = bench.wire_level(data, port, None)
    marks = level.up[LIVE]
    assert [chars for chars, _ in marks.text] == [4, 8]
    gap = (marks.text[1][1] - marks.text[0][1]) / 1e9
    assert abs(gap - (sent[1] - sent[0])) < 0.005

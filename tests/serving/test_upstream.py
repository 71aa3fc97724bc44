"""The endpoint's HTTP/1.1 client reading a replica's chunked answer (serving/proxy/upstream.py): framing
it cannot trust is Malformed (a 502), never a buffer that grows without end."""

from __future__ import annotations

from serving.proxy.upstream import Malformed, _Conn


def _chunked(*pieces: bytes) -> _Conn:
    conn = _Conn(pool=None, key="replica", head_request=False)
    conn.mode = "chunked"
    for piece in pieces:
        conn._body(piece)
    return conn


def test_a_well_framed_answer_with_a_trailer_completes():
    conn = _chunked(b"3\r\nabc\r\n", b"0\r\nX-Sum: 1\r\n\r\n")
    assert conn.complete and conn.error is None and b"".join(conn.pieces) == b"abc"


def test_a_trailer_that_never_ends_is_malformed_not_held():
    conn = _chunked(b"3\r\nabc\r\n0\r\n", *[b"x" * 1024] * 8)
    assert isinstance(conn.error, Malformed) and not conn.complete
    many = _chunked(b"0\r\n", *[b"X-Pad: " + b"y" * 100 + b"\r\n"] * (4096 // 100))
    assert isinstance(many.error, Malformed) and not many.complete


def test_a_chunk_longer_than_its_size_is_malformed():
    conn = _chunked(b"3\r\nabcdef\r\n0\r\n\r\n")
    assert isinstance(conn.error, Malformed)

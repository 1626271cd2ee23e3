#!/usr/bin/env python3
"""Writes the seed corpus of the store protocol harness (tests/fuzz/corpus/store_protocol/).

Each seed is a list of records [u8 op][u16 length][bytes] (see fuzz_store_protocol.cpp):
op & 3 = connection, (op >> 2) & 3 = action (0 feed, 1 read all replies, 2 read some,
3 reconnect). The frames are the wire protocol of docs/store_protocol.md. Deterministic.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "store_protocol")
HELLO, SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUMKEYS = range(1, 10)


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<I", len(b)) + b


def frame(cmd, *fields):
    payload = bytes([cmd]) + b"".join(fields)
    return struct.pack("<I", len(payload)) + payload


def i64(v):
    return struct.pack("<q", v)


def u32(v):
    return struct.pack("<I", v)


def feed(conn, data):
    return bytes([conn]) + struct.pack("<H", len(data)) + data


def read(conn):
    return bytes([conn | 4]) + struct.pack("<H", 0)


def read_some(conn, n):
    return bytes([conn | 8]) + struct.pack("<H", n)


def reconnect(conn):
    return bytes([conn | 12]) + struct.pack("<H", 0)


hello = frame(HELLO, s("tok"))
SEEDS = {
    "set_get": feed(0, hello) + feed(0, frame(SET, s("k"), s("v"))) + feed(0, frame(GET, s("k"))) + read(0),
    "add_cas": feed(0, hello + frame(ADD, s("n"), i64(5)) + frame(ADD, s("n"), i64(-7))
                    + frame(CAS, s("c"), s(""), s("x")) + frame(CAS, s("c"), s("x"), s("y"))) + read(0),
    "check_delete_numkeys": feed(0, hello + frame(SET, s("a"), s("1")) + frame(CHECK, u32(2), s("a"), s("b"))
                                 + frame(DELETE, s("a")) + frame(DELETE, s("a")) + frame(NUMKEYS)) + read(0),
    "parked_get_woken": feed(1, hello + frame(GET, s("late")) + frame(NUMKEYS)) + feed(0, hello)
                        + feed(0, frame(SET, s("late"), s("here"))) + read(1) + read(0),
    "parked_wait_two_keys": feed(2, hello + frame(WAIT, u32(2), s("x"), s("y"))) + feed(0, hello)
                            + feed(0, frame(SET, s("x"), s("1"))) + feed(0, frame(ADD, s("y"), i64(1)))
                            + read(2) + reconnect(2),
    "split_frames": feed(0, hello[:3]) + feed(0, hello[3:]) + feed(0, frame(SET, s("k"), s("v" * 40))[:9])
                    + feed(0, frame(SET, s("k"), s("v" * 40))[9:]) + read_some(0, 3) + read(0),
    "wrong_token": feed(3, frame(HELLO, s("nope"))) + read(3) + feed(0, hello + frame(NUMKEYS)) + read(0),
    "stalled_reader": feed(0, hello + frame(SET, s("big"), s(b"\x07" * 8000)))
                      + b"".join(feed(1, (hello if i == 0 else b"") + frame(GET, s("big"))) for i in range(4))
                      + feed(0, frame(GET, s("big"))) + read(0),
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"wrote {len(SEEDS)} seeds to {OUT}")

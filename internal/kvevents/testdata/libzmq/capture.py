#!/usr/bin/env python3
"""Capture what a real libzmq PUB socket sends a subscriber, for kvgate's golden tests.

Usage:  /usr/bin/python3 capture.py OUTDIR        (Debian: apt-get install python3-zmq python3-msgpack)
        /usr/bin/python3 capture.py --publish tcp://127.0.0.1:PORT   (publish once, for the live test)

For each way an engine publishes -- its PUB bound (vLLM's default, tcp://*:5557) and its PUB
connecting to a gateway's bound SUB -- a plain TCP socket plays the subscriber: it speaks the
ZMTP 3.0 greeting and READY of a SUB by hand, subscribes to everything, and records every byte
libzmq sends until the last message has arrived. The payloads are the KVEventBatch encodings
vLLM writes with msgspec (array-like structs tagged by type name, and the newer map form), built
field by field here with msgpack, since msgspec is not packaged by Debian.
"""
import socket
import struct
import sys
import time

import msgpack
import zmq

TOPIC = b"kv@127.0.0.1:8000@golden-model"


def h(i):
    # vLLM's ExternalBlockHash: an int (older) or 32 bytes (newer releases).
    return i


def toks(first, blocks, bs=4):
    return [first + i for i in range(blocks * bs)]


def batches():
    """The payloads, in order (sequence numbers 0, 1, ...)."""
    out = []
    # 0: msgspec array_like, tag=True (vLLM 0.9-0.10): two chained stores, the first at the
    # start of a prompt (parent nil), a trailing medium.
    out.append([1733000000.25, [
        ["BlockStored", [h(101), h(102)], None, toks(1000, 2), 4, None, "GPU"],
        ["BlockStored", [h(103)], h(102), toks(1008, 1), 4, None, "GPU"],
    ], 0])
    # 1: array-like with every field vLLM added since: lora_name, extra_keys (one entry per
    # block), group_idx; and a removal.
    out.append([1733000000.5, [
        ["BlockStored", [h(201)], None, toks(2000, 1), 4, None, "GPU", None, [None], 0],
        ["BlockRemoved", [h(103)], "GPU"],
    ], 0])
    # 2: the map form (current vLLM: EventBatch and events encoded as maps, "type" first).
    out.append({"ts": 1733000000.75, "events": [
        {"type": "BlockStored", "block_hashes": [h(301), h(302)], "parent_block_hash": None,
         "token_ids": toks(3000, 2), "block_size": 4, "lora_id": None, "medium": "GPU",
         "lora_name": None, "extra_keys": [None, None], "group_idx": 0,
         "kv_cache_spec_kind": "full_attention"},
        {"type": "BlockStored", "block_hashes": [h(401)], "parent_block_hash": None,
         "token_ids": toks(4000, 1), "block_size": 4, "lora_id": 7, "medium": "GPU",
         "lora_name": "adapter-a", "extra_keys": [["adapter-a"]], "group_idx": 0},
        {"type": "BlockStored", "block_hashes": [h(501)], "parent_block_hash": None,
         "token_ids": toks(5000, 1), "block_size": 4, "lora_id": None, "medium": "CPU",
         "lora_name": None},
        {"type": "BlockRemoved", "block_hashes": [h(302)], "medium": "GPU", "group_idx": 0},
    ], "data_parallel_rank": 0})
    # 3: newer vLLM's byte hashes, and parent 0 as llm-d's publishers write "no parent".
    out.append([1733000001.0, [
        ["BlockStored", [bytes([7] * 32), bytes([8] * 32)], 0, toks(6000, 2), 4, None, "GPU"],
    ], 0])
    # 4: everything cleared.
    out.append([1733000001.25, [["AllBlocksCleared"]], 0])
    return [msgpack.packb(b, use_bin_type=True) for b in out]


def sub_hello():
    g = bytearray(64)
    g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
    g[12:16] = b"NULL"
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
    return bytes(g) + bytes([0x04, len(ready)]) + ready


# SUBSCRIBE_ALL is the ZMTP 3.0 subscription message to every topic, sent once the handshake is
# over (libzmq drops a peer that sends it earlier).
SUBSCRIBE_ALL = b"\x00\x01\x01"


def handshake(conn):
    """Handshake as a SUB; return the bytes libzmq sent meanwhile (its greeting and READY)."""
    conn.sendall(sub_hello())
    conn.settimeout(5.0)
    data = bytearray()
    while len(data) < 66 or len(data) < 66 + data[65]:
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise SystemExit("libzmq closed the connection during the handshake")
        data += chunk
    conn.sendall(SUBSCRIBE_ALL)
    return bytes(data)


def publish(pub, payloads):
    for seq, p in enumerate(payloads):
        pub.send_multipart([TOPIC, struct.pack(">Q", seq), p])


def record(conn, want):
    """Read until want bytes of payload-bearing stream arrived, or 2 s of silence."""
    conn.settimeout(2.0)
    data = bytearray()
    while len(data) < want:
        try:
            chunk = conn.recv(1 << 16)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def capture(outdir):
    payloads = batches()
    want = 64 + sum(len(TOPIC) + 8 + len(p) for p in payloads)
    ctx = zmq.Context.instance()

    # The engine's PUB bound; the subscriber connects.
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    c = socket.create_connection(("127.0.0.1", port))
    head = handshake(c)
    time.sleep(0.5)  # libzmq applies the subscription before it sends anything
    publish(pub, payloads)
    open(f"{outdir}/pub-bound.bin", "wb").write(head + record(c, want - len(head)))
    c.close()
    pub.close(linger=0)

    # The engine's PUB connecting to the subscriber's bound socket.
    ln = socket.socket()
    ln.bind(("127.0.0.1", 0))
    ln.listen(1)
    pub = ctx.socket(zmq.PUB)
    pub.connect(f"tcp://127.0.0.1:{ln.getsockname()[1]}")
    c, _ = ln.accept()
    head = handshake(c)
    time.sleep(0.5)
    publish(pub, payloads)
    open(f"{outdir}/pub-connected.bin", "wb").write(head + record(c, want - len(head)))
    c.close()
    ln.close()
    pub.close(linger=0)
    print("libzmq", zmq.zmq_version(), "pyzmq", zmq.__version__, "msgpack", msgpack.version)


def live(endpoint):
    """Publish the batches once to a bound SUB at endpoint (the live interop test).

    A PUB drops what it sends before the subscriber's subscription has reached it, and nothing
    tells a PUB when that was: a fixed half-second pause lost the batches on a loaded machine.
    An XPUB is a PUB that hands the subscriptions it hears to its owner, so this one publishes
    once the gateway's subscription arrived. (The PUB greeting itself is in the captures.)"""
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.connect(endpoint)
    if not pub.poll(20000):
        sys.exit("no subscription from the gateway within 20 s")
    pub.recv()
    publish(pub, batches())
    pub.close(linger=20000)  # until every batch is on the wire


if __name__ == "__main__":
    if sys.argv[1] == "--publish":
        live(sys.argv[2])
    else:
        capture(sys.argv[1])

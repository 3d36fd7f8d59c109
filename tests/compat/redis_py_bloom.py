"""Drives warden's BF.* through redis-py's own Bloom API (r.bf()), unchanged.

Usage: python redis_py_bloom.py <unix socket path>
"""
import sys

import redis


def check(protocol):
    r = redis.Redis(unix_socket_path=sys.argv[1], protocol=protocol)
    r.flushall()
    bf = r.bf()
    assert bf.create("users", 0.01, 1000) in (True, b"OK", "OK")
    assert bf.add("users", "alice") in (1, True)
    assert bf.add("users", "alice") in (0, False)
    assert [bool(x) for x in bf.madd("users", "bob", "carol", "alice")] == [True, True, False]
    assert bool(bf.exists("users", "bob"))
    assert not bool(bf.exists("users", "mallory"))
    assert [bool(x) for x in bf.mexists("users", "alice", "mallory")] == [True, False]
    assert [bool(x) for x in bf.insert("ids", ["1", "2"], capacity=500, error=0.001, expansion=4)] == [True, True]
    assert [bool(x) for x in bf.insert("ids", ["2", "3"], noCreate=True)] == [False, True]
    try:
        bf.insert("absent", ["x"], noCreate=True)
        raise AssertionError("NOCREATE on a missing key must fail")
    except redis.ResponseError as e:
        assert "not found" in str(e)
    info = bf.info("users")
    if protocol == 2:  # redis-py parses RESP2 into a BFInfo object
        got = (info.capacity, info.insertedNum, info.filterNum, info.expansionRate)
    else:  # and hands the RESP3 map through as a dict
        info = {k.decode() if isinstance(k, bytes) else k: v for k, v in info.items()}
        got = tuple(info[k] for k in ("Capacity", "Number of items inserted", "Number of filters", "Expansion rate"))
    assert got == (1000, 3, 1, 2), got
    assert bf.card("users") == 3
    # SCANDUMP / LOADCHUNK round trip, as redis-py documents it
    chunks = []
    it = 0
    while True:
        it, data = bf.scandump("users", it)
        if it == 0:
            break
        chunks.append((it, data))
    for it, data in chunks:
        bf.loadchunk("copy", it, data)
    assert bf.card("copy") == 3
    assert bool(bf.exists("copy", "carol"))
    try:
        bf.create("users", 0.01, 1000)
        raise AssertionError("reserving an existing filter must fail")
    except redis.ResponseError as e:
        assert "item exists" in str(e)


for protocol in (2, 3):
    check(protocol)
print("redis-py bf() API: ok")

"""Cross-partition suppression lookup: ms per (channel, address_hash) lookup of 50 hashes in
200k rows, unpartitioned vs 4 and 64 hash partitions (docs/beyond-one-machine.md; bench/RESULTS.md)."""

import hashlib
import time

import pgserver
import psycopg

srv = pgserver.get_server("/tmp/pt-suppress-bench", cleanup_mode="stop")
with psycopg.connect(srv.get_uri(), autocommit=True) as c:
    for n in (0, 4, 64):
        c.execute("DROP TABLE IF EXISTS s CASCADE")
        part = "" if n == 0 else " PARTITION BY HASH (user_id)"
        c.execute(
            f"CREATE TABLE s (user_id text, channel text, address text, address_hash text, PRIMARY KEY (user_id, channel, address)){part}"
        )
        for i in range(n):
            c.execute(
                f"CREATE TABLE s_{i} PARTITION OF s FOR VALUES WITH (MODULUS {n}, REMAINDER {i})"
            )
        c.execute("CREATE INDEX ON s (channel, address_hash)")
        c.execute(
            "INSERT INTO s SELECT 'u'||g, 'email', 'a'||g||'@x', md5('a'||g) FROM generate_series(1,200000) g"
        )
        c.execute("ANALYZE s")
        hashes = [hashlib.md5(f"a{g}".encode()).hexdigest() for g in range(1, 200000, 1000)][:50]
        q = "SELECT user_id FROM s WHERE channel = ANY(%s) AND address_hash = ANY(%s)"
        for _ in range(20):
            c.execute(q, (["email"], hashes)).fetchall()
        t = time.perf_counter()
        runs = 500
        for _ in range(runs):
            c.execute(q, (["email"], hashes)).fetchall()
        print(
            f"partitions={n}: {1000 * (time.perf_counter() - t) / runs:.3f} ms per lookup of 50 hashes in 200k rows"
        )

"""Two clarion commits and the baseline in one run, loads interleaved round by round (issue 29):
on a shared, noisy machine a change to ingest is judged by ratios taken minutes apart otherwise.

    git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/ingest_ab.py --before /tmp/before [--rounds 3] [--requests 1000]

`after` is this checkout; `before` is `clarion web` run with PYTHONPATH (and its working directory)
set to the other tree. One server process each (uvicorn's supervisor of several workers kills
children that take more than 5 s to start, which three servers starting at once on a loaded host
did). Each round: single events from 8 and 32 clients to after, before and the baseline; then
the batch door (500 a request) to after and before, and one multi-row INSERT per 500 of the same
rows (and of narrow ones), as bench/ingest.py.
"""

# ruff: noqa: E501, E702, E731
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import ingest as b  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=1000)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--workers", type=int, default=1)
p.add_argument("--before", required=True, help="a tree of the other commit")
p.add_argument("--batches", type=int, default=10)
a = p.parse_args()
bench = b.Bench(
    argparse.Namespace(
        requests=0, clients="8", workers=a.workers, batch=500, batches=20, drain=False
    )
)
try:
    bench.setup()
    w = ["--workers", str(a.workers)]
    after = bench.serve([str(b.BIN / "clarion"), "web", "--host", "127.0.0.1", *w], bench.env)
    before = b.free_port()
    log = open(Path(a.before) / "before-server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(b.BIN / "clarion"), "web", "--host", "127.0.0.1", *w, "--port", str(before)],
        env={**bench.env, "PYTHONPATH": a.before},
        cwd=a.before,
        stdout=log,
        stderr=log,
    )
    bench.stops.append(lambda: (proc.terminate(), proc.wait(30)))  # type: ignore[arg-type, func-returns-value]
    base = bench.serve(
        [
            str(b.BIN / "uvicorn"),
            "bench.ingest_baseline:app",
            "--log-level",
            "warning",
            "--host",
            "127.0.0.1",
            *w,
        ],
        {**bench.env, "BENCH_BASELINE_URL": b._libpq(bench.url)},
    )
    b.wait_for(after, timeout=240)
    b.wait_for(before, timeout=240)
    b.wait_for(base, "/v1/events-missing", timeout=240)
    auth = {"Authorization": f"Bearer {bench.key}"}
    for port, h in ((after, auth), (before, auth), (base, {})):
        b.load(port, h, b.events(f"warm{port}", 300), 8)
    res: dict[tuple[object, str], list] = {}
    n = 0
    for r in range(a.rounds):
        for clients in (8, 32):
            for name, port, h in (
                ("after", after, auth),
                ("before", before, auth),
                ("base", base, {}),
            ):
                n += 1
                run = b.load(port, h, b.events(f"r{n}", a.requests), clients)
                res.setdefault((clients, name), []).append(run)
            ra = res[(clients, "after")][-1]
            rb = res[(clients, "before")][-1]
            rs = res[(clients, "base")][-1]
            print(
                f"round {r + 1} {clients:2d} clients: after {ra.rate:5.0f}/s p95 {ra.p95:6.1f} | before {rb.rate:5.0f}/s p95 {rb.p95:6.1f} | base {rs.rate:5.0f}/s p95 {rs.p95:6.1f} | ratio after {ra.rate / rs.rate:.2f} before {rb.rate / rs.rate:.2f} after/before {ra.rate / rb.rate:.2f}",
                flush=True,
            )
        for name, port in (("after", after), ("before", before)):
            n += 1
            if name == "after":
                after_prefix = f"bt{n}-"
            bodies = [
                json.dumps({"items": [json.loads(x) for x in b.events(f"bt{n}-{j}", 500)]}).encode()
                for j in range(a.batches)
            ]
            run = b.load(port, auth, bodies, 1, path="/v1/events/batch")
            res.setdefault(("batch", name), []).append(run.rate * 500)
        # the same rows as after's (read back) into a table LIKE requests, as bench/ingest.py does
        rows = b.ledger_rows(bench.url, after_prefix)
        same = b.batch_insert_rate(bench.url, "bench_ledger", b.LEDGER_COLUMNS, rows, 500)
        pairs = [(f"b{r}-{i}", {"i": i}) for i in range(500 * a.batches)]
        plain = b.batch_insert_rate(bench.url, "bench_batch", "event_id, body", pairs, 500)
        res.setdefault(("batch", "base"), []).append(same)
        ba, bb = res[("batch", "after")][-1], res[("batch", "before")][-1]
        print(
            f"round {r + 1} batch: after {ba:6.0f} rows/s | before {bb:6.0f} | INSERT of the same rows {same:6.0f} | ratio after {ba / same:.2f} before {bb / same:.2f} after/before {ba / bb:.2f} | INSERT of (event_id, body) {plain:6.0f}: after {ba / plain:.2f}",
            flush=True,
        )
    for clients in (8, 32):
        ra = [
            x.rate / y.rate
            for x, y in zip(res[(clients, "after")], res[(clients, "base")], strict=True)
        ]
        rb = [
            x.rate / y.rate
            for x, y in zip(res[(clients, "before")], res[(clients, "base")], strict=True)
        ]
        print(
            f"median ratio {clients} clients: after {statistics.median(ra):.2f} before {statistics.median(rb):.2f}"
        )
    ra = [x / y for x, y in zip(res[("batch", "after")], res[("batch", "base")], strict=True)]
    rb = [x / y for x, y in zip(res[("batch", "before")], res[("batch", "base")], strict=True)]
    print(
        f"median ratio batch: after {statistics.median(ra):.2f} before {statistics.median(rb):.2f}"
    )
finally:
    bench.stop()

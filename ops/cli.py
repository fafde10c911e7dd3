"""The `clarion` command."""

from __future__ import annotations

import argparse
import os
import sys

from clarion import settings
from clarion.errors import ClarionError
from ops import launch


def _services(args: argparse.Namespace) -> int:
    from db.embedded import serve

    serve(settings.get().home.resolve())
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from db.engine import migrate

    migrate()
    print("database is at the latest revision")
    return 0


def _worker(args: argparse.Namespace) -> int:
    settings.get().urls()  # fail here, readably, if nothing is configured
    lanes = args.lane or list(launch.QUEUES)
    command = launch.worker_command(lanes, concurrency=args.concurrency, pool=args.pool,
                                    name="-".join(lanes), loglevel=args.loglevel)
    os.execv(command[0], command)


def _beat(args: argparse.Namespace) -> int:
    s = settings.get()
    s.urls()
    s.home.mkdir(parents=True, exist_ok=True)
    command = launch.beat_command(s.home, loglevel=args.loglevel)
    os.execv(command[0], command)


def _stats(args: argparse.Namespace) -> int:
    from ops.stats import report

    print(report(*settings.get().urls()))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ops.demo import run

    return run(settings.get().home.resolve())


def _receiver(args: argparse.Namespace) -> int:
    import time

    from ops.receiver import Receiver

    with Receiver(settings.get().webhook_secret, port=args.port) as receiver:
        print(f"receiving on {receiver.url}; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(5)
                a = receiver.arrivals
                print(f"arrivals {a.total}  unique {a.unique}  repeats dropped {a.repeats}  "
                      f"bad signatures {a.rejected}", flush=True)
        except KeyboardInterrupt:
            return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clarion", description="Notifications that cannot double-send.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the whole pipeline on embedded PostgreSQL and Redis").set_defaults(fn=_demo)
    sub.add_parser("services", help="run embedded PostgreSQL and Redis until Ctrl-C").set_defaults(fn=_services)
    sub.add_parser("migrate", help="bring the database schema up to date").set_defaults(fn=_migrate)
    w = sub.add_parser("worker", help="run a Celery worker for one or more lanes")
    w.add_argument("--lane", action="append", choices=launch.QUEUES,
                   help="lane queue to consume (repeatable; default: all)")
    w.add_argument("--concurrency", "-c", type=int, default=2)
    w.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    w.add_argument("--loglevel", default="INFO")
    w.set_defaults(fn=_worker)
    b = sub.add_parser("beat", help="run the beat clock (one is enough; two are harmless)")
    b.add_argument("--loglevel", default="INFO")
    b.set_defaults(fn=_beat)
    sub.add_parser("stats", help="print counts by state, reason and queue").set_defaults(fn=_stats)
    r = sub.add_parser("receiver", help="a local webhook receiver that verifies and counts")
    r.add_argument("--port", type=int, default=8099)
    r.set_defaults(fn=_receiver)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        sys.exit(args.fn(args))
    except ClarionError as exc:
        print(f"clarion: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

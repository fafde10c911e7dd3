"""The `clarion` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import clarion
from clarion import logs, settings
from clarion.errors import ClarionError, InvalidRequest
from clarion.names import QUEUES
from clarion.ops import events, launch, web_command


def _services(args: argparse.Namespace) -> int:
    from clarion.db.embedded import serve

    serve(settings.get().home.resolve())
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from clarion import clock
    from clarion.db import meta
    from clarion.db.engine import engine, migrate
    from clarion.scheduling import zones

    if args.down:
        migrate(revision="base", down=True)
        print(f"removed clarion's tables and schema {settings.get().schema}; nothing else touched")
        return 0
    partitioned = migrate(partitions=args.partitions)
    if partitioned:
        print(f"hash-partitioned by user_id: {', '.join(partitioned)}")
    with engine().begin() as conn:  # this install's tz rules become the deployment's
        changed, before = meta.put(conn, meta.TZDATA, zones.TZ_DATABASE, now=clock.now())
    print("database is at the latest revision")
    if changed and before is not None:
        print(
            f"tz database is now {zones.describe()} (was {before}): restart every worker; those "
            f"still on {before} refuse to start and fire no series"
        )
    else:
        print(f"tz database: {zones.describe()}")
    return 0


def worker_command(args: argparse.Namespace) -> list[str]:
    """The celery worker command for `clarion worker` arguments."""
    lanes = args.lane or list(QUEUES)
    return launch.worker_command(
        lanes,
        concurrency=args.concurrency,
        pool=args.pool,
        name=args.name or f"{'-'.join(lanes)}-{os.getpid()}",
        loglevel=args.loglevel,
    )


def _worker(args: argparse.Namespace) -> int:
    settings.get().urls()  # fail here, readably, if nothing is configured
    command = worker_command(args)
    if args.no_restart:  # under an outside supervisor (systemd, Kubernetes): be the worker itself
        os.execv(command[0], command)
    return launch.supervise(
        command,
        backoff=launch.Backoff(first=args.restart_delay),
        stop_timeout=settings.get().shutdown_grace,
    )


def _beat(args: argparse.Namespace) -> int:
    s = settings.get()
    s.urls()
    s.home.mkdir(parents=True, exist_ok=True)
    command = launch.beat_command(s.home, loglevel=args.loglevel, quiet=s.log_format == "json")
    os.execv(command[0], command)


def _flower(args: argparse.Namespace) -> int:
    from clarion.ops.flower import plan

    s = settings.get()
    s.urls()
    chosen = plan(
        args.address,
        unauthenticated=args.unauthenticated,
        configured=s.flower_basic_auth,
        environ=os.environ,
    )
    if chosen.notice:
        print(chosen.notice, file=sys.stderr, flush=True)
    extra = [f"--broker_api={args.broker_api}"] if args.broker_api else []
    command = launch.celery_command(
        "flower", f"--port={args.port}", f"--address={args.address}", *extra
    )
    os.execve(command[0], command, {**os.environ, **chosen.env})


def _stats(args: argparse.Namespace) -> int:
    from clarion.ops.stats import report

    print(report(*settings.get().urls()))
    return 0


def _broadcasts(args: argparse.Namespace) -> int:
    from clarion.ops import broadcasts

    if args.cancel and args.id is None:
        raise InvalidRequest("--cancel needs the broadcast's id")
    if args.cancel:
        from clarion.tasks.broadcasts import cancel_broadcast

        stopped = cancel_broadcast(args.id)
        print(f"broadcast {stopped.id} {stopped.state}; {stopped.requested} recipient(s) requested")
    print(broadcasts.listing() if args.id is None else broadcasts.detail(args.id))
    return 0


def _broadcast(args: argparse.Namespace) -> int:
    from clarion.ops import broadcasts as shown
    from clarion.tasks import broadcasts

    audience = shown.audience(args.topic, args.segment)
    asked: dict[str, Any] = dict(variables=_parse_vars(args.var), at=args.at, passed=args.passed)
    if args.dry_run:
        print(shown.dry_run_table(broadcasts.dry_run_broadcast(args.type, audience, **asked)))
        return 0
    started = broadcasts.broadcast(args.type, audience, **asked, idempotency_key=args.key)
    print(
        f"broadcast {started.id} "
        + ("started" if started.new else "already existed; nothing new")
        + f": {started.planned} planned, {started.skipped} skipped; follow it with "
        f"`clarion broadcasts {started.id}`"
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from clarion.ops.demo import run

    return run(settings.get().home.resolve())


def _parse_vars(pairs: list[str]) -> dict[str, str]:
    variables = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"--var takes name=value, not {pair!r}")
        variables[name] = value
    return variables


def _send(args: argparse.Namespace) -> int:
    from clarion.tasks import notify
    from clarion.tasks.planning import preview

    variables = _parse_vars(args.var)
    occurrence = {"event_id": args.event_id, "occurrence_key": args.occurrence_key}
    if args.event_id is None and args.occurrence_key is None:
        occurrence["event_id"] = f"cli:{uuid.uuid4()}"
    if args.dry_run:
        from clarion.ops.explain import plan_table
        from clarion.ops.preview import dry_run_renderings

        plan = preview(args.user, args.type, variables=variables, **occurrence)
        print(plan_table(plan))
        shown = dry_run_renderings(args.user, args.type, plan, variables, **occurrence)
        if shown:
            print("\nwhat the recipient would get:\n\n" + shown)
        return 0
    result = notify(args.user, args.type, variables=variables, **occurrence)
    print(
        f"request {result.request_id} "
        + ("enqueued" if result.new else "already existed; nothing new")
    )
    return 0


def _preview(args: argparse.Namespace) -> int:
    from clarion.ops.preview import run

    print(
        run(
            args.type,
            version=args.version,
            channel=args.channel,
            locale=args.locale,
            variables=_parse_vars(args.var),
            json_out=args.json,
        )
    )
    return 0


def _explain(args: argparse.Namespace) -> int:
    from clarion.ops.explain import explain

    named = {u for u in (args.who, args.user) if u is not None}
    if len(named) != 1:
        raise InvalidRequest("name one recipient: `explain USER` or `explain --user USER`")
    if args.limit < 1:
        raise InvalidRequest(f"--limit must be a positive whole number, not {args.limit}")
    print(explain(named.pop(), type_key=args.type, since=args.since, limit=args.limit))
    return 0


def _forget(args: argparse.Namespace) -> int:
    from clarion.tasks.recipients import forget

    erased = forget(args.user)
    if erased is None:
        raise InvalidRequest(f"unknown recipient {args.user!r}")
    changed = ", ".join(f"{t} {n}" for t, n in erased.changed.items() if n) or "nothing left"
    print(f"erased {args.user} (since {erased.erased_at.isoformat()}); rows changed: {changed}")
    return 0


def _arm(args: argparse.Namespace) -> int:
    from datetime import datetime

    try:
        until = datetime.fromisoformat(args.until) if args.until else None
    except ValueError as exc:
        raise InvalidRequest(f"--until takes an ISO time with a zone, not {args.until!r}") from exc
    arm = dict(
        anchor=args.anchor,
        every=args.every,
        count=args.count,
        until=until,
        variables=_parse_vars(args.var),
        calendar_policy=args.calendar,
    )
    if args.dry_run:
        from clarion.ops.schedule import arm_preview

        print(arm_preview(args.user, args.type, **arm))
        return 0
    from clarion.tasks.series import arm_series

    armed = arm_series(args.user, args.type, series_key=args.key, **arm)
    print(
        f"series {armed.series_id} "
        + ("armed" if armed.new else "was armed already")
        + f"; first occurrence due {armed.first_due_at.isoformat()}"
    )
    return 0


def _redrive(args: argparse.Namespace) -> int:
    from clarion import clock
    from clarion.ops.redrive import Filters, parse_time, redrive

    now = clock.now()
    filters = Filters(
        states=tuple(args.state or ["failed"]),
        type_key=args.type,
        reason=args.reason,
        since=parse_time(args.since, "--since", now),
        until=parse_time(args.until, "--until", now),
        limit=args.limit,
    )
    print(redrive(filters, dry_run=args.dry_run, now=now))
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from clarion.ops.schedule import schedule

    print(schedule(args.user, args.days))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from clarion.ops.schedule import simulate

    print(simulate(args.user, args.days))
    return 0


def _receiver(args: argparse.Namespace) -> int:
    import time

    from clarion.standins.receiver import Receiver

    with Receiver(settings.get().webhook_secret, port=args.port) as receiver:
        print(f"receiving on {receiver.url}; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(5)
                a = receiver.arrivals
                print(
                    f"arrivals {a.total}  unique {a.unique}  repeats dropped {a.repeats}  "
                    f"bad signatures {a.rejected}",
                    flush=True,
                )
        except KeyboardInterrupt:
            return 0


def _link(args: argparse.Namespace) -> int:
    from clarion.tasks import preferences_link

    print(preferences_link(args.user, ttl=args.ttl))
    return 0


def _staff_link(args: argparse.Namespace) -> int:
    from clarion.web.activity import staff_link

    print(staff_link(args.staff, ttl=args.ttl))
    return 0


def _keys(args: argparse.Namespace) -> int:
    from clarion.ops.table import render
    from clarion.web import api_auth

    if args.action == "create":
        made = api_auth.create_key(
            args.name,
            args.scope or [],
            api_auth.parse_rate(args.rate),
            api_auth.parse_expires(args.expires),
        )
        expires = made.record.expires_at
        print(made.secret)
        print(
            f"API key {made.record.prefix} ({made.record.name}): {', '.join(made.record.scopes)}; "
            + (f"expires {_minute(expires)} UTC; " if expires else "")
            + "shown once, only its hash is stored",
            file=sys.stderr,
        )
    elif args.action == "revoke":
        revoked = api_auth.revoke_key(args.prefix)
        print(f"API key {revoked.prefix} ({revoked.name}) revoked")
    else:
        rows = [
            (
                k.prefix,
                k.name,
                " ".join(k.scopes),
                f"{k.rate_limit}/{k.rate_window}s",
                _minute(k.created_at),
                _minute(k.last_used_at),
                _minute(k.expires_at),
                _minute(k.revoked_at),
            )
            for k in api_auth.list_keys()
        ]
        headers = ["prefix", "name", "scopes", "rate", "created", "last used", "expires", "revoked"]
        print(render(headers, rows, "API keys (UTC; last use recorded to the minute)"))
    return 0


def _minute(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if at else ""


def _suppressions(args: argparse.Namespace) -> int:
    from clarion.ops import suppressions

    if args.action == "lift":
        print(suppressions.lift(args.user, args.channel, args.address, why=args.reason, by=args.by))
        return 0
    print(
        suppressions.listing(
            user_id=args.user,
            channel=args.channel,
            address=args.address,
            lifted=args.lifted,
            limit=args.limit,
        )
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clarion", description="Notifications that cannot double-send."
    )
    p.add_argument("--version", action="version", version=f"clarion {clarion.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo", help="run the whole pipeline on embedded PostgreSQL and Redis"
    ).set_defaults(fn=_demo)
    sub.add_parser("services", help="run embedded PostgreSQL and Redis until Ctrl-C").set_defaults(
        fn=_services
    )
    mig = sub.add_parser("migrate", help="bring the database schema up to date")
    mig.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="hash-partition the per-recipient tables by user_id into N partitions (the shape "
        "Citus distributes); default CLARION_PARTITIONS; running it again changes nothing",
    )
    mig.add_argument(
        "--down",
        action="store_true",
        help="remove clarion from the database: every revision down, then its version table and "
        "(if empty) its schema; a host app's tables and Alembic history are untouched",
    )
    mig.set_defaults(fn=_migrate)
    w = sub.add_parser("worker", help="run a Celery worker for one or more lanes")
    w.add_argument(
        "--lane",
        action="append",
        choices=QUEUES,
        help="lane queue to consume (repeatable; default: all)",
    )
    w.add_argument("--concurrency", "-c", type=int, default=2)
    w.add_argument(
        "--name",
        help="Celery node name before the @host (default: the lanes and this process id, so two "
        "workers on one host never share a name; it survives the worker's restarts)",
    )
    w.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    w.add_argument("--loglevel", default="INFO")
    w.add_argument(
        "--no-restart",
        action="store_true",
        help="exec the celery worker directly instead of restarting it when it exits",
    )
    w.add_argument(
        "--restart-delay",
        type=float,
        default=1.0,
        help="seconds before the first restart; doubled up to 30 while it keeps exiting",
    )
    w.set_defaults(fn=_worker)
    b = sub.add_parser("beat", help="run the beat clock (one is enough; two are harmless)")
    b.add_argument("--loglevel", default="INFO")
    b.set_defaults(fn=_beat)
    sub.add_parser("stats", help="print counts by state, reason and queue").set_defaults(fn=_stats)
    bs = sub.add_parser("broadcasts", help="recent broadcasts, or one's progress (and --cancel)")
    bs.add_argument("id", type=int, nargs="?", help="a broadcast: its progress by reason")
    bs.add_argument("--cancel", action="store_true", help="stop requesting the rest of it")
    bs.set_defaults(fn=_broadcasts)
    bc = sub.add_parser("broadcast", help="send a type to an audience (try --dry-run first)")
    bc.add_argument("type")
    bc.add_argument("--topic", help="the members of this topic")
    bc.add_argument(
        "--segment",
        action="append",
        help="field=value over recipient fields (repeatable): country, locale, org, timezone, "
        "subdivision",
    )
    bc.add_argument("--var", action="append", help="template variable name=value (repeatable)")
    bc.add_argument("--at", help="HH:MM in each recipient's zone, or an ISO instant (default: now)")
    bc.add_argument(
        "--passed",
        default="tomorrow",
        choices=["tomorrow", "skip"],
        help="recipients whose HH:MM passed today get tomorrow's, or are skipped",
    )
    bc.add_argument("--key", help="idempotency key: the same key starts nothing new")
    bc.add_argument("--dry-run", action="store_true", help="count by channel and reason only")
    bc.set_defaults(fn=_broadcast)
    web_command.add_web(sub)
    web_command.add_ping(sub)
    fl = sub.add_parser("flower", help="run Flower on the clarion broker")
    fl.add_argument("--port", type=int, default=5555)
    fl.add_argument("--address", default="127.0.0.1", help="interface to listen on")
    fl.add_argument(
        "--broker-api",
        help="RabbitMQ's management API (http://user:pass@host:15672/api/): Flower reads "
        "RabbitMQ queue depths only from it (Redis needs nothing)",
    )
    fl.add_argument(
        "--unauthenticated",
        action="store_true",
        help="no login (only with a loopback --address); default: CLARION_FLOWER_BASIC_AUTH, "
        "or a login made up and printed",
    )
    fl.set_defaults(fn=_flower)
    s = sub.add_parser("send", help="request one notification (try --dry-run first)")
    s.add_argument("type")
    s.add_argument("--user", required=True)
    s.add_argument(
        "--var", action="append", metavar="NAME=VALUE", help="template variable (repeatable)"
    )
    s.add_argument("--event-id")
    s.add_argument("--occurrence-key")
    s.add_argument(
        "--dry-run", action="store_true", help="print the plan gate by gate; write nothing"
    )
    s.set_defaults(fn=_send)
    pv = sub.add_parser(
        "preview", help="render a type exactly as a recipient would get it (writes nothing)"
    )
    pv.add_argument("type")
    pv.add_argument("--version", type=int, help="template version (default: the latest)")
    pv.add_argument("--channel", help="one channel (default: every channel of the type)")
    pv.add_argument("--locale", help="the recipient's locale, e.g. de-AT (default: the catalog's)")
    pv.add_argument(
        "--var", action="append", metavar="NAME=VALUE", help="over the version's samples"
    )
    pv.add_argument("--json", action="store_true", help="the renderings and requests as JSON")
    pv.set_defaults(fn=_preview)
    e = sub.add_parser("explain", help="why did (or didn't) a recipient get something")
    e.add_argument("who", nargs="?", metavar="USER", help="the recipient (or --user)")
    e.add_argument("--user")
    e.add_argument("--type")
    e.add_argument("--since", help="2d, 6h, 30m or an ISO time (default: 30 days)")
    e.add_argument("--limit", type=int, default=20)
    e.set_defaults(fn=_explain)
    fg = sub.add_parser("forget", help="erase a recipient's personal data (docs/how-to/erasure.md)")
    fg.add_argument("--user", required=True)
    fg.set_defaults(fn=_forget)
    a = sub.add_parser("arm", help="arm a recurring series (try --dry-run first)")
    a.add_argument("type")
    a.add_argument("--user", required=True)
    a.add_argument(
        "--anchor",
        required=True,
        help="local wall time of the first occurrence, e.g. 2026-12-07T09:00",
    )
    a.add_argument("--every", required=True, help="1d, 2w, 1mo, 3wd (working days)")
    a.add_argument("--count", type=int)
    a.add_argument("--until", help="ISO time with zone; no occurrence after it")
    a.add_argument("--var", action="append", metavar="NAME=VALUE")
    a.add_argument(
        "--calendar",
        default="send",
        choices=["skip", "next_working_day", "send"],
        help="what an occurrence on a non-working day does",
    )
    a.add_argument("--key", help="series key; arming the same key twice changes nothing")
    a.add_argument("--dry-run", action="store_true")
    a.set_defaults(fn=_arm)
    rd = sub.add_parser(
        "redrive", help="re-queue failed (or unknown) deliveries (try --dry-run first)"
    )
    rd.add_argument("--type", help="only this notification type")
    rd.add_argument("--reason", help="only this failure reason, e.g. template_missing")
    rd.add_argument(
        "--state",
        action="append",
        choices=["failed", "unknown"],
        help="deliveries in this state (repeatable; default: failed)",
    )
    rd.add_argument("--since", help="stopped at or after: 2d, 6h, 30m or an ISO time")
    rd.add_argument("--until", help="stopped before: 2d, 6h, 30m or an ISO time")
    rd.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
    rd.add_argument(
        "--dry-run", action="store_true", help="show what would be re-queued; change nothing"
    )
    rd.set_defaults(fn=_redrive)
    sc = sub.add_parser("schedule", help="what will fire for a recipient, when, and why not")
    sc.add_argument("--user", required=True)
    sc.add_argument("--days", type=int, default=14)
    sc.set_defaults(fn=_schedule)
    si = sub.add_parser(
        "simulate", help="a recipient's series through the real planner on a virtual clock"
    )
    si.add_argument("--user", required=True)
    si.add_argument("--days", type=int, default=365)
    si.set_defaults(fn=_simulate)
    ln = sub.add_parser("link", help="print a signed link to a recipient's preferences page")
    ln.add_argument("--user", required=True)
    ln.add_argument("--ttl", default="7d", help="how long it works: 30m, 12h, 7d, 2w (default 7d)")
    ln.set_defaults(fn=_link)
    sl = sub.add_parser(
        "staff-link", help="print a signed, expiring link to the support activity page"
    )
    sl.add_argument("--staff", required=True, help="who it is for (named in the page's log)")
    sl.add_argument("--ttl", default="8h", help="how long it works: 30m, 8h (default), at most 24h")
    sl.set_defaults(fn=_staff_link)
    k = sub.add_parser("keys", help="create, list and revoke HTTP API keys")
    ks = k.add_subparsers(dest="action", required=True)
    kc = ks.add_parser("create", help="make a key; prints it once (only its hash is kept)")
    kc.add_argument("--name", required=True, help="who uses it, e.g. billing-service")
    kc.add_argument(
        "--scope",
        action="append",
        help="what the key may do (repeatable): events:write, requests:read, preferences:read, "
        "preferences:write, recipients:read, recipients:write, recipients:erase, "
        "escalations:write, webhooks:manage, topics:write, broadcasts:write, broadcasts:read, "
        "activity:read",
    )
    kc.add_argument("--rate", default="100/s", help="requests per window: 100/s, 6000/m, 50/10s")
    kc.add_argument(
        "--expires", help="refuse the key (401) after 30m, 12h, 90d, 2w (default: never)"
    )
    ks.add_parser(
        "list", help="every key, live and revoked, its last use and expiry (never the secrets)"
    )
    kr = ks.add_parser(
        "revoke", help="revoke a key: every web process refuses it (401) within 2 seconds"
    )
    kr.add_argument("prefix", help="the key's prefix (from keys list) or the whole key")
    k.set_defaults(fn=_keys)
    _suppressions_parser(sub)
    events.add_parser(sub)
    r = sub.add_parser("receiver", help="a local webhook receiver that verifies and counts")
    r.add_argument("--port", type=int, default=8099)
    r.set_defaults(fn=_receiver)
    return p


def _suppressions_parser(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("suppressions", help="list the suppression list; lift an entry (audited)")
    ss = sp.add_subparsers(dest="action", required=True)
    sl = ss.add_parser("list", help="entries matching every filter given, newest first")
    sl.add_argument("--user")
    sl.add_argument("--channel")
    sl.add_argument("--address")
    sl.add_argument(
        "--lifted", action="store_true", help="the audit log of lifted entries: who, when, why"
    )
    sl.add_argument("--limit", type=int, default=100)
    lift = ss.add_parser(
        "lift", help="take an address off the list for everyone, recording who, when and why"
    )
    lift.add_argument("--user", help="only if this user has an entry for the address")
    lift.add_argument("--channel", required=True)
    lift.add_argument("--address", required=True)
    lift.add_argument("--reason", required=True, help="why, e.g. 'false bounce, ticket 812'")
    lift.add_argument("--by", help="who lifts it (default: the login name)")
    sp.set_defaults(fn=_suppressions)


SERVICES = frozenset({"services", "worker", "beat", "web", "flower", "demo", "receiver"})


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        json_logs = settings.get().log_format == "json"
    except ClarionError:  # a bad setting: said below, by the command that reads it, in text
        json_logs = False
    # Services log their progress at INFO; a one-shot command prints its result and, on stderr,
    # only what went wrong (not, say, which catalog it loaded).
    level = logging.INFO if args.command in SERVICES else logging.WARNING
    logs.configure("json" if json_logs else "text", level)
    try:
        sys.exit(args.fn(args))
    except ClarionError as exc:
        if json_logs:
            logging.getLogger("clarion.cli").error("%s", exc, extra={"action": "command_failed"})
        else:
            print(f"clarion: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

"""The circuit breaker's policy (adapters/circuit.py) as pure functions over an injected clock,
and the failover rule (adapters/failover.py) over providers that answer as scripted: which
provider is asked, and when a message may go to the next one."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from clarion.adapters.circuit import (
    Circuit,
    Circuits,
    MemoryBackend,
    Policy,
    State,
    admit,
    record,
    reopens_in,
)
from clarion.adapters.failover import FailoverAdapter, Provider, confirmed_failure
from clarion.errors import (
    DeferredSendError,
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult

POLICY = Policy(failures=3, open_for=10.0, probe_for=5.0)
OPEN = Circuit(State.OPEN, 3, 100.0)
PROBING = Circuit(State.HALF_OPEN, 3, 110.0)


@pytest.mark.parametrize(
    ("circuit", "now", "admitted", "after"),
    [
        (Circuit(), 0.0, True, Circuit()),
        (Circuit(State.CLOSED, 2, 0.0), 5.0, True, Circuit(State.CLOSED, 2, 0.0)),
        (OPEN, 109.9, False, OPEN),  # still open
        (OPEN, 110.0, True, PROBING),  # open_for passed: this caller is the probe
        (PROBING, 114.9, False, PROBING),  # a probe is in flight: nobody else
        (PROBING, 115.0, True, Circuit(State.HALF_OPEN, 3, 115.0)),  # the probe went silent
    ],
)
def test_admit(circuit, now, admitted, after):
    assert admit(circuit, now, POLICY) == (admitted, after)


@pytest.mark.parametrize(
    ("circuit", "ok", "after"),
    [
        (Circuit(State.CLOSED, 2, 0.0), True, Circuit()),  # a success resets the count
        (Circuit(), False, Circuit(State.CLOSED, 1, 0.0)),
        (Circuit(State.CLOSED, 2, 0.0), False, Circuit(State.OPEN, 3, 50.0)),  # the third opens
        (PROBING, True, Circuit()),  # the probe took it: closed
        (PROBING, False, Circuit(State.OPEN, 4, 50.0)),  # the probe failed: open, timer anew
        (OPEN, False, Circuit(State.OPEN, 4, 100.0)),  # a straggler's failure: timer unchanged
        (OPEN, True, OPEN),  # a straggler's success (begun before it opened) is not a probe
    ],
)
def test_record(circuit, ok, after):
    assert record(circuit, ok, 50.0, POLICY) == after


def test_reopens_in_counts_down_to_the_probe():
    assert reopens_in(Circuit(), 0.0, POLICY) == 0.0
    assert reopens_in(OPEN, 104.0, POLICY) == pytest.approx(6.0)
    assert reopens_in(PROBING, 112.0, POLICY) == pytest.approx(3.0)
    assert reopens_in(OPEN, 200.0, POLICY) == 0.0


@pytest.mark.parametrize("bad", [{"failures": 0}, {"open_for": 0.0}, {"probe_for": -1.0}])
def test_a_policy_must_be_positive(bad):
    with pytest.raises(ValueError, match="circuit policy must be positive"):
        Policy(**bad)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_whole_outage_and_recovery_on_the_stores_clock():
    clock = Clock()
    circuits = Circuits(MemoryBackend(clock), POLICY)
    for _ in range(3):
        assert circuits.admit("email:a").admitted
        circuits.record("email:a", ok=False)
    assert circuits.read("email:a").after.state is State.OPEN
    clock.now += 9.9
    assert not circuits.admit("email:a").admitted
    clock.now += 0.1
    probe = circuits.admit("email:a")
    assert probe.admitted and probe.after.state is State.HALF_OPEN
    assert not circuits.admit("email:a").admitted  # one probe at a time
    closed = circuits.record("email:a", ok=True)
    assert closed.changed and closed.after == Circuit()
    assert circuits.admit("email:b").after == Circuit()  # each provider has its own


# --- the failover rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "confirmed"),
    [
        (TransientSendError("connection", "refused"), True),
        (TransientSendError("smtp_421", "service not available"), True),
        (PermanentSendError("http_401", "bad key"), True),
        (PermanentSendError("twilio_20003", "Authenticate"), True),
        (PermanentSendError("http_400", "bad address"), False),
        (UnknownSendError("http_500", "may have taken it"), False),
        (UnknownSendError("no_answer", "timeout"), False),
        (ThrottledError("http_429", "slow down", 1.0), False),
        (DeferredSendError("budget_full", "wait", retry_after=1.0), False),
    ],
)
def test_only_a_certain_failure_may_go_to_the_next_provider(error, confirmed):
    assert confirmed_failure(error) is confirmed


@dataclass
class Scripted:
    """A provider at the adapter boundary that answers from a script, and counts what it got."""

    name: str
    answers: list[SendError | None] = field(default_factory=list)
    got: list[int] = field(default_factory=list)
    channel: str = "email"
    needs_address: bool = True
    dedups_by_key: bool = False
    evidence_wait: float = 0.0

    def send(self, message: Message) -> SendResult:
        self.got.append(message.delivery_id)
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        return SendResult(
            platform="email", provider_message_id=f"{self.name}-{message.delivery_id}"
        )


class Alerts:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def failed_over(self, channel: str, provider: str, detail: str) -> None:
        self.events.append(("failed_over", channel, provider))

    def recovered(self, channel: str, provider: str) -> None:
        self.events.append(("recovered", channel, provider))


def message(n: int = 1) -> Message:
    return Message(
        channel="email",
        type_key="receipt_email",
        category="transactional",
        content={"title": "t", "body": "b"},
        delivery_id=n,
        user_id="ana",
        occurrence_key="e1",
        address="ana@example.com",
        attempt=1,
        lane="transactional",
    )


def pair(*scripts: list[SendError | None]) -> tuple[FailoverAdapter, list[Scripted], Clock, Alerts]:
    clock, alerts = Clock(), Alerts()
    providers = [
        Scripted(name, list(s)) for name, s in zip(("sendgrid", "smtp"), scripts, strict=True)
    ]
    adapter = FailoverAdapter(
        "email",
        [Provider(p.name, p) for p in providers],
        Circuits(MemoryBackend(clock), POLICY),
        alerts,
    )
    return adapter, providers, clock, alerts


def test_a_refused_connection_goes_to_the_next_provider_which_is_recorded():
    adapter, (first, second), _, alerts = pair([TransientSendError("connection", "refused")], [])
    result = adapter.send(message())
    assert result.platform == "smtp" and result.provider_message_id == "smtp-1"
    assert (first.got, second.got) == ([1], [1])
    assert alerts.events == []  # one refusal: counted, but its circuit is not open


@pytest.mark.parametrize(
    "error",
    [
        UnknownSendError("http_500", "may have taken it"),
        ThrottledError("http_429", "slow down", 1.0),
        PermanentSendError("http_400", "bad address"),
    ],
)
def test_an_unknown_outcome_a_throttle_or_a_bad_message_never_fails_over(error):
    adapter, (first, second), _, alerts = pair([error], [])
    with pytest.raises(SendError, match=error.reason):
        adapter.send(message())
    assert (first.got, second.got) == ([1], [])
    assert alerts.events == []


def test_an_open_circuit_skips_the_provider_until_its_probe_succeeds():
    outage: list[SendError | None] = [UnknownSendError("http_503", "down")] * 3
    adapter, (first, second), clock, alerts = pair(outage, [])
    for n in range(1, 4):  # three unknown outcomes: no failover, but they open the circuit
        with pytest.raises(UnknownSendError, match="http_503"):
            adapter.send(message(n))
    assert adapter.send(message(4)).platform == "smtp"  # skipped without being asked
    assert (first.got, second.got) == ([1, 2, 3], [4])
    clock.now += POLICY.open_for
    assert adapter.send(message(5)).platform == "sendgrid"  # the probe, taken: closed again
    assert adapter.send(message(6)).platform == "sendgrid"
    assert (first.got, second.got) == ([1, 2, 3, 5, 6], [4])
    assert alerts.events == [
        ("failed_over", "email", "sendgrid"),
        ("recovered", "email", "sendgrid"),
    ]


def test_every_circuit_open_defers_until_the_first_probe_without_asking_anyone():
    down: list[SendError | None] = [TransientSendError("connection", "refused")] * 3
    adapter, providers, clock, _ = pair(down, list(down))
    for n in range(3):
        with pytest.raises(TransientSendError, match="all_providers_failed"):
            adapter.send(message(n))
    asked = [len(p.got) for p in providers]
    clock.now += 4.0
    with pytest.raises(DeferredSendError, match="circuits_open") as deferred:
        adapter.send(message(9))
    assert deferred.value.retry_after == pytest.approx(POLICY.open_for - 4.0)
    assert [len(p.got) for p in providers] == asked == [3, 3]


def test_an_account_refused_fails_over():
    adapter, (first, second), _, _ = pair([PermanentSendError("http_401", "bad key")], [])
    assert adapter.send(message()).platform == "smtp"
    assert (first.got, second.got) == ([1], [1])


def test_failover_takes_the_most_careful_capabilities_of_its_providers():
    adapter, _, _, _ = pair([], [])
    assert adapter.dedups_by_key is False and not hasattr(adapter, "reconcile")
    with pytest.raises(ValueError, match="two providers or more"):
        FailoverAdapter("email", [Provider("a", Scripted("a"))], adapter.circuits)


@dataclass
class Findable(Scripted):
    found: SendResult | None | SendError = None

    def reconcile(self, message: Message, since: datetime) -> SendResult | None:
        if isinstance(self.found, SendError):
            raise self.found
        return self.found


@pytest.mark.parametrize(
    ("first", "second", "expect"),
    [
        (None, SendResult(platform="sms", provider_message_id="SM2"), "twilio_backup"),
        (None, None, None),
        (UnknownSendError("lookup_inconclusive", "?"), None, UnknownSendError),
        (
            TransientSendError("lookup_failed", "down"),
            UnknownSendError("x", "?"),
            TransientSendError,
        ),
    ],
)
def test_a_reconcile_asks_every_provider(first, second, expect):
    a, b = Findable("twilio", found=first), Findable("twilio_backup", found=second)
    adapter = FailoverAdapter(
        "sms",
        [Provider(a.name, a), Provider(b.name, b)],
        Circuits(MemoryBackend(Clock()), POLICY),
    )
    since = datetime(2026, 1, 1, tzinfo=UTC)
    if isinstance(expect, type):
        with pytest.raises(expect, match="lookup|x"):
            adapter.reconcile(message(), since)
    elif expect is None:
        assert adapter.reconcile(message(), since) is None
    else:
        found = adapter.reconcile(message(), since)
        assert found is not None and found.platform == expect

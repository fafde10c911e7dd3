"""standins/fake_smtp.py on its own, driven by plain smtplib: what it takes, what it refuses, and the
answers it loses on purpose (counted at the fake)."""

from __future__ import annotations

import re
import smtplib
import ssl
from collections.abc import Iterator
from email.message import EmailMessage

import pytest

from clarion.standins.fake_smtp import FakeSmtp, self_signed


@pytest.fixture
def relay() -> Iterator[FakeSmtp]:
    with FakeSmtp() as server:
        yield server


def _mail(to: str = "ana@example.com") -> EmailMessage:
    mail = EmailMessage()
    mail["From"], mail["To"], mail["Subject"] = "c@clarion.test", to, "Hello"
    mail["Message-ID"] = "<k1@clarion.test>"
    mail.set_content("hello\n.leading dot")
    return mail


def _client(relay: FakeSmtp, timeout: float = 5) -> smtplib.SMTP:
    return smtplib.SMTP("127.0.0.1", relay.port, timeout=timeout)


def test_it_keeps_the_envelope_and_the_message(relay):
    with _client(relay) as client:
        refused = client.send_message(_mail(), to_addrs=["ana@example.com", "bo@example.com"])
    assert refused == {}
    [got] = relay.messages
    assert got.mail_from == "c@clarion.test" and got.answered
    assert got.rcpt_tos == ("ana@example.com", "bo@example.com")
    assert got.message["Message-ID"] == "<k1@clarion.test>"
    assert got.message.get_content().replace("\r\n", "\n") == "hello\n.leading dot\n"
    assert relay.received("bo@example.com") == [got] and relay.received("x@example.com") == []


def test_a_rejected_address_gets_550_at_rcpt_and_nothing_is_taken(relay):
    relay.reject("Gone@Example.com")
    with (
        _client(relay) as client,
        pytest.raises(
            smtplib.SMTPRecipientsRefused, match=r"^\{'gone@example.com': \(550, .*User unknown"
        ) as refused,
    ):
        client.send_message(_mail("gone@example.com"))
    code, text = refused.value.recipients["gone@example.com"]
    assert code == 550 and text.startswith(b"5.1.1")
    assert relay.messages == []


@pytest.mark.parametrize(
    ("stage", "reply", "error"),
    [
        ("mail", "451 4.3.2 Service busy", smtplib.SMTPSenderRefused),
        ("rcpt", "451 4.3.0 Try again later", smtplib.SMTPRecipientsRefused),
        ("data", "554 5.6.0 Message rejected", smtplib.SMTPDataError),
    ],
)
def test_scripted_replies_are_used_once(relay, stage, reply, error):
    relay.fail(stage, reply)
    with _client(relay) as client:
        with pytest.raises(error, match=re.escape(reply.split(" ", 1)[1])):
            client.send_message(_mail())
        client.rset()
        assert client.send_message(_mail()) == {}  # the script is spent
    assert len(relay.messages) == 1


def test_a_dropped_answer_after_the_data_is_kept_and_counted(relay):
    relay.lose("drop")
    client = _client(relay)
    with pytest.raises(smtplib.SMTPServerDisconnected, match=r"^Connection unexpectedly closed$"):
        client.send_message(_mail())
    assert len(relay.messages) == 1 and relay.lost == 1 and not relay.messages[0].answered
    with _client(relay) as again:  # the next connection is answered as usual
        again.send_message(_mail())
    assert len(relay.messages) == 2 and relay.lost == 1


def test_a_late_answer_is_past_the_clients_timeout(relay):
    relay.lose("late", delay=1.0)
    client = _client(relay, timeout=0.3)
    with pytest.raises(smtplib.SMTPServerDisconnected, match="timed out"):
        client.send_message(_mail())
    assert relay.lost == 1


def test_auth_is_required_when_asked_for():
    with FakeSmtp(auth=("relay-user", "pa:ss")) as relay:
        assert relay.url.startswith("smtp://relay-user:pa:ss@127.0.0.1:")
        with _client(relay) as client:
            with pytest.raises(
                smtplib.SMTPSenderRefused, match=r"^\(530, b'5.7.0 Authentication required'"
            ) as refused:
                client.send_message(_mail())
            assert refused.value.smtp_code == 530
        with (
            _client(relay) as client,
            pytest.raises(
                smtplib.SMTPAuthenticationError,
                match=r"^\(535, b'5.7.8 Authentication credentials invalid'\)$",
            ),
        ):
            client.login("relay-user", "wrong")
        with _client(relay) as client:
            client.login("relay-user", "pa:ss")
            client.send_message(_mail())
        assert relay.logins == ["relay-user"] and len(relay.messages) == 1


def test_starttls_and_implicit_tls_with_a_self_signed_certificate(tmp_path):
    context, cafile = self_signed(tmp_path)
    trusted = ssl.create_default_context(cafile=str(cafile))
    with FakeSmtp(tls=context) as relay:
        assert relay.url.startswith("smtp+starttls://")
        with (
            _client(relay) as client,
            pytest.raises(
                smtplib.SMTPSenderRefused, match=r"^\(530, b'Must issue a STARTTLS command first'"
            ),
        ):
            client.send_message(_mail())  # STARTTLS is required
        with _client(relay) as client:
            client.starttls(context=trusted)
            client.send_message(_mail())
        with (
            _client(relay) as client,
            pytest.raises(
                ssl.SSLCertVerificationError,
                match=r"CERTIFICATE_VERIFY_FAILED.*self-signed certificate",
            ),
        ):
            client.starttls(context=ssl.create_default_context())  # not trusted by default
    with FakeSmtp(tls=context, implicit_tls=True) as smtps:
        assert smtps.url.startswith("smtps://")
        with smtplib.SMTP_SSL("127.0.0.1", smtps.port, context=trusted, timeout=5) as client:
            client.send_message(_mail())
        assert len(smtps.messages) == 1
    assert len(relay.messages) == 1


def test_unknown_script_names_are_refused(relay):
    with pytest.raises(ValueError, match="stage"):
        relay.fail("helo", "500 no")
    with pytest.raises(ValueError, match="mode"):
        relay.lose("5xx")

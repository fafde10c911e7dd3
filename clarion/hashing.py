"""Keyed hashes of addresses: what erasure keeps of a suppressed address.

    key = address_key(settings.get())
    hashed(key, "email", "ann@example.com")  # -> "hmac:5c1f…" (64 hex digits)

HMAC-SHA256 over the channel and the address, under a server secret: the suppression list can
still recognise the address when someone registers it again, but the table does not hold it, and
nobody without the secret can test guesses against it (a plain SHA-256 of an email address or a
phone number is reversed by trying the likely ones). Pure: the key is a parameter.
"""

from __future__ import annotations

import hashlib
import hmac

from clarion.settings import Settings

PREFIX = "hmac:"


def address_key(s: Settings) -> bytes:
    """CLARION_ADDRESS_SECRET, else a key derived from CLARION_WEBHOOK_SECRET (never that secret
    itself, so a webhook signature is never an address hash)."""
    if s.address_secret:
        return s.address_secret.encode()
    return hmac.new(s.webhook_secret.encode(), b"clarion address key v1", hashlib.sha256).digest()


def hashed(key: bytes, channel: str, address: str) -> str:
    """`hmac:` and the hex HMAC-SHA256 of `channel`, a unit separator and `address`."""
    mac = hmac.digest(key, f"{channel}\x1f{address}".encode("utf-8", "surrogatepass"), "sha256")
    return PREFIX + mac.hex()


def is_hashed(address: str) -> bool:
    return address.startswith(PREFIX)

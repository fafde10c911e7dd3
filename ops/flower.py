"""`clarion flower`: Flower on the clarion broker, never open by default.

Flower alone listens on every interface with no login. Here it listens on 127.0.0.1 unless told
otherwise, and asks for HTTP basic auth: CLARION_FLOWER_BASIC_AUTH (`user:password`, comma
separated for several), or Flower's own FLOWER_BASIC_AUTH / FLOWER_AUTH (OAuth) if set, or else a
login made up for this run and printed once. `--unauthenticated` turns auth off, on a loopback
address only. Credentials go to Flower in its environment, not its command line (`ps` shows that).
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from clarion.errors import InvalidRequest

FLOWER_OWN = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")  # Flower's own auth, set by the operator


@dataclass(frozen=True)
class Plan:
    """What Flower is started with: extra environment, and a line to print (or None)."""

    env: dict[str, str]
    notice: str | None


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def plan(
    address: str, *, unauthenticated: bool, configured: str | None, environ: Mapping[str, str]
) -> Plan:
    """The pure decision: which auth Flower runs with, or why it must not start."""
    if unauthenticated:
        if not is_loopback(address):
            raise InvalidRequest(
                f"--unauthenticated listens on {address}, which is not a loopback address: "
                "anyone who reaches it could revoke tasks; drop the flag or use --address 127.0.0.1"
            )
        return Plan({}, f"Flower on http://{address}: no login (loopback only)")
    if configured:
        if any(":" not in pair for pair in configured.split(",")):
            raise InvalidRequest("CLARION_FLOWER_BASIC_AUTH takes user:password[,user:password]")
        return Plan({"FLOWER_BASIC_AUTH": configured}, None)
    if any(environ.get(name) for name in FLOWER_OWN):
        return Plan({}, None)  # Flower reads the operator's own setting itself
    password = secrets.token_urlsafe(18)
    return Plan(
        {"FLOWER_BASIC_AUTH": f"clarion:{password}"},
        f"Flower login for this run: clarion / {password} "
        "(set CLARION_FLOWER_BASIC_AUTH=user:password to choose one)",
    )

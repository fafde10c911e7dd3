"""Collapse in place, the pure parts: the variables a collapse type's templates get, its
update_seconds, and a follower that meets a spent fatigue cap (gates.pipeline), no services."""

from __future__ import annotations

from datetime import timedelta

import pytest

from clarion.adapters.base import Channel, can_update
from clarion.adapters.inapp import InAppAdapter
from clarion.adapters.slack import SlackAdapter
from clarion.adapters.teams import TeamsAdapter
from clarion.adapters.webhook import WebhookAdapter
from clarion.catalog import Catalog
from clarion.catalog.model import CatalogError
from tests.support.plans import NOW, ORG_CAPPED, run, user_cap
from tests.support.records import group, recipient


def _catalog(collapse: dict | None, title: str = "{{ collapsed_count }} hosts") -> Catalog:
    options = {"collapse": collapse} if collapse is not None else {}
    return Catalog.from_dict(
        {
            "types": {
                "cpu": {
                    "category": "alert",
                    "channels": ["slack"],
                    "required": ["cluster"],
                    "options": options,
                    "templates": [{"version": 1, "title": title}],
                }
            }
        }
    )


def test_a_collapse_type_renders_its_first_send_as_a_group_of_one_and_updates_with_the_count():
    title = "{{ collapsed_count }} hosts{{ ' (and counting)' if collapse_open else '' }}"
    cpu = _catalog({"key": "cpu:{{ cluster }}", "update_seconds": 5}, title).types["cpu"]
    assert cpu.render(1, "slack", {"cluster": "prod"}) == {"title": "1 hosts"}
    live = {"cluster": "prod", "collapsed_count": 214, "collapse_open": True}
    assert cpu.render(1, "slack", live) == {"title": "214 hosts (and counting)"}
    assert cpu.collapse_update_seconds == 5.0
    assert _catalog({"key": "k"}).types["cpu"].collapse_update_seconds == 10.0


def test_only_collapse_types_get_the_count_variables():
    with pytest.raises(CatalogError, match="uses collapsed_count, which are neither required"):
        _catalog(None)


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_update_seconds_and_window_seconds_must_be_positive_numbers(bad):
    for name in ("update_seconds", "window_seconds"):
        with pytest.raises(CatalogError, match=f"options.collapse.{name} must be a positive"):
            _catalog({"key": "k", name: bad})


def test_a_follower_collapses_even_when_the_organisation_cap_is_spent():
    """It adds no notification (its leader spent the slot), so it is counted on the leader and
    updates its message, rather than being folded into the summary."""
    spent = {**user_cap(1), ("org:acme", NOW.strftime("%Y-%m-%dT%H")): 10}
    open_group = group("thread-42", 5, NOW + timedelta(seconds=100), 2)
    who = recipient(org_id="acme", addresses={"email": "a@example.com"})
    follower = run(
        "mention",
        variables={"thread": 42},
        policy=ORG_CAPPED,
        counters=spent,
        collapses=open_group,
        who=who,
    )
    assert (follower.outcome, follower.fold, follower.join_collapse) == (
        "collapse",
        None,
        "thread-42",
    )
    leader = run("mention", variables={"thread": 43}, policy=ORG_CAPPED, counters=spent, who=who)
    assert leader.outcome == "fold"  # a new group's leader is a new notification: over the cap


class Bare(Channel):
    channel = "bare"


def test_which_channels_update_in_place():
    assert can_update(SlackAdapter) and can_update(TeamsAdapter) and can_update(InAppAdapter)
    assert not can_update(WebhookAdapter) and not can_update(Bare())
    with pytest.raises(NotImplementedError, match="channel 'bare' cannot update"):
        Bare().update(None, "1")

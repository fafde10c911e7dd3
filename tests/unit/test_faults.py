"""clarion/faults.py: parsing CLARION_FAULTS and firing fault points ('crash' is not tested here)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clarion import faults, settings
from clarion.errors import ConfigurationError, FaultInjected
from clarion.faults import POINTS, Fault, parse


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", {}),
        (" , ,", {}),
        ("deliver.after_send=crash", {"deliver.after_send": Fault("deliver.after_send", "crash")}),
        (
            "deliver.after_send=crash*3",
            {"deliver.after_send": Fault("deliver.after_send", "crash", 0.0, 3)},
        ),
        (
            "route.before_commit=raise",
            {"route.before_commit": Fault("route.before_commit", "raise")},
        ),
        (
            "deliver.after_claim=sleep:2.5",
            {"deliver.after_claim": Fault("deliver.after_claim", "sleep", 2.5)},
        ),
        (
            "deliver.after_claim=sleep:90*1",
            {"deliver.after_claim": Fault("deliver.after_claim", "sleep", 90.0, 1)},
        ),
        (
            "deliver.after_claim=sleep",
            {"deliver.after_claim": Fault("deliver.after_claim", "sleep", 0.0)},
        ),
        (
            " deliver.after_send=crash*3 , route.before_commit=raise ",
            {
                "deliver.after_send": Fault("deliver.after_send", "crash", 0.0, 3),
                "route.before_commit": Fault("route.before_commit", "raise"),
            },
        ),
        (
            "notify.before_publish=raise,notify.before_publish=crash*2",  # the last entry wins
            {"notify.before_publish": Fault("notify.before_publish", "crash", 0.0, 2)},
        ),
    ],
)
def test_parse_valid(spec: str, expected: dict[str, Fault]) -> None:
    assert parse(spec) == expected


@pytest.mark.parametrize("point", sorted(POINTS))
def test_every_known_point_parses(point: str) -> None:
    assert parse(f"{point}=raise") == {point: Fault(point, "raise")}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("deliver.after_sned=crash", "unknown fault point 'deliver.after_sned'"),
        ("crash", "unknown fault point 'crash'"),
        ("=raise", "unknown fault point ''"),
        ("DELIVER.AFTER_SEND=crash", "unknown fault point"),
        ("route.before_commit=raise,nope=raise", "unknown fault point 'nope'"),
        ("deliver.after_send", "unknown fault action '' for deliver.after_send"),
        ("deliver.after_send=explode", "unknown fault action 'explode'"),
        ("deliver.after_send=Crash", "unknown fault action 'Crash'"),
        ("deliver.after_send=kill*2", "unknown fault action 'kill'"),
        ("deliver.after_send=crash*x", "malformed fault entry"),
        ("deliver.after_send=crash*1.5", "malformed fault entry"),
        ("deliver.after_claim=sleep:long", "malformed fault entry"),
        ("deliver.after_claim=sleep:1*2*3", "malformed fault entry"),
        ("deliver.after_send=crash*", "malformed fault entry"),
        ("deliver.after_send=crash*0", "must be at least 1"),
        ("deliver.after_send=crash*-1", "must be at least 1"),
    ],
)
def test_parse_invalid(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse(spec)


def test_unknown_point_error_names_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"^unknown fault point 'x'; known: ") as caught:
        parse("x=raise")
    assert all(point in str(caught.value) for point in POINTS)


# --- hit() --------------------------------------------------------------------------------------


@pytest.fixture
def fault_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Path]]:
    """Switch faults on for this process: call with a CLARION_FAULTS value; returns the count folder."""
    for key in [k for k in os.environ if k.startswith("CLARION_")]:
        monkeypatch.delenv(key)
    folder = tmp_path / "faults"

    def switch(spec: str) -> Path:
        monkeypatch.setenv("CLARION_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("CLARION_FAULTS", spec)
        monkeypatch.setenv("CLARION_FAULTS_DIR", str(folder))
        settings.reset()
        faults.reset()
        return folder

    yield switch
    monkeypatch.undo()
    settings.reset()
    faults.reset()


def test_hit_does_nothing_when_switched_off(fault_env: Callable[[str], Path]) -> None:
    folder = fault_env("")
    for point in POINTS:
        faults.hit(point)
    faults.hit("not.a.point")
    assert not folder.exists()


def test_hit_raise_fires_every_time_without_times(fault_env: Callable[[str], Path]) -> None:
    folder = fault_env("route.before_commit=raise")
    for _ in range(3):
        with pytest.raises(FaultInjected, match="route.before_commit"):
            faults.hit("route.before_commit")
    faults.hit("route.after_commit")  # other points stay quiet
    assert not folder.exists()  # unlimited faults keep no count


def test_hit_times_limits_firing(fault_env: Callable[[str], Path]) -> None:
    folder = fault_env("deliver.after_claim=raise*2,route.after_commit=raise*1")
    fired = 0
    for _ in range(5):
        try:
            faults.hit("deliver.after_claim")
        except FaultInjected:
            fired += 1
    assert fired == 2
    assert sorted(p.name for p in folder.iterdir()) == [
        "deliver.after_claim.1",
        "deliver.after_claim.2",
    ]
    with pytest.raises(FaultInjected, match=r"^route\.after_commit$"):
        faults.hit("route.after_commit")
    faults.hit("route.after_commit")


def test_times_count_is_shared_through_the_folder(fault_env: Callable[[str], Path]) -> None:
    # Another process already took turn 1 of 2: only one turn is left for us.
    folder = fault_env("notify.before_publish=raise*2")
    folder.mkdir(parents=True)
    (folder / "notify.before_publish.1").touch()
    with pytest.raises(FaultInjected, match=r"^notify\.before_publish$"):
        faults.hit("notify.before_publish")
    faults.hit("notify.before_publish")
    assert (folder / "notify.before_publish.2").exists()


def test_times_count_survives_a_reset(fault_env: Callable[[str], Path]) -> None:
    fault_env("route.before_commit=raise*1")
    with pytest.raises(FaultInjected, match=r"^route\.before_commit$"):
        faults.hit("route.before_commit")
    faults.reset()
    settings.reset()
    faults.hit("route.before_commit")  # the turn was used up, even for a "new process"


def test_faults_dir_defaults_to_home(
    fault_env: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fault_env("route.before_commit=raise*1")
    monkeypatch.delenv("CLARION_FAULTS_DIR")
    settings.reset()
    with pytest.raises(FaultInjected, match=r"^route\.before_commit$"):
        faults.hit("route.before_commit")
    assert (tmp_path / "home" / "faults" / "route.before_commit.1").exists()


def test_hit_sleep(fault_env: Callable[[str], Path]) -> None:
    fault_env("deliver.after_claim=sleep:0.01")
    faults.hit("deliver.after_claim")  # returns after sleeping; raises nothing


def test_bad_spec_fails_on_first_hit(fault_env: Callable[[str], Path]) -> None:
    fault_env("deliver.after_send=explode")
    with pytest.raises(
        ConfigurationError, match=r"^unknown fault action 'explode' for deliver\.after_send$"
    ):
        faults.hit("deliver.after_send")

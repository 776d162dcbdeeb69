"""docs/architecture.md's pictures are drawn from the code (scripts/architecture.py): every
module belongs to a room, every hop of the request's path is still in the code, and the
pictures in the doc are the ones the code draws now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import architecture  # noqa: E402
from architecture import CLIENT, Hop  # noqa: E402


def test_the_pictures_are_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "architecture.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr or done.stdout


def test_every_hop_of_the_request_path_is_in_the_code() -> None:
    """When the code moves, this names the hop (numbered as in the doc) to move in PATH."""
    broken = architecture.broken()
    assert not broken, "\n".join(broken)


def test_a_hop_that_is_not_in_the_code_is_reported() -> None:
    made_up = [
        Hop("server.sse:response", "server.sse:event", "a true hop? no: response calls no event()"),
        Hop("rounds.loop:run", "rounds.verify:Verifier.judge_everything", "a method nobody wrote"),
        Hop("nowhere:run", "rounds.loop:run", "a module that does not exist"),
        Hop("server.runs:Runs.events", "server.sse:event", "event returns bytes, it yields nothing", via="events",
            back=True),
        Hop(CLIENT, "server.oai:router.chat", "no such route", via="/v2/chat"),
        Hop("server.sse:named", "server.sse:event", "a true hop: named calls event()"),
        Hop("rounds.loop:run", "rounds.verify:Verifier.__call__", "a bad label; mermaid ends a message at a semicolon", via="verify"),
    ]
    broken = architecture.broken(made_up)
    assert [line.split(" ", 2)[1] for line in broken] == ["1", "2", "3", "4", "5", "7"], "\n".join(broken)
    assert "fly_cpp.server.sse.response no longer calls or iterates event" in broken[0]
    assert "fly_cpp.rounds.verify has no Verifier.judge_everything" in broken[1]
    assert "no module fly_cpp.nowhere" in broken[2]
    assert "fly_cpp.server.sse.event yields nothing" in broken[3]
    assert "not routed at /v2/chat" in broken[4]
    assert "label" in broken[5]


def test_a_broken_hop_stops_the_picture_and_is_named() -> None:
    true = Hop("server.sse:named", "server.sse:event", "named calls event()")
    wrong = Hop("server.sse:response", "server.sse:event", "response calls no event()")
    try:
        architecture.sequence([true, true, wrong])
    except SystemExit as e:
        assert f"hop 3 ({wrong.caller} -> {wrong.callee})" in str(e)
    else:
        raise AssertionError("a picture was drawn of a hop that is not in the code")


def test_every_room_is_a_package_and_imports_only_the_rooms_below_it() -> None:
    """A file's folder says what it may import: the rooms are packages (the package's top holds
    only its ``__init__``), listed in ``ROOMS`` from the surfaces down to the basics, and a module
    imports modules of its own room or of rooms listed after it, never one above."""
    top = sorted(p.name for p in (ROOT / "fly_cpp").glob("*.py"))
    assert top == ["__init__.py"], top
    order = list(architecture.ROOMS)
    climbs = [f"{m} ({architecture.room_of(m)}) -> {d} ({architecture.room_of(d)})"
              for m, deps in sorted(architecture.graph().items()) for d in sorted(deps)
              if order.index(architecture.room_of(d)) < order.index(architecture.room_of(m))]  # type: ignore[arg-type]
    assert climbs == [], "\n".join(climbs)

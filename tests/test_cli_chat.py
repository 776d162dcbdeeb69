"""``fly-cpp chat`` driven in a real pseudo-terminal (pexpect), and through a pipe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pexpect
import pytest

FAST = ["-t", "1", "--draft-n-threads", "1"]  # the test machines are shared and busy
PROMPT = "\r\n> "
FOOTER = r"\[\d+ tokens, [\d.]+ tok/s, mean accepted [\d.]+, loose \d+"


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "fly_cpp.cli.main", "chat", *FAST, *args]


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "FLY_CPP_HISTORY": str(tmp_path / "history"), "TERM": "dumb"}


def spawn(env, *args: str) -> pexpect.spawn:
    cmd = command(*args)
    # as from a terminal's shell: Ctrl-C not ignored, whatever the test process inherited
    child = pexpect.spawn(cmd[0], cmd[1:], env=env, encoding="utf-8", timeout=60, dimensions=(40, 200),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    child.expect("/help for commands")
    child.expect("> ")
    return child


def saved(child: pexpect.spawn, path) -> dict:
    child.sendline(f"/save {path}")
    child.expect(r"\(saved \d+ messages")
    child.expect("> ")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_chat_in_a_terminal(env, tmp_path):
    child = spawn(env, "--system", "You tell stories.", "-n", "30", "--show-accepts", "--k", "8")
    child.sendline("Tell me a story.")
    child.expect(FOOTER)
    answer = child.before
    assert "\x1b[32m" in answer or "\x1b[30;43m" in answer  # drafted tokens are coloured on a terminal
    child.expect("> ")

    child.sendline("What happened next?")
    child.expect(FOOTER)
    child.expect("> ")
    data = saved(child, tmp_path / "chat.json")
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert data["messages"][0]["content"] == "You tell stories."
    assert all(m["content"] for m in data["messages"])

    child.sendline("/reset")
    child.expect(r"\(conversation cleared\)")
    child.sendline("/set temperature 0.7")
    child.expect(r"\(temperature = 0.7\)")
    child.sendline("/mode spd")
    child.expect(r"\(mode = spd\)")
    child.sendline("/set k zero")
    child.expect("error: invalid literal")
    child.sendline("/bogus")
    child.expect("unknown command /bogus")
    child.sendline("Hi!")
    child.expect(FOOTER)
    child.expect("> ")
    data = saved(child, tmp_path / "after-reset.json")
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    assert data["settings"]["temperature"] == 0.7 and data["settings"]["mode"] == "spd"

    child.sendline("/stats")
    child.expect("last answer: spd: ")
    child.expect("session, 3 answers: ")
    child.sendline("/help")
    child.expect("/save FILE")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_stops_the_answer_not_the_program(env, tmp_path):
    # a long context and no length limit: the story model writes until the context is full,
    # which takes seconds, so Ctrl-C lands while it is still writing
    child = spawn(env, "-c", "1024", "-n", "100000")
    child.sendline("Tell me a long story.")
    child.expect_exact("Tell me a long story.\r\n")  # the terminal's echo
    child.expect(r"\w+ \w+ \w+ \w+")  # the answer is streaming
    child.sendintr()
    child.expect(FOOTER + ", interrupted]")
    child.expect("> ")

    child.sendline("/set max_tokens 20")
    child.expect(r"\(max_tokens = 20\)")
    child.sendline("And then?")  # the conversation goes on, the partial answer included
    child.expect(FOOTER)
    child.expect("> ")
    data = saved(child, tmp_path / "chat.json")
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]

    child.sendintr()  # Ctrl-C at the prompt: a fresh prompt
    child.expect("> ")
    child.sendline("/stats")
    child.expect("session, 2 answers")
    child.sendeof()  # Ctrl-D: quit
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_piped_stdin(tmp_path):
    out = subprocess.run(command("-n", "20", "--show-accepts", "--chat-format", "plain", "--temp", "0"),
                         input="Tell me a story.\n/stats\nMore!\n",
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLY_CPP_HISTORY": str(tmp_path / "history")})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and lines[0].strip() and lines[3].strip()  # answer, 2 lines of /stats, answer
    assert lines[1].startswith("last answer: fly: 20 tokens")
    assert "\x1b[" not in out.stdout  # no colour when stdout is not a terminal
    assert len([line for line in out.stderr.splitlines() if line.startswith("[20 tokens")]) == 2
    assert "> " not in out.stdout and not (tmp_path / "history").exists()


def test_regen_writes_the_last_answer_again(tmp_path):
    """/regen asks the last question again in place of its answer: greedy, the same text; sampled
    (no seed), a fresh draw; with nothing answered yet it says so."""
    env = {**os.environ, "FLY_CPP_HISTORY": str(tmp_path / "history")}
    greedy = subprocess.run(command("-n", "12", "--chat-format", "plain", "--temp", "0"),
                            input="/regen\nTell me a story.\n/regen\n/save " + str(tmp_path / "c.json") + "\n",
                            capture_output=True, text=True, timeout=60, env=env)
    assert greedy.returncode == 0, greedy.stderr
    first, again = greedy.stdout.splitlines()[:2]
    assert first == again and "no answer to write again yet" in greedy.stderr
    saved = json.loads((tmp_path / "c.json").read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"]  # the answer replaced, not added


def test_bad_options_fail_with_one_line():
    out = subprocess.run(command("--temperature", "-1"), input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip() == "fly-cpp: error: temperature must be >= 0, got -1.0"
    out = subprocess.run(command("--chat-format", "nope"), input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "unknown chat format 'nope'" in out.stderr


def test_llama_cpp_habits_in_a_terminal(env, tmp_path):
    child = spawn(env, "-n", "1", "--show-accepts")
    # between the banner and the first prompt: the legend of the colours
    assert "colours: \x1b[32mdrafted and kept\x1b[0m, \x1b[30;43mloosely accepted\x1b[0m" in child.before
    child.sendline("/set temp 0.2")  # llama.cpp's spelling of temperature
    child.expect(r"\(temperature = 0.2\)")
    child.sendline("/set draft-max 4")
    child.expect(r"\(k = 4\)")
    child.sendline("/set n_predict 1")
    child.expect(r"\(max_tokens = 1\)")
    child.sendline("/set temperature 0")
    child.expect("> ")

    child.sendline("first line \\")  # a message continued on a second line
    child.expect("… ")
    child.sendline("second line")
    child.expect(r"\[1 token, [\d.]+ tok/s, mean accepted 1\.00, loose \d+\]")  # one token: singular, 1 per round
    child.expect("> ")
    child.send("\x1b[A")  # Up: the whole message comes back, both lines
    child.send("\r")
    child.expect(r"\[1 token,")
    child.expect("> ")
    data = saved(child, tmp_path / "chat.json")
    users = [m["content"] for m in data["messages"] if m["role"] == "user"]
    assert users == ["first line \nsecond line"] * 2
    assert data["settings"]["temperature"] == 0 and data["settings"]["k"] == 4
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    # the history file keeps the joined message as one entry
    assert "first line \\" not in (tmp_path / "history").read_text()


def test_interrupted_footer_counts_only_what_was_shown(stories, stories_draft, monkeypatch, capsys):
    from fly_cpp.api.fly import Fly
    from fly_cpp.cli.chat import Session

    class Screen:
        """stdout that asks for a stop (as Ctrl-C does) once 7 tokens are on it."""

        def __init__(self) -> None:
            self.writes: list[str] = []

        def write(self, text: str) -> None:
            self.writes.append(text)
            if len(self.writes) == 7:
                session.stop_requested = True

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return False

    with Fly(stories, stories_draft, n_ctx=512, n_threads=1, draft_n_threads=1, k=15) as fly:
        session = Session(fly, None, 200, (), False)
        screen = Screen()
        monkeypatch.setattr(sys, "stdout", screen)
        session.answer("Tell me a story.")
        monkeypatch.undo()
        footer = capsys.readouterr().err.strip().splitlines()[-1]
        assert footer.startswith("[7 tokens, ") and footer.endswith(", interrupted]")
        assert session.last is not None and session.last.n_tokens == 7 and session.total.n_tokens == 7
        assert session.last.n_rounds <= 7 and session.last.mean_accepted >= 1.0
        shown = "".join(screen.writes[:7])
        assert session.messages[-1] == {"role": "assistant", "content": shown.strip()}

"""The interactive prompt: line editing, history kept between runs, tab completion.

Built on prompt_toolkit. The prompt runs under ``patch_stdout`` so messages printed by the
background subscription threads appear above the prompt and the line being typed is
redrawn intact. Completion offers commands, each command's options, known topics after
``-t``, known queues after ``-q`` and file names after ``-f``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.patch_stdout import patch_stdout

from . import grammar
from .commands import Console

PROMPT = "joms> "


def default_history_file() -> Path:
    """``$XDG_DATA_HOME/joms/history``, else ``~/.local/share/joms/history``."""
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "joms" / "history"


def open_history(path: Path) -> tuple[History, str | None]:
    """A file history at ``path``, or an in-memory one and the reason when it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        with path.open("a"):
            pass
    except OSError as exc:
        return InMemoryHistory(), f"history not kept: cannot write {path} ({exc.strerror})"
    return FileHistory(str(path)), None


class ConsoleCompleter(Completer):
    """Commands, options, known destinations and file names."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.paths = PathCompleter(expanduser=True)

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterable[Completion]:
        text = document.text_before_cursor
        text = text.rsplit(";", 1)[-1]
        words = text.split()
        if not text or text[-1].isspace():
            words.append("")
        current = words[-1]
        if len(words) == 1:
            yield from self._choices(current, grammar.COMMANDS)  # not the aliases: less noise
            return
        name = grammar.ALIASES.get(words[0], words[0])
        if name not in grammar.COMMANDS:
            return
        prev = words[-2]
        if prev == "-t":
            yield from self._choices(current, sorted(self.console.topics))
        elif prev == "-q":
            yield from self._choices(current, sorted(self.console.queues))
        elif prev == "-f":
            sub = Document(current, len(current))
            yield from self.paths.get_completions(sub, complete_event)
        elif name == "help" and len(words) == 2:
            yield from self._choices(current, list(grammar.COMMANDS))
        elif name == "create" and len(words) == 2:
            yield from self._choices(current, ["topic", "queue"])
        elif current.startswith("-"):
            yield from self._choices(current, grammar.option_strings(name))

    @staticmethod
    def _choices(current: str, names: Iterable[str]) -> Iterable[Completion]:
        for n in names:
            if n.startswith(current):
                yield Completion(n, start_position=-len(current))


def run(console: Console, history_file: Path, banner: str) -> int:
    """Prompt until ``exit`` or Ctrl-D; Ctrl-C clears the line."""
    history, warning = open_history(history_file)
    session: PromptSession[str] = PromptSession(
        history=history,
        completer=ConsoleCompleter(console),
        complete_while_typing=False,
    )
    console.interactive = True
    console.out.line(banner)
    if warning:
        console.out.notice(warning)
    with patch_stdout(raw=True):
        while True:
            try:
                text = session.prompt(PROMPT)
            except KeyboardInterrupt:
                continue
            except EOFError:
                break
            if not console.run_text(text):
                break
    return 0

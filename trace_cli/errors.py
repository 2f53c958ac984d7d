"""One error hierarchy; the CLI maps each class to an exit code (ARCHITECTURE.md, "Errors and exit codes")."""

from __future__ import annotations

import re


class TraceError(Exception):
    """Base class. `exit_code` 2 = usage/config/input error (nothing was written)."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(TraceError):
    """Bad command line, config or input; exit 2."""


MAX_SHOWN_ERRORS = 200  # a message lists at most this many (a generated file can have millions)


class ValidationError(UsageError):
    """Schema validation failed; carries every error found (file, YAML path, message)."""

    def __init__(self, errors: list[str], *, source: str | None = None):
        self.errors = list(errors)
        head = f"{source}: " if source else ""
        n = len(self.errors)
        shown = self.errors[:MAX_SHOWN_ERRORS]
        msg = f"{head}{n} validation error{'s' if n != 1 else ''}:\n" + "\n".join(f"  {e}" for e in shown)
        if n > len(shown):
            msg += f"\n  ... and {n - len(shown)} more (fix these first)"
        super().__init__(msg)


class InputError(UsageError):
    """An input file or record is malformed."""


class NotFoundError(UsageError):
    """A referenced artifact, file, environment or model does not exist."""


class CheckFailed(TraceError):
    """The stage ran but its checks failed (exit 1)."""

    exit_code = 1


class StoreError(TraceError):
    """The store is inconsistent or locked."""

    exit_code = 1


def json_error(e: BaseException) -> str:
    """Why `json` gave up on a text, in words: its own message for malformed JSON, else that a number was too
    long to convert (Python refuses integers of more than 4300 digits) or the nesting too deep to read."""
    import sys

    if isinstance(e, RecursionError):
        return "nested too deeply to read"
    msg = getattr(e, "msg", None)
    if isinstance(msg, str):
        return msg
    if "integer string conversion" in str(e):
        return f"a number longer than {sys.get_int_max_str_digits()} digits"
    return str(e)


def a(word: str) -> str:
    """`word` with its indefinite article, for messages: "an environment", "a model"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


# Characters that act on a terminal rather than print: C0 controls (ESC starts every escape sequence; CR
# overwrites a line; BEL, BS), DEL, the C1 controls (CSI, OSC), line/paragraph separators and the bidi
# overrides that reorder what is shown, and lone surrogates (undecodable bytes of a file name).
_CONTROL = (
    "\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u2028-\\u202e\\u2066-\\u2069\\ud800-\\udfff"
)
_UNSAFE = re.compile(f"[{_CONTROL}\\t\\n]")
_UNSAFE_KEEP_LINES = re.compile(f"[{_CONTROL}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def shown(text: object, *, limit: int | None = None) -> str:
    """Untrusted text (a module's error, a path, a server's error body, a table cell) made safe for a terminal
    or a log line: every control character (ESC, CR, BEL, newline, the C1 controls, bidi overrides) written as
    its escape (\\x1b, \\r, \\n, \\u202e), so nothing it holds can set a window title, write the clipboard,
    move the cursor or overwrite a line. With `limit`, longer text is cut to that many characters (and says
    so)."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > limit:
        s = s[:limit] + f"... ({len(s) - limit} more characters)"
    return _UNSAFE.sub(_escape, s)


def terminal_safe(text: str) -> str:
    """`shown` for whole messages of our own, which may span lines: newlines and tabs are kept, every other
    control character escaped (the last guard before stdout/stderr)."""
    return _UNSAFE_KEEP_LINES.sub(_escape, text)

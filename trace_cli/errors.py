"""One error hierarchy; the CLI maps each class to an exit code (ARCHITECTURE.md, "Errors and exit codes")."""

from __future__ import annotations


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


def a(word: str) -> str:
    """`word` with its indefinite article, for messages: "an environment", "a model"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"

"""Click's usage errors, printed as refusals: ``X_CONFIG_INVALID`` and what to do.

An unknown option, a missing ``--reason``, ``--limit abc``, an unknown
``--state``, an extra argument: click raises a ``UsageError`` while it parses,
before the command runs. :class:`JobsGroup` turns each into the same form as
every other refusal (``X_CONFIG_INVALID: message`` on stderr, or the
``{"ok": false, "error": ...}`` body on stdout with ``--json``) and exits
``2``. The message names the flag, the command and its ``--help``; it never
repeats the refused value (click's own messages do: an extra argument may be a
connection string).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

import click

from ..errors import ErrorCode, JobsError

__all__ = ["EXIT_USAGE", "CodedUsageError", "JobsGroup", "usage_error"]

#: A usage error: the command line does not parse.
EXIT_USAGE = 2

_JSON = "trio_jobs.as_json"


class CodedUsageError(click.ClickException):
    """A usage error, shown as a refusal with its ``X_*`` code."""

    exit_code = EXIT_USAGE

    def __init__(self, error: JobsError, as_json: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.as_json = as_json

    def show(self, file: IO[Any] | None = None) -> None:
        from ._common import refusal_text

        text, to_stderr = refusal_text(self.error, self.as_json)
        click.echo(text, err=to_stderr)


def _wants_json(args: Sequence[str]) -> bool:
    return "--json" in args


def _hint(ctx: click.Context | None) -> str:
    path = ctx.command_path if ctx is not None else "trio-jobs"
    return f"see `{path} --help`"


def _flag(name: str) -> str:
    """An option name as typed, without an ``=value`` and never long."""
    name = name.split("=", 1)[0]
    if len(name) > 40 or not name.isprintable():
        return "an option"
    return name


def _param_label(param: click.Parameter | None) -> str:
    if param is None:
        return "a value"
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def _expects(param: click.Parameter | None) -> str:
    kind = param.type if param is not None else None
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(str(c) for c in kind.choices)
    if isinstance(kind, click.IntRange):
        low = "" if kind.min is None else f" from {kind.min}"
        high = "" if kind.max is None else f" to {kind.max}"
        return f"a whole number{low}{high}"
    if kind is click.INT:
        return "a whole number"
    if kind is click.FLOAT:
        return "a number"
    return "another value"


def usage_error(exc: click.UsageError) -> JobsError:
    """The refusal for a click usage error: what was wrong and where the help is."""
    ctx = exc.ctx
    hint = _hint(ctx)
    if isinstance(exc, click.NoSuchOption):
        maybe = f" (did you mean {' or '.join(exc.possibilities)}?)" if exc.possibilities else ""
        message = f"no option {_flag(exc.option_name)}{maybe}; {hint}"
    elif isinstance(exc, click.exceptions.NoSuchCommand):
        maybe = f"did you mean {' or '.join(exc.possibilities)}? " if exc.possibilities else ""
        commands = ", ".join(sorted(getattr(ctx.command, "commands", {}))) if ctx else ""
        message = f"no such command; {maybe}the commands are: {commands}"
    elif isinstance(exc, click.MissingParameter):
        label = _param_label(exc.param)
        what = getattr(exc.param, "help", None) or ""
        message = f"{label} is required" + (f" ({what.rstrip('.')})" if what else "") + f"; {hint}"
    elif isinstance(exc, click.BadParameter):
        message = f"{_param_label(exc.param)} takes {_expects(exc.param)}; {hint}"
    elif isinstance(exc, click.BadOptionUsage):
        flag = _flag(exc.option_name)
        if "does not take a value" in exc.message:
            message = f"{flag} is a flag and takes no value; {hint}"
        else:
            message = f"{flag} needs a value; {hint}"
    elif exc.message.startswith("Got unexpected extra argument"):
        message = (
            "more arguments than the command takes (quote a value that holds spaces, and "
            f"give each option its flag); {hint}"
        )
    elif exc.message.startswith("Missing command"):
        message = f"name a command; {hint}"
    else:
        message = f"the arguments do not parse; {hint}"
    return JobsError(ErrorCode.X_CONFIG_INVALID, message)


class JobsGroup(click.Group):
    """The ``trio-jobs`` group: a usage error anywhere under it is a coded refusal."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        as_json = _wants_json(args)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise CodedUsageError(usage_error(exc), as_json) from None
        ctx.meta[_JSON] = as_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise CodedUsageError(usage_error(exc), bool(ctx.meta.get(_JSON))) from None

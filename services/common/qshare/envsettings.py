"""Building a service's settings from its environment with errors a user can act on: each
problem is one line naming the environment variable that was read (or the flag that was
given) and its bad value, never a field name or a traceback; `report` prints them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import AliasChoices, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from qshare import dburl

S = TypeVar("S", bound=BaseSettings)
EXIT_BAD_SETTINGS = 2


class SettingsError(ValueError):
    """Settings that do not validate; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load(
    cls: type[S], given: Mapping[str, Any] | None = None, flags: Mapping[str, str] | None = None
) -> S:
    """`cls` built from the environment and `given` values (named in errors by `flags`,
    e.g. `{"policy": "--policy"}`), its nested settings too; every problem of them all is
    gathered into one `SettingsError`."""
    values, problems = dict(given or {}), []
    for name, sub in _nested(cls):
        if name not in values:
            try:
                values[name] = load(sub)
            except SettingsError as exc:
                problems += exc.problems
                values[name] = sub.model_construct()  # stands in while the rest is checked
    try:
        built = cls(**values)
    except ValidationError as exc:
        problems += describe(exc, cls, values, flags or {})
    if problems:
        raise SettingsError(problems)
    return built


def describe(
    exc: ValidationError,
    cls: type[BaseSettings],
    given: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per error of `exc` (raised building `cls`): the variable or flag, its value
    and what is wrong with it."""
    return [_line(err, cls, given or {}, flags or {}) for err in exc.errors()]


def report(exc: SettingsError, prog: str) -> int:
    """Print the problems to stderr; the exit status to return."""
    say(prog, exc.problems)
    return EXIT_BAD_SETTINGS


def say(prog: str, lines: Iterable[str]) -> None:
    """Each line to stderr after `prog: ` (what a service prints instead of a traceback)."""
    for line in lines:
        print(f"{prog}: {line}", file=sys.stderr)


def env_names(cls: type[BaseSettings], name: str) -> list[str]:
    """The variables pydantic-settings reads for field `name`, in the order it tries them."""
    alias = cls.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def _nested(cls: type[BaseSettings]) -> list[tuple[str, type[BaseSettings]]]:
    return [
        (name, field.annotation)
        for name, field in cls.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings)
    ]


def _line(
    err: Any, cls: type[BaseSettings], given: Mapping[str, Any], flags: Mapping[str, str]
) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    name = _field_of(cls, err["loc"])
    if name is None:  # a check of several settings together: its message names them
        prefix = cls.model_config.get("env_prefix", "")
        return f"{prefix}*: {msg}" if not err["loc"] else f"{_dotted(err['loc'])}: {msg}"
    value = _shown(cls.model_fields[name], err.get("input"))
    if name in given and name not in _nested_names(cls):
        return f"{flags.get(name, name)}={value}: {msg}"
    names = env_names(cls, name)
    read = _set_in_environment(names)
    if err["type"] == "missing":
        return f"{' or '.join(names)} is not set: a value is required"
    if read is None:
        return f"{' or '.join(names)} (not set; default {value}): {msg}"
    return f"{read}={value}: {msg}"


def _field_of(cls: type[BaseSettings], loc: tuple[Any, ...]) -> str | None:
    """The field an error's location starts at (by field name or by a variable it reads)."""
    if not loc:
        return None
    head = str(loc[0])
    if head in cls.model_fields:
        return head
    for name in cls.model_fields:
        if head.upper() in (n.upper() for n in env_names(cls, name)):
            return name
    return None


def _nested_names(cls: type[BaseSettings]) -> set[str]:
    return {name for name, _ in _nested(cls)}


def _set_in_environment(names: list[str]) -> str | None:
    """The first of `names` set in the environment (matched ignoring case, as read)."""
    present = {k.upper(): k for k in os.environ}
    return next((present[n.upper()] for n in names if n.upper() in present), None)


def _shown(field: FieldInfo, value: Any) -> str:
    if "SecretStr" in str(field.annotation) or isinstance(value, SecretStr):
        return "'**********'"
    if isinstance(value, str) and ("@" in value or "password" in value.lower()):  # a URL's
        return repr(dburl.shown(value))
    return repr(value)


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(map(str, loc))

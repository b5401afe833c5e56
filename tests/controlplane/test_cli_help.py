"""`qshare … --help`: every option of the API's verbs says what it takes."""

from __future__ import annotations

import argparse

import pytest

from qshare.cli import build_parser, main

API_GROUPS = (
    "claims", "nodes", "gpus", "tokens", "quotas", "events", "preemptions", "starvation", "classes",
)  # fmt: skip


def _verbs() -> list[tuple[str, argparse.ArgumentParser]]:
    groups = _subparsers(build_parser())
    found = []
    for name in API_GROUPS:
        for verb, parser in _subparsers(groups[name]).items():
            found.append((f"{name} {verb}", parser))
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError(f"{parser.prog} has no verbs")


@pytest.mark.parametrize(("verb", "parser"), _verbs(), ids=[v for v, _ in _verbs()])
def test_every_option_of_every_verb_has_help(verb: str, parser: argparse.ArgumentParser) -> None:
    silent = [a.option_strings[-1] for a in parser._actions if a.option_strings and not a.help]
    assert silent == [], f"qshare {verb}: options without help: {silent}"


def test_the_url_option_names_its_variable_and_default() -> None:
    claims = _subparsers(build_parser())["claims"]
    text = claims.format_help()
    assert "$QSHARE_URL" in text and "http://127.0.0.1:8080" in text


@pytest.mark.parametrize("option", ["--url", "--token", "-o"])
def test_a_connection_option_before_the_group_says_where_it_goes(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([option, "x", "claims", "list"]) == 2
    assert f"qshare: {option} goes after the command's group" in capsys.readouterr().err


def test_version_is_printed_not_taken_for_a_missing_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, `qshare --version` said "the following arguments are required: command"."""
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith("qshare ")

"""The README and docs/ say what exists: every relative link resolves inside the repository,
and every `qshare …` command the README shows names a real sub-command."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from qshare.cli import build_parser

ROOT = Path(__file__).parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)|`(\.\./[^`\s]+)`")
"""Markdown links, and paths in backticks that climb out of the document's directory."""
COMMAND = re.compile(r"(?:^|\s)qshare ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def _relative_links(document: Path) -> list[str]:
    targets = [m.group(1) or m.group(2) for m in LINK.finditer(document.read_text())]
    return [t for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves_inside_the_repository(document: Path) -> None:
    for target in _relative_links(document):
        resolved = (document.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{document.name}: {target} leaves the repository"
        assert resolved.exists(), f"{document.name}: {target} does not exist"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_qshare_command_in_the_readme_exists() -> None:
    groups = _subcommands(build_parser())
    blocks = re.findall(r"```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    for match in COMMAND.finditer("\n".join(blocks)):
        group, action = match.groups()
        assert group in groups, f"qshare {group}: no such command"
        actions = _subcommands(groups[group])
        if actions and action is not None:
            assert action in actions, f"qshare {group} {action}: no such command"


CODE = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.S)
"""Code blocks and inline code, where the docs show commands to type."""


def _commands(text: str) -> list[list[str]]:
    """Each `qshare GROUP …` shown in code, as its words up to a comment or the next one."""
    found = []
    for match in CODE.finditer(text):
        for line in (match.group(1) or match.group(2)).splitlines():
            for part in re.split(r"(?:^|\s)qshare\s+", line.split(" #")[0])[1:]:
                found.append(part.split())
    return found


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_option_a_document_shows_a_qshare_command_with_exists(document: Path) -> None:
    groups = _subcommands(build_parser())
    for words in _commands(document.read_text()):
        if not words or words[0] not in groups:
            continue
        parser = groups[words[0]]
        verbs = _subcommands(parser)
        if len(words) > 1 and words[1] in verbs:
            parser = verbs[words[1]]
        flags = {w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--")}
        unknown = sorted(flags - _options(parser) - {"--"})
        shown = " ".join(words)
        assert not unknown, f"{document.name}: `qshare {shown}`: no option {', '.join(unknown)}"

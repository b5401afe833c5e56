"""docs/configuration.md, written from the settings classes themselves: every variable a
service reads, its default and what it does (`python -m qshare.configdoc [--check]`)."""

from __future__ import annotations

import argparse
import enum
import importlib
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from qshare.envsettings import env_names

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
SECTIONS = [
    ("Allocator", "qshare_allocator.settings:AllocatorSettings", "`python -m qshare_allocator`."),
    ("API", "qshare_api.settings:ApiSettings", "`python -m qshare_api`."),
    ("Scheduler extender", "qshare_api.extender.settings:ExtenderSettings",
     "Read by the API process; the `qshare-extender` Deployment turns it on."),
    ("Preemptor", "qshare_preemptor.settings:PreemptorSettings", "`python -m qshare_preemptor`."),
    ("Node agent", "qshare_node_agent.settings:NodeAgentSettings",
     "`python -m qshare_node_agent`; its command-line options, where it has one, win."),
    ("Node agent's Kubernetes plugins", "qshare_node_agent.kubernetes.config:KubernetesSettings",
     "Read where `QSHARE_NODE_KUBERNETES` is true (the DaemonSet of `deploy/kubernetes`)."),
    ("Cluster rules", "qshare.settings:ClusterSettings",
     "Read by the allocator and the API alike: give both the same values."),
    ("Traces", "qshare.contracts.tracing:OtlpSettings",
     "The OpenTelemetry SDK's own names, read by every service ([control-plane.md]"
     "(control-plane.md#traces)); the exporter reads the rest of its `OTEL_EXPORTER_OTLP_*`."),
]  # fmt: skip
HEAD = """# Configuration reference

Every variable a qshare service reads from its environment, by service, with its default.
Written by `python -m qshare.configdoc` from the settings classes (a test checks that this
file is what it writes: change a setting's description there, not here). A service stops at
start with one line naming a variable whose value it cannot use; it ignores variables it
does not know, so check a name here before relying on it.

Not here: the `qshare` command's own `QSHARE_URL`, `QSHARE_TOKEN` and `QSHARE_NODE_NAME`
(`qshare --help`), and what the CUDA interposer reads in a workload's environment
([cuda.md](cuda.md)).
"""
FACTORIES = {"gethostname": "the host's name", "default_node_name": "the host's name"}
"""What a default computed at start is, in words; an empty list or dict reads `none`."""


def render() -> str:
    """The whole document."""
    parts = [HEAD]
    for title, where, intro in SECTIONS:
        cls = _load(where)
        parts.append(
            f"\n## {title}\n\n{intro}\n\n| variable | default | what it does |\n|---|---|---|\n"
        )
        parts.extend(
            _row(cls, name, info) for name, info in cls.model_fields.items() if not _nested(info)
        )
    return "".join(parts)


def _load(where: str) -> type[BaseSettings]:
    module, name = where.split(":")
    cls: type[BaseSettings] = getattr(importlib.import_module(module), name)
    return cls


def _nested(info: FieldInfo) -> bool:
    """A settings class inside another (the API's `cluster`): it reads its own variables."""
    return isinstance(info.annotation, type) and issubclass(info.annotation, BaseSettings)


def _row(cls: type[BaseSettings], name: str, info: FieldInfo) -> str:
    if not info.description:
        raise ValueError(f"{cls.__name__}.{name} has no description to document")
    variables = " or ".join(f"`{v}`" for v in env_names(cls, name))
    description = info.description.replace("|", "\\|")
    return f"| {variables} | {_default(info)} | {description} |\n"


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        factory = getattr(info.default_factory, "__name__", "")
        return FACTORIES.get(factory, "none" if factory in ("list", "dict") else f"`{factory}()`")
    if info.default is PydanticUndefined:
        return "required"
    return _value(info.default)


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value}`" if value != "" else "empty"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qshare.configdoc", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = DOC.is_file() and DOC.read_text() == text
        print(f"{DOC}: {'up to date' if same else 'differs; run python -m qshare.configdoc'}")
        return 0 if same else 1
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

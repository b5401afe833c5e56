"""docs/configuration.md is what `python -m qshare.configdoc` writes from the settings
classes: every variable a service reads is there, with its default and a description (a
field without one stops the rendering), so the reference cannot fall behind the code."""

from __future__ import annotations

from qshare import configdoc
from tests.docs.test_env_names import _read_by_settings


def test_the_configuration_reference_is_what_the_settings_classes_write() -> None:
    assert configdoc.DOC.read_text() == configdoc.render(), "run python -m qshare.configdoc"


def test_every_variable_a_settings_class_reads_is_in_the_reference() -> None:
    """The sections list the classes by hand: a new settings class must be added there."""
    text = configdoc.DOC.read_text()
    assert sorted(v for v in _read_by_settings() if f"`{v}`" not in text) == [
        "QSHARE_ALLOCATOR_CLUSTER", "QSHARE_API_CLUSTER", "QSHARE_API_EXTENDER",
    ]  # fmt: skip  # nested classes, which read their own variables (listed under them)

"""Strict JSON schemas, written here, for the Prometheus operator's objects that qshare ships
(kubernetes_validate knows no CRDs), and their validator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

OPERATOR_API = "monitoring.coreos.com/v1"
HERE = Path(__file__).parent


def validate_operator_object(obj: dict[str, Any]) -> None:
    """Raise unless `obj`, a Prometheus-operator object, passes its kind's schema here; a kind
    without one fails."""
    assert obj["apiVersion"] == OPERATOR_API
    schema = json.loads((HERE / f"{obj['kind'].lower()}.schema.json").read_text())
    jsonschema.validate(obj, schema)

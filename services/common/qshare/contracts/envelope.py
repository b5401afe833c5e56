"""The CloudEvents-style envelope every NATS message body uses, and its JSON encoding."""

from __future__ import annotations

import builtins
import uuid
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

SPEC_VERSION = "1.0"
T = TypeVar("T", bound=BaseModel)


class Envelope(BaseModel):
    """CloudEvents 1.0 attributes plus `data`; `type` is reverse-DNS: `io.qshare.claim.placed`."""

    model_config = ConfigDict(extra="ignore")

    specversion: str = SPEC_VERSION
    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    source: str
    type: str
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))
    datacontenttype: str = "application/json"
    data: dict[str, Any] | None = None

    def payload(self, model: builtins.type[T]) -> T:
        """Validate `data` as `model`; raises pydantic.ValidationError when it does not fit."""
        return model.model_validate(self.data or {})


def wrap(source: str, type_: str, data: BaseModel | None) -> Envelope:
    """An envelope around a model, dumped in JSON mode so it round-trips."""
    body = None if data is None else data.model_dump(mode="json")
    return Envelope(source=source, type=type_, data=body)


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json().encode()


def decode(raw: bytes) -> Envelope:
    """Parse a message body; raises pydantic.ValidationError for anything but an envelope."""
    return Envelope.model_validate_json(raw)

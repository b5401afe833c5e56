"""Bearer-token authentication: a token maps to a tenant and a role; only its hash is stored."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Row, func, select

from qshare.contracts.domain import Role, TokenScope
from qshare.contracts.errors import Forbidden, Unauthorized
from qshare.contracts.schema import tokens
from qshare_api.resources import Resources, resources

bearer = HTTPBearer(auto_error=False, description="a qshare token: `Authorization: Bearer …`")


@dataclass(frozen=True)
class Principal:
    tenant: str
    role: Role
    read_only: bool = False
    token: str = ""
    """The token's hash: what per-token limits count by."""
    name: str = ""
    """The token's name and id, for the records of what it did (`actor`)."""
    token_id: uuid.UUID | None = None

    @property
    def actor(self) -> str:
        """How records name this caller: "<token name> (token <id>)" (names need not be
        unique; ids are)."""
        return f"{self.name} (token {self.token_id})"

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    def tenant_filter(self) -> str | None:
        """The tenant whose claims this caller may see; None means all (admin)."""
        return None if self.is_admin else self.tenant


def new_secret() -> str:
    return "qs_" + secrets.token_urlsafe(32)


def hash_token(secret: str) -> str:
    """Tokens are 256 random bits, so one SHA-256 round is enough to store them safely."""
    return hashlib.sha256(secret.encode()).hexdigest()


READS = frozenset({"GET", "HEAD"})
SEND = "send `Authorization: Bearer <token>`"


def bearer_secret(request: Request) -> str:
    """The token of the request's one `Authorization: Bearer` header, or Unauthorized
    naming what is wrong with the header."""
    values = request.headers.getlist("authorization")
    if not values:
        raise Unauthorized(f"missing Authorization header: {SEND}")
    if len(values) > 1:
        raise Unauthorized(f"{len(values)} Authorization headers; {SEND} once")
    scheme, _, secret = values[0].strip().partition(" ")
    if scheme.lower() != "bearer":
        shown = scheme if len(scheme) <= 20 else scheme[:20] + "…"
        raise Unauthorized(f"Authorization scheme {shown!r} is not Bearer: {SEND}")
    secret = secret.strip()
    if not secret:
        raise Unauthorized(f"no token after Bearer in the Authorization header: {SEND}")
    if any(c.isspace() for c in secret):
        raise Unauthorized("the bearer token holds whitespace; a qshare token has none")
    return secret


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    res: Annotated[Resources, Depends(resources)],
) -> Principal:
    """Who calls: an unexpired token's tenant and role; a read-only token may only read.
    Each token's requests are rate-limited, and so are each client address's failures: an
    address out of them gets a 429 before its token is looked up (failures.py). The token
    is found by its hash, so no comparison runs over the secret itself."""
    digest = hash_token(bearer_secret(request))
    address = res.failures.address(request.scope)
    reserved = res.failures.before_lookup(digest, address)
    if not reserved:  # a token known valid: its own limit, before any lookup
        res.limiter.take(digest)
    try:
        row = await _lookup(res, digest)
    except BaseException:  # an outage (a 503) finds no token wrong
        if reserved:
            res.failures.limiter.give_back(address)
        raise
    if row is None or row.expired:
        res.failures.failed(digest, address, reserved)
        raise Unauthorized("unknown or revoked token" if row is None else "token expired")
    res.failures.succeeded(digest, address, reserved)
    if row.scope == TokenScope.READ and request.method not in READS:
        raise Forbidden("this token is read-only")
    if reserved:
        res.limiter.take(digest)
    read_only = row.scope == TokenScope.READ
    return Principal(tenant=row.tenant, role=Role(row.role), read_only=read_only, token=digest,
                     name=row.name, token_id=row.id)  # fmt: skip


async def _lookup(res: Resources, digest: str) -> Row[Any] | None:
    query = select(
        tokens.c.id, tokens.c.name, tokens.c.tenant, tokens.c.role, tokens.c.scope,
        (tokens.c.expires_at <= func.now()).label("expired"),
    ).where(tokens.c.token_hash == digest)  # fmt: skip
    async with res.reader.connect() as conn:
        return (await conn.execute(query)).one_or_none()


async def still_valid(res: Resources, digest: str) -> bool:
    """Whether the token of hash `digest` is still stored and unexpired."""
    row = await _lookup(res, digest)
    return row is not None and not row.expired


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.is_admin:
        raise Forbidden("this route is for admins")
    return caller


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]

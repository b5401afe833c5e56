"""Bearer-token authentication: a token maps to a tenant and a role; only its hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import func, select

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


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    res: Annotated[Resources, Depends(resources)],
) -> Principal:
    """Who calls: an unexpired token's tenant and role; a read-only token may only read,
    and each token's requests are rate-limited."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token")
    digest = hash_token(credentials.credentials)
    query = select(
        tokens.c.tenant, tokens.c.role, tokens.c.scope, tokens.c.expires_at <= func.now()
    ).where(tokens.c.token_hash == digest)
    async with res.reader.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        raise Unauthorized("unknown or revoked token")
    if row[3]:
        raise Unauthorized("token expired")
    if row.scope == TokenScope.READ and request.method not in READS:
        raise Forbidden("this token is read-only")
    res.limiter.take(digest)
    read_only = row.scope == "read"
    return Principal(tenant=row.tenant, role=Role(row.role), read_only=read_only, token=digest)


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.is_admin:
        raise Forbidden("this route is for admins")
    return caller


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]

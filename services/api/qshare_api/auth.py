"""Bearer-token authentication: a token maps to a tenant and a role; only its hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select

from qshare.contracts.domain import Role
from qshare.contracts.errors import Forbidden, Unauthorized
from qshare.contracts.schema import tokens
from qshare_api.resources import Resources, resources

bearer = HTTPBearer(auto_error=False, description="a qshare token: `Authorization: Bearer …`")


@dataclass(frozen=True)
class Principal:
    tenant: str
    role: Role

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


async def principal(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    res: Annotated[Resources, Depends(resources)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token")
    query = select(tokens.c.tenant, tokens.c.role).where(
        tokens.c.token_hash == hash_token(credentials.credentials)
    )
    async with res.reader.connect() as conn:
        row = (await conn.execute(query)).one_or_none()
    if row is None:
        raise Unauthorized("unknown or revoked token")
    return Principal(tenant=row.tenant, role=Role(row.role))


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.is_admin:
        raise Forbidden("this route is for admins")
    return caller


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]

"""`/v1/tokens`: admins issue, list and revoke bearer tokens."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from qshare.contracts.claims import Text
from qshare.contracts.domain import Role, TokenScope
from qshare.contracts.errors import NotFound
from qshare_api.auth import Admin, new_secret
from qshare_api.pages import TIME_AND_ID, PageLimit, decode, fetched, page
from qshare_api.params import CursorParam, TenantName
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources
from qshare_api.tokens.repository import list_tokens, revoke_token, store_token

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]


class TokenRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "ml-team ci", "tenant": "ml-team", "role": "tenant"}]
        },
    )

    name: Annotated[Text, Field(min_length=1, max_length=128)]
    tenant: TenantName
    role: Role = Role.TENANT
    scope: TokenScope = Field(TokenScope.WRITE, description="`read`: GET requests only")
    expires_in_s: Annotated[
        int | None, Field(ge=60, le=10 * 365 * 86400, description="None: never expires")
    ] = None


class TokenInfo(BaseModel):
    id: uuid.UUID
    name: str
    tenant: str
    role: Role
    scope: TokenScope = TokenScope.WRITE
    created_at: datetime | None = None
    expires_at: datetime | None = None


class IssuedToken(TokenInfo):
    token: str = Field(description="the secret; shown only now, stored only as a hash")


@router.post("", response_model=IssuedToken, status_code=status.HTTP_201_CREATED, summary="Issue")
async def issue(body: TokenRequest, caller: Admin, res: Res) -> IssuedToken:
    secret = new_secret()
    expires = (
        datetime.now(UTC) + timedelta(seconds=body.expires_in_s) if body.expires_in_s else None
    )
    async with res.engine.begin() as conn:
        token_id, created_at = await store_token(
            conn, body.name, body.tenant, body.role, secret, scope=body.scope, expires_at=expires
        )
    return IssuedToken(
        id=token_id, name=body.name, tenant=body.tenant, role=body.role, scope=body.scope,
        created_at=created_at, expires_at=expires, token=secret,
    )  # fmt: skip


@router.get("", response_model=list[TokenInfo], summary="List tokens (never their secrets)")
async def list_all(
    caller: Admin,
    res: Res,
    request: Request,
    response: Response,
    limit: PageLimit = None,
    cursor: CursorParam = None,
) -> list[TokenInfo]:
    """Oldest first; with `limit`, a page, the next one named by the Link header."""
    after = decode(cursor, TIME_AND_ID)
    async with res.reader.connect() as conn:
        found = await list_tokens(conn, after, fetched(limit))
    kept = page(found, limit, lambda t: (t["created_at"], t["id"]), request, response)
    return [TokenInfo.model_validate(t) for t in kept]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Revoke")
async def revoke(token_id: uuid.UUID, caller: Admin, res: Res) -> None:
    async with res.engine.begin() as conn:
        if not await revoke_token(conn, token_id):
            raise NotFound(f"token {token_id} not found")

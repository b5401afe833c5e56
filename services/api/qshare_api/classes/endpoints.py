"""`/v1/classes`: everyone lists them; admins add them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from qshare.contracts.claims import ClassName, Text
from qshare.contracts.domain import Provisioner
from qshare.contracts.errors import Conflict
from qshare.contracts.schema import classes
from qshare_api.auth import Admin, Caller
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/v1/classes", tags=["classes"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]


class GpuClass(BaseModel):
    """Like an ElasticGPUClass: the name claims use, and how its vGPUs are produced."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "inference", "provisioner": "qshare", "description": "slices"}]
        },
    )

    name: ClassName
    provisioner: Provisioner
    description: Annotated[Text, Field(max_length=512)] = ""
    evictable: bool = Field(
        True, description="a high-priority claim may evict this class's low-priority claims"
    )
    eviction_grace_s: float = Field(
        30.0, ge=0, le=86400, description="how long an evicted claim keeps its vGPUs"
    )
    replace_on_failure: bool = Field(
        True, description="re-place claims whose node goes NotReady or card unhealthy"
    )
    starvation_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="a low-priority claim that gets less than this share of its card over the "
        "preemptor's window, while high priority leaves less than that to harvest, is "
        "starved (event, GET /v1/starvation); 0 = not watched",
    )
    move_on_starvation: bool = Field(
        False, description="move a starved single-card claim to a card with more harvestable time"
    )


@router.get("", response_model=list[GpuClass], summary="List classes")
async def list_classes(caller: Caller, res: Res) -> list[GpuClass]:
    columns = [classes.c[name] for name in GpuClass.model_fields]
    async with res.reader.connect() as conn:
        rows = (await conn.execute(select(*columns).order_by(classes.c.name))).all()
    return [GpuClass.model_validate(r._asdict()) for r in rows]


@router.post(
    "", response_model=GpuClass, status_code=status.HTTP_201_CREATED, summary="Add a class (admins)"
)
async def add_class(body: GpuClass, caller: Admin, res: Res) -> GpuClass:
    try:
        async with res.engine.begin() as conn:
            await conn.execute(insert(classes).values(body.model_dump(mode="json")))
    except IntegrityError as exc:
        raise Conflict(f"class {body.name} exists") from exc
    return body

"""`/v1/classes`: everyone lists them; admins add, change and delete (or retire) them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, status
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from sqlalchemy import Select, select

from qshare.contracts.claims import ClassName, Text
from qshare.contracts.domain import Provisioner
from qshare.contracts.errors import NotFound
from qshare.contracts.schema import classes
from qshare_api.auth import Admin, Caller
from qshare_api.classes.changes import add_or_revive, change_class, delete_class
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/v1/classes", tags=["classes"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]
ClassPath = Annotated[
    str, Path(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]

Description = Annotated[Text, Field(max_length=512)]
Evictable = Annotated[
    bool, Field(description="a high-priority claim may evict this class's low-priority claims")
]
Grace = Annotated[
    float, Field(ge=0, le=86400, description="how long an evicted claim keeps its vGPUs")
]
Replace = Annotated[
    bool, Field(description="re-place claims whose node goes NotReady or card unhealthy")
]
StarvationShare = Annotated[
    float,
    Field(
        ge=0,
        le=1,
        description="a low-priority claim that gets less than this share of its card over the "
        "preemptor's window, while high priority leaves less than that to harvest, is "
        "starved (event, GET /v1/starvation); 0 = not watched",
    ),
]
Move = Annotated[
    bool,
    Field(description="move a starved single-card claim to a card with more harvestable time"),
]


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
    description: Description = ""
    evictable: Evictable = True
    eviction_grace_s: Grace = 30.0
    replace_on_failure: Replace = True
    starvation_share: StarvationShare = 0.0
    move_on_starvation: Move = False


class ClassChange(BaseModel):
    """What a PATCH may change: the fields given change, the others are kept. `name` and
    `provisioner` may be given only as they are (a class read with GET can be sent back)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"eviction_grace_s": 60}]}
    )

    name: ClassName | None = None
    provisioner: Provisioner | None = None
    description: Description | None = None
    evictable: Evictable | None = None
    eviction_grace_s: Grace | None = None
    replace_on_failure: Replace | None = None
    starvation_share: StarvationShare | None = None
    move_on_starvation: Move | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            raise ValueError(f"{info.field_name} cannot be null: leave it out to keep it")
        return value


SHOWN = [classes.c[name] for name in GpuClass.model_fields]
"""The columns a GpuClass shows."""


def _listed() -> Select[Any]:
    """The classes shown, as GpuClass fields: every one but the retired."""
    return select(*SHOWN).where(classes.c.retired_at.is_(None))


@router.get("", response_model=list[GpuClass], summary="List classes")
async def list_classes(caller: Caller, res: Res) -> list[GpuClass]:
    async with res.reader.connect() as conn:
        rows = (await conn.execute(_listed().order_by(classes.c.name))).all()
    return [GpuClass.model_validate(r._asdict()) for r in rows]


@router.get("/{name}", response_model=GpuClass, summary="Get a class")
async def get_class(name: ClassPath, caller: Caller, res: Res) -> GpuClass:
    """One class as the list shows it; 404 for a name no class has, or a retired class's."""
    async with res.reader.connect() as conn:
        row = (await conn.execute(_listed().where(classes.c.name == name))).one_or_none()
    if row is None:
        raise NotFound(f"class {name} not found (qshare classes list shows the classes)")
    return GpuClass.model_validate(row._asdict())


@router.post(
    "", response_model=GpuClass, status_code=status.HTTP_201_CREATED, summary="Add a class (admins)"
)
async def add_class(body: GpuClass, caller: Admin, res: Res) -> GpuClass:
    """A name in use is a 409. A retired name (its class deleted after claims had named it)
    brings the class back with the fields given, provided the provisioner is the one it had
    (else a 409 saying which): its ended claims go on naming it."""
    async with res.engine.begin() as conn:
        await add_or_revive(conn, body.model_dump(mode="json"))
    return body


@router.patch("/{name}", response_model=GpuClass, summary="Change a class (admins)")
async def patch_class(name: ClassPath, body: ClassChange, caller: Admin, res: Res) -> GpuClass:
    """Only the fields given change. They are read where they are used, so the change holds
    for the class's claims already there too, from the next decision on: the next eviction
    plan (`evictable`, `eviction_grace_s`; an eviction under way keeps its deadline), the next
    health scan (`replace_on_failure`), the preemptor's next window (`starvation_share`,
    `move_on_starvation`). `name` and `provisioner` never change (422 naming the field)."""
    async with res.engine.begin() as conn:
        row = await change_class(conn, name, body.model_dump(mode="json", exclude_unset=True))
    return GpuClass.model_validate({field: row[field] for field in GpuClass.model_fields})


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a class (admins)")
async def remove_class(name: ClassPath, caller: Admin, res: Res) -> None:
    """A class that claims not yet ended (pending, placed, ready, releasing) name is a 409
    with their count by status. A class no claim ever named is deleted; one whose claims
    have all ended (released, failed) is retired: they are kept as records and go on naming
    it, while it is no longer listed, changed or named by new claims (404, 422), and adding
    a class of its name brings it back. The built-in classes stay (409)."""
    async with res.engine.begin() as conn:
        await delete_class(conn, name)

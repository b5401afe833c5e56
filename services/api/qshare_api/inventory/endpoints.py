"""`/v1/nodes` and `/v1/gpus`: the inventory with readiness and capacity; admins register nodes
and ask how a card is shared."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field, TypeAdapter

from qshare.contracts import rpc, subjects
from qshare.contracts.errors import NotFound
from qshare.contracts.nodes import (
    ChangeNode,
    GpuView,
    NodeChange,
    NodeRegistration,
    NodeView,
    RemovalReply,
    RemoveCard,
    RemoveNode,
)
from qshare.contracts.rows import node_views
from qshare.contracts.sharing import ChangeSharing, SharingSettings
from qshare_api.auth import Admin, Caller
from qshare_api.inventory.repository import get_gpu, list_gpus
from qshare_api.pages import PageLimit, decode, fetched, page
from qshare_api.params import CardUuid, CursorParam, NodeFilter, NodeName, NodeNameText
from qshare_api.problems import PROBLEMS
from qshare_api.resources import Resources, resources

router = APIRouter(prefix="/v1", tags=["inventory"], responses=PROBLEMS)
Res = Annotated[Resources, Depends(resources)]


@router.get("/nodes", response_model=list[NodeView], summary="List nodes")
async def get_nodes(
    caller: Caller,
    res: Res,
    request: Request,
    response: Response,
    limit: PageLimit = None,
    cursor: CursorParam = None,
) -> list[NodeView]:
    """By name; with `limit`, a page, the next one named by the Link header."""
    after = decode(cursor, NODE_AFTER)
    timeout_s = res.settings.cluster.node_timeout_s
    async with res.reader.connect() as conn:
        found = await node_views(conn, timeout_s, after=after and after[0], limit=fetched(limit))
    return page(found, limit, lambda n: (n.name,), request, response)


@router.get("/nodes/{name}", response_model=NodeView, summary="Get one node")
async def get_node(name: NodeName, caller: Caller, res: Res) -> NodeView:
    async with res.reader.connect() as conn:
        found = await node_views(conn, res.settings.cluster.node_timeout_s, name)
    if not found:
        raise NotFound(f"node {name} not found")
    return found[0]


@router.post(
    "/nodes",
    response_model=NodeView,
    summary="Register or refresh a node (admins)",
    description="What a node agent does over NATS; re-registering replaces labels and cards.",
)
async def register_node(registration: NodeRegistration, caller: Admin, res: Res) -> NodeView:
    return await rpc.call(
        res.nc, subjects.NODES_REGISTER, res.source, registration, NodeView,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip


@router.patch(
    "/nodes/{name}",
    response_model=NodeView,
    summary="Cordon or open a node (admins)",
    description="`schedulable: false`: nothing new is placed on the node, and its claims keep "
    "running; `true` opens it again (pending claims are tried at once). A node agent's "
    "registration keeps what was set.",
)
async def change_node(name: NodeName, change: NodeChange, caller: Admin, res: Res) -> NodeView:
    return await rpc.call(
        res.nc, subjects.NODES_UPDATE, res.source, ChangeNode(name=name, change=change), NodeView,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip


@router.delete(
    "/nodes/{name}",
    response_model=RemovalReply,
    summary="Remove a node and its cards (admins)",
    description="Claims holding vGPUs on the node turn `failed` (reason and event); the node "
    "comes back only by registering again.",
)
async def remove_node(name: NodeName, caller: Admin, res: Res) -> RemovalReply:
    return await rpc.call(
        res.nc, subjects.NODES_DELETE, res.source, RemoveNode(name=name), RemovalReply,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip


@router.delete(
    "/nodes/{name}/gpus/{uuid}",
    response_model=RemovalReply,
    summary="Remove one card of a node (admins)",
    description="Claims holding a vGPU on the card turn `failed` (reason and event).",
)
async def remove_card(name: NodeName, uuid: CardUuid, caller: Admin, res: Res) -> RemovalReply:
    return await rpc.call(
        res.nc, subjects.GPUS_DELETE, res.source, RemoveCard(node=name, uuid=uuid), RemovalReply,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip


@router.get("/gpus", response_model=list[GpuView], summary="List cards with their capacity")
async def get_gpus(
    caller: Caller,
    res: Res,
    request: Request,
    response: Response,
    node: NodeFilter = None,
    limit: PageLimit = None,
    cursor: CursorParam = None,
) -> list[GpuView]:
    """By node and index; with `limit`, a page, the next one named by the Link header."""
    after = decode(cursor, CARD_AFTER)
    async with res.reader.connect() as conn:
        found = await list_gpus(conn, node, after, fetched(limit))
    return page(found, limit, lambda g: (g.node, g.index), request, response)


NODE_AFTER = TypeAdapter(tuple[NodeNameText])
"""A nodes cursor: the last node listed."""
CARD_AFTER = TypeAdapter(tuple[NodeNameText, Annotated[int, Field(ge=0, le=2**31 - 1)]])
"""A cards cursor: the last card's node and index."""


@router.get("/gpus/{uuid}", response_model=GpuView, summary="Get one card")
async def get_one_gpu(uuid: CardUuid, caller: Caller, res: Res) -> GpuView:
    async with res.reader.connect() as conn:
        found = await get_gpu(conn, uuid)
    if found is None:
        raise NotFound(f"card {uuid} not found")
    return found


@router.patch(
    "/gpus/{uuid}/sharing",
    response_model=GpuView,
    summary="Ask how a card is shared (admins)",
    description="Policy, release delay (fixed, or `auto` with a bound on what it may add to "
    "high priority's p99), LP window and device gate; each field left out keeps what was asked "
    "before, or else the node agent's setting. Kept by the control plane and sent to the node "
    "agent at once and after every restart of it. The answer shows the request at once "
    "(`sharing_requested`); `sharing` follows when the node has applied it (`sharing_pending` "
    "until then, `sharing_refused` when it could not).",
)
async def ask_sharing(uuid: CardUuid, change: SharingSettings, caller: Admin, res: Res) -> GpuView:
    return await _change_sharing(res, ChangeSharing(uuid=uuid, change=change))


@router.delete(
    "/gpus/{uuid}/sharing",
    response_model=GpuView,
    summary="Share a card as its node agent's settings say again (admins)",
    description="Withdraws what was asked with PATCH; the node agent gives the card its own "
    "settings back.",
)
async def withdraw_sharing(uuid: CardUuid, caller: Admin, res: Res) -> GpuView:
    return await _change_sharing(res, ChangeSharing(uuid=uuid, change=None))


async def _change_sharing(res: Resources, command: ChangeSharing) -> GpuView:
    return await rpc.call(
        res.nc, subjects.GPUS_SHARING, res.source, command, GpuView,
        timeout=res.settings.allocator_timeout_s,
    )  # fmt: skip

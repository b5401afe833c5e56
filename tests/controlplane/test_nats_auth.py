"""NATS identities (issue 11, design gap): every service connects as itself, and the server
refuses what its role may not do. The session's NATS enforces `qshare.natsauth`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.aio.client import Client

from qshare import bus
from qshare.contracts import envelope, subjects
from qshare.contracts.nodes import Heartbeat
from qshare.natsauth import NatsAuth, NatsCredentials, ServiceRole, inbox_prefix
from qshare.testing.servers import EmbeddedNats
from qshare_allocator.app import Allocator
from tests.controlplane.conftest import Register, eventually

Connect = Callable[[NatsCredentials], Awaitable[tuple[Client, list[str]]]]


@pytest.fixture
async def connect_as(bus_url: str, nats_server: EmbeddedNats | None) -> AsyncIterator[Connect]:
    """Connect as an identity; the list collects the errors the server sends it."""
    if nats_server is None:
        pytest.skip("an existing NATS server without qshare's identities is in use")
    opened: list[Client] = []

    async def go(credentials: NatsCredentials) -> tuple[Client, list[str]]:
        errors: list[str] = []

        async def on_error(error: Exception) -> None:
            errors.append(str(error))

        client = await nats.connect(
            bus_url, user=credentials.user, password=credentials.password.get_secret_value(),
            inbox_prefix=credentials.inbox_prefix, error_cb=on_error, max_reconnect_attempts=0,
        )  # fmt: skip
        opened.append(client)
        return client, errors

    yield go
    for client in opened:
        await client.close()


@pytest.fixture
async def node_n1(nats_auth: NatsAuth, nats_server: EmbeddedNats | None) -> NatsCredentials:
    """The identity of node n1, added to the running server's configuration."""
    return await _node_identity(nats_auth, nats_server, "n1")


async def _node_identity(
    nats_auth: NatsAuth, nats_server: EmbeddedNats | None, node: str
) -> NatsCredentials:
    credentials = nats_auth.add_node(node)
    if nats_server is not None:
        await nats_server.reload(nats_auth.server_config())
    return credentials


QUIET_S = 0.25
"""How long without a message ends the count of what was delivered."""


async def _delivered(watcher: Client, subject: str, offender: Client, body: bytes) -> int:
    """Every message `watcher` gets on `subject` after `offender` published there, until none
    has arrived for QUIET_S (a flush alone can beat a refused publish's error)."""
    sub = await watcher.subscribe(subject)
    await bus.settled(watcher)
    await offender.publish(subject, body)
    await bus.settled(offender)
    seen = 0
    with contextlib.suppress(nats.errors.TimeoutError):
        while await sub.next_msg(timeout=QUIET_S):
            seen += 1
    await sub.unsubscribe()
    return seen


async def _refused(errors: list[str], action: str) -> None:
    """Wait for the server's permissions violation (its callback runs as a task)."""

    async def seen() -> bool:
        return any(f"permissions violation for {action}" in e.lower() for e in errors)

    await eventually(seen, within_s=20)


def _beat() -> bytes:
    return envelope.encode(envelope.wrap("n1", "io.qshare.node.heartbeat", Heartbeat()))


async def test_an_anonymous_connection_is_refused(bus_url: str) -> None:
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(bus_url, max_reconnect_attempts=0, allow_reconnect=False)


async def test_a_service_without_an_identity_is_told_where_to_set_one(
    bus_url: str, nats_server: EmbeddedNats | None
) -> None:
    if nats_server is None:
        pytest.skip("an existing NATS server without qshare's identities is in use")
    with pytest.raises(
        PermissionError, match=r"gave no identity: set the service's NATS_SECRETS_DIR"
    ):
        await bus.connect(bus.BusOptions(bus_url, "qshare-test"))


async def test_a_wrong_password_is_refused(bus_url: str, nats_auth: NatsAuth) -> None:
    user = nats_auth.credentials(ServiceRole.API).user
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(bus_url, user=user, password="guess", allow_reconnect=False)


async def test_a_node_heartbeats_as_itself_and_the_allocator_answers(
    connect_as: Connect, node_n1: NatsCredentials, register: Register
) -> None:
    await register("n1")
    node, errors = await connect_as(node_n1)
    reply = await node.request(subjects.heartbeat("n1"), _beat(), timeout=5)
    assert envelope.decode(reply.data).data == {"freed": False}
    assert errors == []


async def test_a_node_registers_itself_on_its_own_subject(
    connect_as: Connect, node_n1: NatsCredentials, replicas: list[Allocator]
) -> None:
    node, errors = await connect_as(node_n1)
    body = {"name": "n1", "gpus": [{"uuid": "n1-g0", "index": 0, "model": "A", "memory": 4096}]}
    wrapped = envelope.encode(envelope.Envelope(source="n1", type="t", data=body))
    reply = await node.request(subjects.node_register("n1"), wrapped, timeout=5)
    assert envelope.decode(reply.data).data["name"] == "n1"  # type: ignore[index]
    assert errors == []


async def test_a_dotted_node_registers_itself_on_its_own_subject(
    connect_as: Connect,
    nats_auth: NatsAuth,
    nats_server: EmbeddedNats | None,
    replicas: list[Allocator],
) -> None:
    credentials = await _node_identity(nats_auth, nats_server, "n1.rack-2.example")
    node, errors = await connect_as(credentials)
    gpus = [{"uuid": "n1r2-g0", "index": 0, "model": "A", "memory": 4096}]
    body = {"name": "n1.rack-2.example", "gpus": gpus}
    wrapped = envelope.encode(envelope.Envelope(source="n1", type="t", data=body))
    reply = await node.request(subjects.node_register("n1.rack-2.example"), wrapped, timeout=5)
    assert envelope.decode(reply.data).data["name"] == "n1.rack-2.example"  # type: ignore[index]
    assert errors == []


async def test_a_node_cannot_read_the_replies_of_a_node_whose_name_extends_its_own(
    connect_as: Connect, node_n1: NatsCredentials
) -> None:
    node, errors = await connect_as(node_n1)
    await node.subscribe(inbox_prefix("node-n1.rack-2") + ".>")
    await bus.settled(node)
    await _refused(errors, "subscription")


async def test_a_node_cannot_register_under_another_nodes_name(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    node, errors = await connect_as(node_n1)
    assert await _delivered(nc, subjects.node_register("n2"), node, b"{}") == 0
    assert await _delivered(nc, subjects.NODES_REGISTER, node, b"{}") == 0
    await _refused(errors, "publish")


async def test_a_registration_naming_another_node_on_a_nodes_subject_is_refused(
    nc: Client, replicas: list[Allocator]
) -> None:
    body = {"name": "n2", "gpus": [{"uuid": "n2-g0", "index": 0, "model": "A", "memory": 4096}]}
    wrapped = envelope.encode(envelope.Envelope(source="n1", type="t", data=body))
    reply = await nc.request(subjects.node_register("n1"), wrapped, timeout=5)
    assert b"must name node n1" in reply.data


async def test_a_node_cannot_publish_another_nodes_heartbeat(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    node, errors = await connect_as(node_n1)
    assert await _delivered(nc, subjects.heartbeat("n2"), node, _beat()) == 0
    await _refused(errors, "publish")


async def test_a_node_cannot_create_claims_or_forge_claim_events(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    node, _ = await connect_as(node_n1)
    assert await _delivered(nc, subjects.CLAIMS_CREATE, node, b"{}") == 0
    assert await _delivered(nc, subjects.claim_event("x", "placed"), node, b"{}") == 0
    assert await _delivered(nc, subjects.gpu_event("n2", "g0", "busy"), node, b"{}") == 0


async def test_a_node_may_publish_to_no_allocator_request_subject(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    """Its registration goes on its own node's subject; the allocator's requests
    (`qshare.allocator.…`) are the API's and the preemptor's to make."""
    node, errors = await connect_as(node_n1)
    assert await _delivered(nc, "qshare.allocator.nodes.sync", node, b"{}") == 0
    await _refused(errors, "publish")


async def test_a_node_may_publish_its_own_gpu_events(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    node, errors = await connect_as(node_n1)
    assert await _delivered(nc, subjects.gpu_event("n1", "g0", "busy"), node, b"{}") == 1
    assert errors == []


async def test_a_node_publishes_its_own_usage_and_the_preemptor_reads_it(
    connect_as: Connect, node_n1: NatsCredentials, nats_auth: NatsAuth
) -> None:
    node, errors = await connect_as(node_n1)
    preemptor, _ = await connect_as(nats_auth.credentials(ServiceRole.PREEMPTOR))
    assert await _delivered(preemptor, subjects.usage("n1"), node, b"{}") == 1
    assert errors == []


async def test_the_preemptor_may_report_starvation_and_ask_for_moves(
    connect_as: Connect, nats_auth: NatsAuth, nc: Client
) -> None:
    preemptor, errors = await connect_as(nats_auth.credentials(ServiceRole.PREEMPTOR))
    assert await _delivered(nc, subjects.claim_event("x", "starved"), preemptor, b"{}") == 1
    assert await _delivered(nc, subjects.CLAIMS_MOVE, preemptor, b"{}") == 1
    assert errors == []


async def test_the_preemptor_may_suspend_and_resume_a_nodes_vgpus(
    connect_as: Connect, nats_auth: NatsAuth, nc: Client
) -> None:
    preemptor, errors = await connect_as(nats_auth.credentials(ServiceRole.PREEMPTOR))
    for verb in ("suspend", "resume"):
        assert await _delivered(nc, subjects.node_command("n1", verb), preemptor, b"{}") == 1
    assert errors == []


async def test_the_preemptor_asks_every_node_to_announce_its_cards(
    connect_as: Connect, node_n1: NatsCredentials, nats_auth: NatsAuth
) -> None:
    node, errors = await connect_as(node_n1)
    preemptor, _ = await connect_as(nats_auth.credentials(ServiceRole.PREEMPTOR))
    assert await _delivered(node, subjects.NODES_ANNOUNCE, preemptor, b"{}") == 1
    assert errors == []


async def test_a_node_cannot_ask_the_nodes_to_announce(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    node, errors = await connect_as(node_n1)
    assert await _delivered(nc, subjects.NODES_ANNOUNCE, node, b"{}") == 0
    await _refused(errors, "publish")


@pytest.mark.parametrize("verb", ["apply", "policy"])
async def test_the_preemptor_cannot_set_a_nodes_vgpus_or_card_policy(
    connect_as: Connect, nats_auth: NatsAuth, nc: Client, verb: str
) -> None:
    preemptor, errors = await connect_as(nats_auth.credentials(ServiceRole.PREEMPTOR))
    assert await _delivered(nc, subjects.node_command("n1", verb), preemptor, b"{}") == 0
    await _refused(errors, "publish")


async def test_a_node_cannot_publish_another_nodes_usage(
    connect_as: Connect, node_n1: NatsCredentials, nc: Client
) -> None:
    node, errors = await connect_as(node_n1)
    assert await _delivered(nc, subjects.usage("n2"), node, b"{}") == 0
    await _refused(errors, "publish")


@pytest.mark.parametrize(
    "subject",
    [subjects.CLAIMS_CREATE, subjects.CLAIMS_DELETE, subjects.NODES_REGISTER,
     subjects.node_command("n1", "apply"), "qshare.evt.claim.x.placed"],
)  # fmt: skip
async def test_an_integration_cannot_send_commands_or_forge_events(
    connect_as: Connect, nats_auth: NatsAuth, nc: Client, subject: str
) -> None:
    integration, errors = await connect_as(nats_auth.credentials(ServiceRole.INTEGRATION))
    assert await _delivered(nc, subject, integration, b"{}") == 0
    await _refused(errors, "publish")


async def test_an_integration_reads_events(
    connect_as: Connect, nats_auth: NatsAuth, nc: Client
) -> None:
    integration, errors = await connect_as(nats_auth.credentials(ServiceRole.INTEGRATION))
    assert await _delivered(integration, "qshare.evt.claim.x.placed", nc, b"{}") == 1
    assert errors == []


@pytest.mark.parametrize("role", [ServiceRole.API, ServiceRole.INTEGRATION, ServiceRole.PREEMPTOR])
async def test_only_the_allocator_may_join_the_allocator_queue_group(
    connect_as: Connect, nats_auth: NatsAuth, role: ServiceRole, replicas: list[Allocator]
) -> None:
    intruder, errors = await connect_as(nats_auth.credentials(role))
    sub = await intruder.subscribe(subjects.CLAIMS_CREATE, queue=subjects.ALLOCATOR_QUEUE)
    await bus.settled(intruder)
    await _refused(errors, "subscription")
    await sub.unsubscribe()


async def test_no_service_reads_another_services_replies(
    connect_as: Connect, nats_auth: NatsAuth
) -> None:
    api, errors = await connect_as(nats_auth.credentials(ServiceRole.API))
    await api.subscribe(inbox_prefix("allocator") + ".>")
    await bus.settled(api)
    await _refused(errors, "subscription")


async def test_the_api_cannot_command_nodes(
    connect_as: Connect, nats_auth: NatsAuth, nc: Client
) -> None:
    api, _ = await connect_as(nats_auth.credentials(ServiceRole.API))
    assert await _delivered(nc, subjects.node_command("n1", "apply"), api, b"{}") == 0

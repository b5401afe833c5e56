"""NATS identities and their subject permissions: one user per service role and one per node,
and the nats-server configuration that enforces them.

Each identity may publish and subscribe only where its role needs to (`permissions()`);
replies go to the requester's own inbox prefix `_INBOX.<user>.`, which no other identity may
read, and a responder may publish only to the reply subjects of requests it received
(`allow_responses`). Only the allocator identity may join the allocator's queue group, and
a node's identity may publish only its own node's subjects. Passwords are random; a
deployment keeps them in a secrets directory (`NatsAuth.save`, `nats_credentials`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import SecretStr

from qshare import atomic_file
from qshare.contracts import subjects
from qshare.contracts.nodes import NODE_NAME_MAX, is_node_name

SECRETS_DIR_ENV = "QSHARE_NATS_SECRETS_DIR"
"""Where `nats_credentials` looks for `<user>.password` files when no directory is given."""
CONFIG_FILE = "nats.conf"
_JS_STREAM = subjects.EVENTS_STREAM


class ServiceRole(StrEnum):
    """Who connects. `operator` has every right: for tests and administration tools only."""

    ALLOCATOR = "allocator"
    API = "api"
    PREEMPTOR = "preemptor"
    INTEGRATION = "integration"
    NODE = "node"
    OPERATOR = "operator"


@dataclass(frozen=True)
class NatsCredentials:
    """What a process passes to `qshare.bus.connect` (via its settings' `nats_user` and
    `nats_password`); `inbox_prefix` is where its replies arrive."""

    user: str
    password: SecretStr

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.user)


@dataclass(frozen=True)
class ServerTls:
    """Files of the server's certificate; clients then need `nats_tls_ca`."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None


def user_name(role: ServiceRole, node: str | None = None) -> str:
    """`allocator`, `api`, …; `node-<node>` for a node agent."""
    if role is ServiceRole.NODE:
        if node is None or not is_node_name(node):
            raise ValueError(f"a node identity needs a node name, not {node!r}")
        return f"node-{node}"
    if node is not None:
        raise ValueError(f"role {role} takes no node")
    return role.value


def inbox_prefix(user: str) -> str:
    """Replies to `user` arrive under this prefix, readable by `user` alone (one token: a
    dotted node's `node-a.b` is `_INBOX.node-a~b`, not a prefix of node `a`'s inboxes)."""
    return f"_INBOX.{subjects.node_token(user)}"


def permissions(role: ServiceRole, node: str | None = None) -> dict[str, object]:
    """The nats-server permissions block of an identity."""
    user = user_name(role, node)
    if role is ServiceRole.OPERATOR:
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    publish, subscribe, responds = _RULES[role](node or "")
    return {
        "publish": {"allow": publish},
        "subscribe": {"allow": [f"{inbox_prefix(user)}.>", *subscribe]},
        **({"allow_responses": True} if responds else {}),
    }


_READ_EVENTS_PUBLISH = [
    "$JS.API.INFO",
    f"$JS.API.STREAM.INFO.{_JS_STREAM}",
    f"$JS.API.CONSUMER.CREATE.{_JS_STREAM}",  # an ordered consumer's (nats-py names none)
    f"$JS.API.CONSUMER.CREATE.{_JS_STREAM}.>",
    f"$JS.API.CONSUMER.INFO.{_JS_STREAM}.>",
    f"$JS.API.CONSUMER.DELETE.{_JS_STREAM}.>",
    f"$JS.API.CONSUMER.MSG.NEXT.{_JS_STREAM}.>",
    f"$JS.ACK.{_JS_STREAM}.>",
    f"$JS.FC.{_JS_STREAM}.>",
]
"""What reading the event stream through a JetStream consumer needs (no stream changes)."""
_EVENTS = "qshare.evt.>"
_ALLOCATOR_REQUESTS = "qshare.allocator.>"


def _allocator(_: str) -> tuple[list[str], list[str], bool]:
    publish = [
        subjects.node_command("*", ">"),
        subjects.claim_event("*", "*"),
        f"$JS.API.STREAM.CREATE.{_JS_STREAM}",
        f"$JS.API.STREAM.UPDATE.{_JS_STREAM}",
        *_READ_EVENTS_PUBLISH,
    ]
    queue = subjects.ALLOCATOR_QUEUE
    subscribe = [
        f"{_ALLOCATOR_REQUESTS} {queue}",
        f"{subjects.HEARTBEATS} {queue}",
        f"{subjects.NODE_REGISTRATIONS} {queue}",
        _EVENTS,
    ]
    return publish, subscribe, True


def _api(_: str) -> tuple[list[str], list[str], bool]:
    publish = [
        "qshare.allocator.claims.*",
        subjects.NODES_REGISTER,
        subjects.NODES_DELETE,
        subjects.NODES_UPDATE,
        subjects.GPUS_DELETE,
        subjects.GPUS_SHARING,
        subjects.PLACEMENT_PREVIEW,
        "qshare.preemptor.>",
        *_READ_EVENTS_PUBLISH,
    ]
    return publish, [_EVENTS], False


def _preemptor(_: str) -> tuple[list[str], list[str], bool]:
    publish = [
        subjects.node_command("*", "suspend"),  # not apply: it would set a node's vGPUs
        subjects.node_command("*", "resume"),
        subjects.claim_event("*", "suspended"),
        subjects.claim_event("*", "resumed"),
        subjects.claim_event("*", "starved"),
        subjects.CLAIMS_MOVE,
        subjects.NODES_ANNOUNCE,  # every agent announces its cards' state again
        *_READ_EVENTS_PUBLISH,
    ]
    subscribe = ["qshare.preemptor.> qshare-preemptor", _EVENTS, subjects.NODE_USAGES]
    return publish, subscribe, True


def _integration(_: str) -> tuple[list[str], list[str], bool]:
    return list(_READ_EVENTS_PUBLISH), [_EVENTS], False


def _node(node: str) -> tuple[list[str], list[str], bool]:
    publish = [
        subjects.node_register(node),
        subjects.heartbeat(node),
        subjects.usage(node),
        subjects.gpu_event(node, "*", "*"),
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{_JS_STREAM}",
    ]
    subscribe = [subjects.node_command(node, ">"), subjects.NODES_ANNOUNCE]
    return publish, subscribe, True


_RULES = {
    ServiceRole.ALLOCATOR: _allocator,
    ServiceRole.API: _api,
    ServiceRole.PREEMPTOR: _preemptor,
    ServiceRole.INTEGRATION: _integration,
    ServiceRole.NODE: _node,
}

SERVICE_ROLES = (
    ServiceRole.ALLOCATOR,
    ServiceRole.API,
    ServiceRole.PREEMPTOR,
    ServiceRole.INTEGRATION,
    ServiceRole.OPERATOR,
)
"""The identities every deployment has; node identities are added per node."""


class NatsAuth:
    """The identities of one deployment with their passwords, and the server config."""

    def __init__(self, passwords: dict[str, str]) -> None:
        self._passwords = dict(passwords)

    @classmethod
    def generate(cls, nodes: tuple[str, ...] | list[str] = ()) -> NatsAuth:
        """Random passwords for every service role and for each of `nodes`."""
        auth = cls({user_name(role): _password() for role in SERVICE_ROLES})
        for node in nodes:
            auth.add_node(node)
        return auth

    def add_node(self, node: str) -> NatsCredentials:
        """Give `node` an identity (kept if it has one); reload the server config after."""
        self._passwords.setdefault(user_name(ServiceRole.NODE, node), _password())
        return self.credentials(ServiceRole.NODE, node)

    def credentials(self, role: ServiceRole, node: str | None = None) -> NatsCredentials:
        user = user_name(role, node)
        if user not in self._passwords:
            raise KeyError(f"no NATS identity {user}; add it first")
        return NatsCredentials(user, SecretStr(self._passwords[user]))

    def server_config(self, tls: ServerTls | None = None) -> str:
        """A nats-server configuration with one user per identity (JSON is valid config)."""
        users = [
            {"user": user, "password": password, "permissions": permissions(*_role_of(user))}
            for user, password in sorted(self._passwords.items())
        ]
        config: dict[str, object] = {"authorization": {"users": users}}
        if tls is not None:
            config["tls"] = _tls_block(tls)
        return json.dumps(config, indent=2)

    def save(self, directory: Path, tls: ServerTls | None = None) -> None:
        """Write `<user>.password` files and `nats.conf`, readable by the owner only."""
        if not directory.exists():
            directory.mkdir(parents=True)
            directory.chmod(0o700)  # its names (nodes) are nobody else's business either
        for user, password in self._passwords.items():
            _write_secret(directory / f"{user}.password", password)
        _write_secret(directory / CONFIG_FILE, self.server_config(tls))

    @classmethod
    def load(cls, directory: Path) -> NatsAuth:
        found = {p.stem: p.read_text().strip() for p in directory.glob("*.password")}
        # an empty file (a write interrupted before `_write_secret` was atomic) is no password
        return cls({user: password for user, password in found.items() if password})


def nats_credentials(
    role: ServiceRole | str, node: str | None = None, secrets_dir: Path | None = None
) -> NatsCredentials:
    """The credentials of a service (or of node `node`) from a secrets directory written by
    `NatsAuth.save` (default: `$QSHARE_NATS_SECRETS_DIR`)."""
    directory = secrets_dir or Path(os.environ.get(SECRETS_DIR_ENV, ""))
    if not str(directory):
        raise FileNotFoundError(f"no secrets directory given and {SECRETS_DIR_ENV} is not set")
    user = user_name(ServiceRole(role), node)
    path = directory / f"{user}.password"
    if not path.exists():
        raise FileNotFoundError(f"no NATS identity {user}: {path} is missing")
    return NatsCredentials(user, SecretStr(path.read_text().strip()))


def identity_env(prefix: str, credentials: NatsCredentials) -> dict[str, str]:
    """Environment variables that make a service with env prefix `prefix` (for example
    `QSHARE_API_`) connect as `credentials`: `<prefix>NATS_USER`, `<prefix>NATS_PASSWORD`."""
    return {
        f"{prefix}NATS_USER": credentials.user,
        f"{prefix}NATS_PASSWORD": credentials.password.get_secret_value(),
    }


ADMIN_TOKEN_FILE = "admin.token"


def init_secrets(directory: Path, nodes: list[str], owner: int | None = None) -> None:
    """Write a deployment's secrets once: NATS identities and config, and the bootstrap
    admin token; an existing directory keeps its passwords and token (nodes are added)."""
    auth = NatsAuth.load(directory) if directory.exists() else NatsAuth({})
    for role in SERVICE_ROLES:
        auth._passwords.setdefault(user_name(role), _password())
    for node in nodes:
        auth.add_node(node)
    auth.save(directory)
    token = directory / ADMIN_TOKEN_FILE
    if not token.exists() or not token.read_text().strip():
        _write_secret(token, "qs_" + secrets.token_urlsafe(32))
    token.chmod(0o600)
    if owner is not None:
        for path in [directory, *directory.iterdir()]:
            os.chown(path, owner, owner)


def main(argv: list[str] | None = None) -> int:
    """`python -m qshare.natsauth init DIR [--node NAME]... [--owner UID]`."""
    parser = argparse.ArgumentParser(prog="python -m qshare.natsauth")
    parser.add_argument("action", choices=["init"])
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--node", action="append", default=[], type=_node_name, help="a node agent's identity"
    )
    parser.add_argument("--owner", type=int, default=None, help="chown the files to this uid")
    args = parser.parse_args(argv)
    try:
        init_secrets(args.directory, args.node, args.owner)
    except OSError as exc:  # a directory it cannot make or write, an owner it may not set
        print(f"python -m qshare.natsauth: cannot write {args.directory}: {exc}", file=sys.stderr)
        return 1
    print(f"secrets in {args.directory}: {CONFIG_FILE}, {ADMIN_TOKEN_FILE}, <user>.password")
    return 0


def _node_name(value: str) -> str:
    """A node name a NATS identity can carry (argparse names the flag when it is not)."""
    try:
        user_name(ServiceRole.NODE, value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a node name: dot-separated parts of letters, digits, '-' and "
            f"'_', each starting and ending with a letter or digit, at most {NODE_NAME_MAX} "
            "characters"
        ) from None
    return value


def _role_of(user: str) -> tuple[ServiceRole, str | None]:
    if user.startswith("node-"):
        return ServiceRole.NODE, user.removeprefix("node-")
    return ServiceRole(user), None


def _tls_block(tls: ServerTls) -> dict[str, object]:
    block: dict[str, object] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file)}
    if tls.ca_file is not None:
        block |= {"ca_file": str(tls.ca_file)}
    return block


def _password() -> str:
    return secrets.token_urlsafe(24)


def _write_secret(path: Path, content: str) -> None:
    """`content` in `path`, owner-only from its first byte, whole or not at all (a run stopped
    midway leaves the old file or the new one, never a part)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    atomic_file.replace(
        str(path), str(partial), (content + "\n").encode(), durable=True, mode=0o600
    )


if __name__ == "__main__":
    raise SystemExit(main())

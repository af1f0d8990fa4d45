"""``compose.yaml`` read as the Compose specification reads it, and its services as
``podman run`` command lines.

The container test runs the demo from ``compose.yaml`` itself, so the file users run is
the one tested, on hosts without ``podman-compose`` or ``docker compose``. Only what
``compose.yaml`` uses is translated (image, command, environment, ports, named volumes,
networks, hostname, healthcheck, depends_on); anything else is an error, so a new key
cannot be silently ignored by the test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: The service keys this module translates; any other is refused.
KNOWN_KEYS = {
    "image",
    "command",
    "environment",
    "ports",
    "volumes",
    "networks",
    "hostname",
    "healthcheck",
    "depends_on",
}
_VARIABLE = re.compile(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}")


class ComposeError(Exception):
    """compose.yaml says something the Compose specification (or this module) refuses."""


def interpolate(value: str, environ: Mapping[str, str]) -> str:
    """``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}`` as Compose substitutes them."""

    def one(found: re.Match[str]) -> str:
        name, op, arg = found.group(1), found.group(2), found.group(3)
        have = environ.get(name, "")
        if have:
            return have
        if op == ":?":
            raise ComposeError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return _VARIABLE.sub(one, value)


@dataclass(frozen=True)
class Service:
    name: str
    image: str
    command: list[str]
    #: Resolved values; passed to ``podman run`` by name only (``-e NAME``), never in argv.
    environment: dict[str, str]
    #: (host address, host port, container port)
    ports: list[tuple[str, int, int]]
    #: (named volume, path in the container)
    volumes: list[tuple[str, str]]
    networks: list[str]
    hostname: str | None
    healthcheck: dict[str, Any] | None
    #: service name -> condition (service_started, service_healthy)
    depends_on: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Project:
    name: str
    #: In an order that starts every service after those it depends on.
    services: list[Service]
    networks: list[str]
    volumes: list[str]

    def container(self, service: str) -> str:
        return f"{self.name}-{service}"

    def resource(self, name: str) -> str:
        """A network's or volume's name on the host (prefixed with the project's)."""
        return f"{self.name}_{name}"


def load(path: Path, environ: Mapping[str, str], project: str | None = None) -> Project:
    """The project of ``path`` with variables from ``environ``; ``project`` renames it
    (so a test's containers, networks and volumes never meet a user's)."""
    doc = yaml.safe_load(path.read_text())
    services = {name: _service(name, spec, environ) for name, spec in doc["services"].items()}
    networks = list(doc.get("networks") or {})
    volumes = list(doc.get("volumes") or {})
    for s in services.values():
        for net in s.networks:
            if net not in networks:
                raise ComposeError(f"service {s.name}: network {net!r} is not declared")
        for vol, _ in s.volumes:
            if vol not in volumes:
                raise ComposeError(f"service {s.name}: volume {vol!r} is not declared")
        for dep in s.depends_on:
            if dep not in services:
                raise ComposeError(f"service {s.name}: depends on unknown service {dep!r}")
    return Project(project or doc["name"], _start_order(services), networks, volumes)


def _service(name: str, spec: dict[str, Any], environ: Mapping[str, str]) -> Service:
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise ComposeError(f"service {name}: keys this test cannot translate: {sorted(unknown)}")
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    ports = []
    for port in spec.get("ports") or []:
        host, host_port, container_port = str(port).rsplit(":", 2)
        ports.append((host, int(host_port), int(container_port)))
    volumes = []
    for volume in spec.get("volumes") or []:
        source, target = str(volume).split(":", 1)
        if source.startswith((".", "/")):
            raise ComposeError(f"service {name}: {volume}: only named volumes are used")
        volumes.append((source, target))
    depends = spec.get("depends_on") or {}
    if isinstance(depends, list):
        depends = {d: {"condition": "service_started"} for d in depends}
    command = spec.get("command") or []
    if isinstance(command, str):
        raise ComposeError(f"service {name}: give command as a list (no shell splitting)")
    return Service(
        name=name,
        image=interpolate(spec["image"], environ),
        command=[interpolate(str(c), environ) for c in command],
        environment={k: interpolate(str(v), environ) for k, v in env.items()},
        ports=ports,
        volumes=volumes,
        networks=list(spec.get("networks") or []),
        hostname=spec.get("hostname"),
        healthcheck=spec.get("healthcheck"),
        depends_on={d: c.get("condition", "service_started") for d, c in depends.items()},
    )


def _start_order(services: dict[str, Service]) -> list[Service]:
    order: list[Service] = []
    seen: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ComposeError(f"depends_on cycle: {' -> '.join((*path, name))}")
        if name in seen:
            return
        for dep in services[name].depends_on:
            visit(dep, (*path, name))
        seen.add(name)
        order.append(services[name])

    for name in services:
        visit(name, ())
    return order


def run_argv(project: Project, service: Service, any_host_port: bool = False) -> list[str]:
    """``podman run -d ...`` for ``service`` (environment values come from the caller's
    environment: pass ``service.environment`` in it). ``any_host_port`` publishes on a
    free host port instead of the one written (a test must not take 7070)."""
    argv = ["run", "-d", "--name", project.container(service.name)]
    for net in service.networks:
        argv += ["--network", project.resource(net), "--network-alias", service.name]
    if service.hostname:
        argv += ["--hostname", service.hostname]
    for name in service.environment:
        argv += ["--env", name]
    for host, host_port, container_port in service.ports:
        argv += ["--publish", f"{host}:{'' if any_host_port else host_port}:{container_port}"]
    for volume, target in service.volumes:
        argv += ["--volume", f"{project.resource(volume)}:{target}"]
    check = service.healthcheck
    if check:
        test = check["test"]
        if test[0] == "CMD":
            argv += ["--health-cmd", json.dumps(test[1:])]
        elif test[0] == "CMD-SHELL":
            argv += ["--health-cmd", test[1]]
        for key, flag in (
            ("interval", "--health-interval"),
            ("timeout", "--health-timeout"),
            ("retries", "--health-retries"),
            ("start_period", "--health-start-period"),
        ):
            if key in check:
                argv += [flag, str(check[key])]
    return [*argv, service.image, *service.command]

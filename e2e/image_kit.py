"""Helpers of the image tests (this module holds no tests): the built image and containers run from it.

A container here is what the process kubelet would start for a pod's container of the image:
:func:`rolloutpool.dev.kubelet.container.container_plan` of the pod as the operator or the
chart writes it, carried out by ``enter.py`` (a chroot into an overlay of the image's root
filesystem, as the pod's user, volumes at their mount paths), without a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rolloutpool.dev.image.build import ENTER_SCRIPT, BuiltImage, buildah_unavailable, ensure_image
from rolloutpool.dev.kubelet.container import ImageConfig, container_plan, parse_passwd
from rolloutpool.dev.kubelet.decide import resolve_env
from rolloutpool.dev.processes import signal_group, stop_group

__all__ = [
    "built_image",
    "container_pids",
    "credentials",
    "get",
    "loopback_ip",
    "read_only_root",
    "run_container",
    "start_container",
]


def built_image() -> BuiltImage:
    """The image of this checkout, built once per machine and content.

    Skips only where buildah cannot run (not root, not Linux, the tools missing), saying why; under
    CI (``CI=true``) that is a failure instead, since CI here runs as root with the tools installed.
    """
    reason = buildah_unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the image, but: {reason}")
        pytest.skip(f"the image cannot be built on this machine: {reason}")
    return ensure_image(log=lambda _line: None)


def loopback_ip() -> str:
    """A random 127.x.y.z of its own, so fixed container ports never clash with other tests."""
    return f"127.{secrets.randbelow(100) + 30}.{secrets.randbelow(256)}.{secrets.randbelow(250) + 2}"


def _plan(
    image: BuiltImage,
    *,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    directory: Path,
    pod_ip: str,
) -> Path:
    """Write the plan the kubelet would write for this container (volumes as fresh emptyDirs)."""
    volumes = {}
    for volume in pod["spec"].get("volumes") or []:
        where = directory / "volumes" / volume["name"]
        where.mkdir(parents=True, exist_ok=True)
        where.chmod(0o777)
        volumes[volume["name"]] = str(where)
    config = ImageConfig.from_oci(image.config)
    seen = {**pod, "status": {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "hostIP": "127.0.0.1"}}
    env = resolve_env(
        pod=seen,
        container=container,
        config_maps={},
        secrets={},
        base={**dict(config.env), "HOSTNAME": pod["metadata"]["name"]},
    )
    plan = container_plan(
        pod=seen,
        container=container,
        image=config,
        passwd=parse_passwd((image.rootfs / "etc" / "passwd").read_text()),
        env=env,
        volumes=volumes,
        rootfs=str(image.rootfs),
        container_dir=str(directory / "containers" / container["name"]),
    )
    spec = directory / f"{container['name']}.json"
    spec.write_text(json.dumps(plan))
    return spec


def run_container(
    image: BuiltImage, *, pod: Mapping[str, Any], container: Mapping[str, Any], directory: Path
) -> subprocess.CompletedProcess[str]:
    """Run a container to completion; its output (stdout and stderr together) and exit code."""
    spec = _plan(image, pod=pod, container=container, directory=directory, pod_ip=loopback_ip())
    return subprocess.run(
        [sys.executable, "-I", str(ENTER_SCRIPT), str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )


@contextlib.contextmanager
def start_container(
    image: BuiltImage, *, pod: Mapping[str, Any], container: Mapping[str, Any], directory: Path, pod_ip: str
) -> Iterator[subprocess.Popen[bytes]]:
    """A container running in the background (log in ``<directory>/<name>.log``); always stopped on exit."""
    spec = _plan(image, pod=pod, container=container, directory=directory, pod_ip=pod_ip)
    with (directory / f"{container['name']}.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(ENTER_SCRIPT), str(spec)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_group(proc.pid, grace=10.0, popen=proc)
        signal_group(proc.pid, signal.SIGKILL)


def get(url: str, *, timeout: float = 2.0) -> tuple[int, bytes]:
    """One GET: status and body (connection errors raise ``OSError``)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - our own http URL
        return int(response.status), bytes(response.read())


def container_pids(directory: Path) -> list[int]:
    """Processes whose root is a container root under ``directory`` (``<dir>/.../containers/<name>/root``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/root").startswith(f"{directory}/"):
                found.append(int(entry))
    return found


def credentials(pid: int) -> tuple[int, int, list[int]]:
    """Real uid, real gid and supplementary groups of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), [int(g) for g in fields["Groups"].split()]


def read_only_root(pid: int) -> bool:
    """Whether the process sees its root filesystem mounted read-only."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return "ro" in fields[5].split(",")
    raise AssertionError(f"no root mount in /proc/{pid}/mountinfo")

"""How a container runs from an image's root filesystem: the plan ``enter.py`` carries out (pure).

A pod's container whose image the kubelet holds as a root filesystem (``--image REF=DIR``)
runs the way a container runtime would run it: Kubernetes' rules for the image's
``Entrypoint``/``Cmd`` against the container's ``command``/``args``, the image's ``Env`` under
the container's, the image's ``WorkingDir`` unless ``workingDir`` says otherwise, the user of
``securityContext`` (container over pod) or else the image's ``User``, with ``runAsNonRoot``
checked as the kubelet checks it, ``readOnlyRootFilesystem``, ``allowPrivilegeEscalation:
false`` as no-new-privileges, and each volume mounted at its ``mountPath``.

Every function here is pure: keyword-only inputs (the pod as the API server returns it),
no I/O. The kubelet (:mod:`rolloutpool.dev.kubelet.pods`) writes the plan as JSON and starts
``enter.py`` with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rolloutpool.dev.kubelet.decide import EnvError, expand

__all__ = ["ImageConfig", "User", "container_argv", "container_plan", "parse_passwd", "run_as"]


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config a container's start depends on."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = ""
    working_dir: str = ""

    @classmethod
    def from_oci(cls, config: Mapping[str, Any]) -> ImageConfig:
        """From the ``config`` object of an OCI image config (``Entrypoint``, ``Cmd``, ``Env``, ...)."""
        env = tuple(tuple(item.split("=", 1)) for item in config.get("Env") or [] if "=" in item)
        return cls(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=env,
            user=str(config.get("User") or ""),
            working_dir=str(config.get("WorkingDir") or ""),
        )


@dataclass(frozen=True)
class User:
    """Who a container runs as: uid, gid and supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


def parse_passwd(text: str) -> dict[str, tuple[int, int]]:
    """``/etc/passwd`` of an image: user name -> (uid, gid)."""
    users: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
            users[fields[0]] = (int(fields[2]), int(fields[3]))
    return users


def container_argv(*, container: Mapping[str, Any], image: ImageConfig) -> list[str]:
    """Kubernetes' rule: ``command`` replaces the image's Entrypoint and drops its Cmd; ``args`` replace Cmd."""
    command, args = list(container.get("command") or []), list(container.get("args") or [])
    if command:
        return [*command, *args]
    return [*image.entrypoint, *(args or image.cmd)]


def _image_user(user: str, passwd: Mapping[str, tuple[int, int]]) -> tuple[int | None, int | None, str]:
    """The image's ``User`` (``uid``, ``uid:gid``, ``name`` or ``name:gid``) as numbers; None where unknown.

    As runc does: no user is root; a numeric uid takes its passwd entry's group, else 0.
    """
    name, _, group = user.partition(":")
    uid: int | None
    gid: int | None
    if not name:
        uid, gid = 0, 0
    elif name.isdigit():
        uid = int(name)
        gid = next((g for u, g in passwd.values() if u == uid), 0)
    elif name in passwd:
        uid, gid = passwd[name]
    else:
        uid, gid = None, None
    if group.isdigit():
        gid = int(group)
    return uid, gid, name


def run_as(
    *, pod: Mapping[str, Any], container: Mapping[str, Any], image: ImageConfig, passwd: Mapping[str, tuple[int, int]]
) -> User:
    """The user a container runs as, checked as the kubelet checks ``runAsNonRoot``.

    ``runAsUser``/``runAsGroup``/``runAsNonRoot`` of the container's ``securityContext`` win over
    the pod's; without them the image's ``User`` counts (a name is looked up in ``passwd``).
    Supplementary groups: the pod's ``supplementalGroups`` and ``fsGroup``. Raises
    :class:`EnvError` with the kubelet's wording when the container may not start.
    """
    pod_ctx = (pod.get("spec") or {}).get("securityContext") or {}
    ctx = {**pod_ctx, **(container.get("securityContext") or {})}
    image_uid, image_gid, name = _image_user(image.user, passwd)
    uid = ctx.get("runAsUser", image_uid)
    if ctx.get("runAsNonRoot"):
        if uid is None:
            raise EnvError(
                f"container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root"
            )
        if int(uid) == 0:
            raise EnvError("container has runAsNonRoot and image will run as root")
    if uid is None:
        raise EnvError(f"unable to find user {name}: no matching entries in passwd file")
    gid = ctx.get("runAsGroup", image_gid if image_gid is not None else 0)
    groups = [int(g) for g in pod_ctx.get("supplementalGroups") or []]
    if pod_ctx.get("fsGroup") is not None:
        groups.append(int(pod_ctx["fsGroup"]))
    return User(uid=int(uid), gid=int(gid), groups=tuple(dict.fromkeys(groups)))


def container_plan(
    *,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    image: ImageConfig,
    passwd: Mapping[str, tuple[int, int]],
    env: Mapping[str, str],
    volumes: Mapping[str, str],
    rootfs: str,
    container_dir: str,
) -> dict[str, Any]:
    """The JSON plan ``enter.py`` runs: root filesystem, writable layer, mounts, user, cwd, env and argv.

    ``env`` is the container's environment already resolved over the image's (the kubelet's
    ``resolve_env``); ``volumes`` maps each pod volume's name to its host directory. ``$(VAR)``
    in the command and args expands against ``env``. Raises :class:`EnvError` as :func:`run_as`.
    """
    user = run_as(pod=pod, container=container, image=image, passwd=passwd)
    ctx = container.get("securityContext") or {}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            continue
        source = volumes[mount["name"]]
        if mount.get("subPath"):
            source = f"{source}/{mount['subPath']}"
        mounts.append({"source": source, "target": mount["mountPath"], "read_only": bool(mount.get("readOnly"))})
    argv = [expand(a, env=env) for a in container_argv(container=container, image=image)]
    if not argv:
        raise EnvError("no command specified: the container has no command and the image no Entrypoint or Cmd")
    return {
        "rootfs": rootfs,
        "container_dir": container_dir,
        "hostname": str((pod.get("metadata") or {}).get("name", ""))[:63],
        "read_only": bool(ctx.get("readOnlyRootFilesystem")),
        "no_new_privs": ctx.get("allowPrivilegeEscalation") is False,
        "uid": user.uid,
        "gid": user.gid,
        "groups": list(user.groups),
        "mounts": mounts,
        "cwd": str(container.get("workingDir") or image.working_dir or "/"),
        "env": dict(env),
        "argv": argv,
    }

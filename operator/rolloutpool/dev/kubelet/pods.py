"""Preparing a pod to run as processes: its directory, volumes, service-account kubeconfig, launches.

A process cannot see a container's mounts, so every volume becomes a directory
under the pod's own directory (``<kubelet dir>/pods/<ns>_<name>_<uid8>/volumes/<volume>``:
emptyDir and PVCs empty, ConfigMap/Secret/projected/downwardAPI volumes filled with their
files) and each mount path is substituted in the container's command, args and env
values where it starts a path (``--state-path=/state/x`` -> ``.../volumes/state/x``);
a volume mounted at ``/tmp`` also becomes ``TMPDIR``. Paths the program builds itself
from a mount path are not mapped. ``securityContext`` (user, read-only root) is not
applied: processes run as the kubelet's user.

A container whose image the kubelet holds as a root filesystem (``images``: a build of
:mod:`rolloutpool.dev.image`) runs from it instead, as a container runtime would run it:
``enter.py`` chroots into an overlay of the image as the pod's user, with the volumes
mounted at their mount paths (no path mapping), the image's environment under the
container's, ``securityContext`` applied (:mod:`rolloutpool.dev.kubelet.container`), and
the in-cluster configuration (``KUBERNETES_SERVICE_HOST``/``PORT`` and the projected
service-account token at its usual path) instead of ``KUBECONFIG``. emptyDir volumes
are world-writable, as a kubelet makes them, so a non-root user can write them.

Service accounts: unless ``automountServiceAccountToken`` is false, the kubelet asks the
TokenRequest API for a token of the pod's ServiceAccount bound to the pod, writes
``<pod dir>/kubeconfig`` (server, CA, token) and points ``KUBECONFIG`` at it (programs
that load in-cluster config first must fall back to ``KUBECONFIG``, as kopf does); the
projected ``kube-api-access-*`` volume gets ``token``, ``ca.crt`` and ``namespace``.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rolloutpool.dev.image.build import ENTER_SCRIPT, BuiltImage
from rolloutpool.dev.kubelet.container import ImageConfig, container_plan, parse_passwd
from rolloutpool.dev.kubelet.decide import (
    EnvError,
    env_sources,
    expand,
    resolve_env,
    substitute_paths,
)
from rolloutpool.dev.kubelet.node import call
from rolloutpool.dev.kubelet.runtime import ContainerRun, Launch

__all__ = ["ApiTarget", "PodPreparer", "api_target"]

_log = logging.getLogger(__name__)
_SOURCE_ROOT = str(Path(__file__).resolve().parents[3])
"""The source root (``operator/``) of the ``rolloutpool`` package this kubelet runs."""


@dataclass(frozen=True)
class ApiTarget:
    """Where the pods' kubeconfigs point: the API server URL and its CA file."""

    server: str
    ca_file: Path


def api_target(kubeconfig: Path, directory: Path) -> ApiTarget:
    """Server URL and CA file of the kubeconfig's current cluster (inline CA data written to a file)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    current = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])["context"]["cluster"]
    cluster = next(c for c in doc["clusters"] if c["name"] == current)["cluster"]
    if "certificate-authority" in cluster:
        ca = Path(cluster["certificate-authority"])
        return ApiTarget(server=cluster["server"], ca_file=ca if ca.is_absolute() else kubeconfig.parent / ca)
    ca_file = directory / "ca.crt"
    ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    return ApiTarget(server=cluster["server"], ca_file=ca_file)


class PodPreparer:
    """Builds the per-pod directory, volumes, kubeconfig and container launches (API reads included)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        target: ApiTarget,
        executables: Mapping[str, str],
        token_seconds: int,
        base_path: str,
        images: Mapping[str, BuiltImage] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.target = target
        self.executables = dict(executables)
        self.token_seconds = token_seconds
        self.base_path = base_path
        self.images = dict(images or {})
        self._passwd = {
            ref: parse_passwd((image.rootfs / "etc" / "passwd").read_text(errors="replace"))
            for ref, image in self.images.items()
        }

    # -- public ---------------------------------------------------------------------------

    def containers(self, pod: Mapping[str, Any], *, directory: Path) -> list[ContainerRun]:
        """One :class:`ContainerRun` per container; a container whose config cannot be built carries the error."""
        meta, spec = pod["metadata"], pod["spec"]
        directory.mkdir(parents=True, exist_ok=True)
        base = {
            "PATH": self.base_path,
            "HOME": str(directory),
            "HOSTNAME": meta["name"],
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            # "our image" is the checkout running this kubelet (a git worktree too, not only the installed copy)
            "PYTHONPATH": _SOURCE_ROOT,
        }
        # No KUBERNETES_SERVICE_HOST/PORT: in-cluster loading must fail over to KUBECONFIG (kopf does so); with
        # them set, a host that itself runs in a pod would hand its own /var/run/secrets token to our processes.
        token = self._token(pod) if self._automount(pod) else None
        if token is not None:
            base["KUBECONFIG"] = str(self._write_kubeconfig(directory, token, meta["namespace"]))
        volumes = self._volumes(pod, directory, token)
        runs = []
        for container in spec.get("containers") or []:
            try:
                if container.get("image") in self.images:
                    launch = self._image_launch(
                        pod, container, directory=directory, volumes=volumes, in_cluster=token is not None
                    )
                else:
                    launch = self._launch(pod, container, directory=directory, base=base, volumes=volumes)
            except (EnvError, ApiException, KeyError) as err:
                reason = err.reason if isinstance(err, ApiException) else str(err)
                runs.append(ContainerRun(spec=container, launch=None, config_error=str(reason)))
                continue
            runs.append(ContainerRun(spec=container, launch=launch))
        return runs

    # -- pieces ---------------------------------------------------------------------------

    def _automount(self, pod: Mapping[str, Any]) -> bool:
        flag = pod["spec"].get("automountServiceAccountToken")
        if flag is not None:
            return bool(flag)
        name = pod["spec"].get("serviceAccountName") or "default"
        try:
            account = call(self.core.read_namespaced_service_account, name, pod["metadata"]["namespace"])
        except ApiException:
            return True  # the TokenRequest below reports the missing account
        return account.get("automountServiceAccountToken") is not False

    def _token(self, pod: Mapping[str, Any]) -> str | None:
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": self.token_seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        try:
            answer = call(self.core.create_namespaced_service_account_token, account, meta["namespace"], request)
        except ApiException as err:
            _log.warning(
                "TokenRequest failed pod=%s/%s serviceAccount=%s status=%s",
                meta["namespace"],
                meta["name"],
                account,
                err.status,
            )
            return None
        return str(answer["status"]["token"])

    def _write_kubeconfig(self, directory: Path, token: str, namespace: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.target.server, "certificate-authority": str(self.target.ca_file)},
                }
            ],
            "users": [{"name": "serviceaccount", "user": {"token": token}}],
            "contexts": [
                {"name": "pod", "context": {"cluster": "local", "user": "serviceaccount", "namespace": namespace}}
            ],
            "current-context": "pod",
        }
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _volumes(self, pod: Mapping[str, Any], directory: Path, token: str | None) -> dict[str, str]:
        """Create each volume's directory (filled where the volume has content); name -> host path."""
        namespace = pod["metadata"]["namespace"]
        paths: dict[str, str] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "hostPath" in volume:
                paths[name] = volume["hostPath"]["path"]
                continue
            where = directory / "volumes" / name
            where.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume or "persistentVolumeClaim" in volume:
                where.chmod(0o777)  # as a kubelet makes an emptyDir: writable by the pod's (non-root) user
            paths[name] = str(where)
            files: dict[str, str] = {}
            try:
                if "configMap" in volume:
                    files = self._keyed(volume["configMap"], self._config_map(volume["configMap"]["name"], namespace))
                elif "secret" in volume:
                    files = self._keyed(volume["secret"], self._secret(volume["secret"]["secretName"], namespace))
                elif "projected" in volume:
                    files = self._projected(pod, volume["projected"], token)
                elif "downwardAPI" in volume:
                    files = self._downward(pod, volume["downwardAPI"].get("items") or [])
            except (ApiException, EnvError) as err:
                _log.warning(
                    "Volume not filled pod=%s/%s volume=%s error=%s", namespace, pod["metadata"]["name"], name, err
                )
            for rel, text in files.items():
                target = where / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        return paths

    def _config_map(self, name: str, namespace: str) -> dict[str, str]:
        return dict(call(self.core.read_namespaced_config_map, name, namespace).get("data") or {})

    def _secret(self, name: str, namespace: str) -> dict[str, str]:
        data = call(self.core.read_namespaced_secret, name, namespace).get("data") or {}
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}

    @staticmethod
    def _keyed(source: Mapping[str, Any], data: Mapping[str, str]) -> dict[str, str]:
        items = source.get("items")
        if not items:
            return dict(data)
        return {item["path"]: data[item["key"]] for item in items if item["key"] in data}

    def _downward(self, pod: Mapping[str, Any], items: list[Mapping[str, Any]]) -> dict[str, str]:
        env = resolve_env(
            pod=pod,
            container={
                "env": [{"name": i["path"], "valueFrom": {"fieldRef": i["fieldRef"]}} for i in items if "fieldRef" in i]
            },
            config_maps={},
            secrets={},
        )
        return env

    def _projected(self, pod: Mapping[str, Any], projected: Mapping[str, Any], token: str | None) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        files: dict[str, str] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source and token is not None:
                files[source["serviceAccountToken"]["path"]] = token
            elif "configMap" in source:
                files.update(self._keyed(source["configMap"], self._config_map(source["configMap"]["name"], namespace)))
            elif "secret" in source:
                files.update(self._keyed(source["secret"], self._secret(source["secret"]["name"], namespace)))
            elif "downwardAPI" in source:
                files.update(self._downward(pod, source["downwardAPI"].get("items") or []))
        return files

    def _env(self, pod: Mapping[str, Any], container: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        maps, secrets = env_sources(container)
        return resolve_env(
            pod=pod,
            container=container,
            config_maps={n: d for n in maps if (d := self._optional(self._config_map, n, namespace)) is not None},
            secrets={n: d for n in secrets if (d := self._optional(self._secret, n, namespace)) is not None},
            base=base,
        )

    def _image_launch(
        self,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        *,
        directory: Path,
        volumes: Mapping[str, str],
        in_cluster: bool,
    ) -> Launch:
        """Run the container from its image's root filesystem (``enter.py`` with a plan of this container)."""
        reference = str(container["image"])
        image = self.images[reference]
        config = ImageConfig.from_oci(image.config)
        base = {**dict(config.env), "HOSTNAME": pod["metadata"]["name"]}
        if in_cluster:  # what a kubelet sets for the `kubernetes` Service; the token is in its projected volume
            server = urllib.parse.urlsplit(self.target.server)
            base |= {"KUBERNETES_SERVICE_HOST": server.hostname or "", "KUBERNETES_SERVICE_PORT": str(server.port)}
        place = directory / "containers" / container["name"]
        plan = container_plan(
            pod=pod,
            container=container,
            image=config,
            passwd=self._passwd[reference],
            env=self._env(pod, container, base),
            volumes=volumes,
            rootfs=str(image.rootfs),
            container_dir=str(place),
        )
        place.mkdir(parents=True, exist_ok=True)
        spec = place / "spec.json"
        spec.touch(mode=0o600)  # the environment may hold a Secret's values
        spec.write_text(json.dumps(plan, indent=1))
        enter = (sys.executable, "-I", str(ENTER_SCRIPT), str(spec))
        return Launch(
            argv=list(enter),
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            cwd=directory,
            log=directory / "logs" / f"{container['name']}.log",
            join=(*enter, "--join"),
        )

    def _launch(
        self,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        *,
        directory: Path,
        base: Mapping[str, str],
        volumes: Mapping[str, str],
    ) -> Launch:
        env = self._env(pod, container, base)
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in volumes:
                host = volumes[mount["name"]]
                mounts[mount["mountPath"]] = f"{host}/{mount['subPath']}" if mount.get("subPath") else host
        # only the container's own values name container paths; the kubelet's (KUBECONFIG, HOME, PATH)
        # are host paths already, and may well lie under a mounted path such as /tmp
        env = {k: v if base.get(k) == v else substitute_paths(v, mounts=mounts) for k, v in env.items()}
        if "/tmp" in mounts and "TMPDIR" not in env:  # noqa: S108 - the container's /tmp, an emptyDir of the pod
            env["TMPDIR"] = mounts["/tmp"]  # noqa: S108
        argv = [*(container.get("command") or ["rolloutpool"]), *(container.get("args") or [])]
        argv = [substitute_paths(expand(a, env=env), mounts=mounts) for a in argv]
        if argv[0] not in self.executables:
            runnable = ", ".join(sorted(self.executables))
            raise EnvError(f"executable {argv[0]!r} is not runnable here (this kubelet runs: {runnable})")
        argv[0] = self.executables[argv[0]]
        log = directory / "logs" / f"{container['name']}.log"
        return Launch(argv=argv, env=env, cwd=directory, log=log)

    @staticmethod
    def _optional(read: Any, name: str, namespace: str) -> Any:
        try:
            return read(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

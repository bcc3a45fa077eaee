"""Pure decisions of the process kubelet: expansion, env, scheduling fit, back-off, addresses.

Every function here is pure: keyword-only inputs (plain dicts as the API server
returns them, camelCase keys), no I/O, ``now`` passed in where time matters. The
I/O side (:mod:`rolloutpool.dev.kubelet.kubelet`) fetches what these need and acts
on what they return. Pod status building lives in :mod:`.status`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "DEFAULT_IMAGE_PATTERN",
    "EnvError",
    "allocate_ip",
    "backoff_seconds",
    "container_requests",
    "env_sources",
    "expand",
    "image_matches",
    "parse_quantity",
    "resolve_env",
    "schedule_fit",
    "substitute_paths",
]

DEFAULT_IMAGE_PATTERN = r"^ghcr\.io/rolloutpool/rolloutpool(:[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$"
"""Images the kubelet runs as local processes: ours, any tag or digest."""

Pod = Mapping[str, Any]


def image_matches(image: str, *, patterns: Sequence[str]) -> bool:
    """Whether ``image`` is one the kubelet runs (any regular expression of ``patterns`` matches)."""
    return any(re.fullmatch(p, image) for p in patterns)


def expand(text: str, *, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion of a command, arg or env value.

    ``$(NAME)`` becomes the value of NAME when defined and stays as written when not;
    ``$$`` is an escaped ``$``; any other ``$`` is kept (as the kubelet does).
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "$" or i + 1 == len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            out.append(env.get(name, text[i : close + 1]))
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


class EnvError(ValueError):
    """A container's env cannot be resolved (missing ConfigMap/Secret/key, unknown field)."""


def env_sources(container: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets a container's env and envFrom read."""
    maps: set[str] = set()
    secrets: set[str] = set()
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            maps.add(source["configMapKeyRef"]["name"])
        if "secretKeyRef" in source:
            secrets.add(source["secretKeyRef"]["name"])
    for item in container.get("envFrom") or []:
        if "configMapRef" in item:
            maps.add(item["configMapRef"]["name"])
        if "secretRef" in item:
            secrets.add(item["secretRef"]["name"])
    return maps, secrets


_LABEL_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def _field(pod: Pod, path: str) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(p.get("ip", "") for p in status.get("podIPs") or []),
        "status.hostIPs": ",".join(p.get("ip", "") for p in status.get("hostIPs") or []),
    }
    if path in simple:
        return str(simple[path])
    match = _LABEL_FIELD.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise EnvError(f"unsupported fieldRef fieldPath {path!r}")


def _keyed(kind: str, source: Mapping[str, Any], store: Mapping[str, Mapping[str, str]]) -> str | None:
    name, key, optional = source["name"], source["key"], bool(source.get("optional"))
    data = store.get(name)
    if data is None or key not in data:
        if optional:
            return None
        missing = f"{kind} {name!r}" if data is None else f"key {key!r} in {kind} {name!r}"
        raise EnvError(f"{missing} not found")
    return data[key]


def resolve_env(
    *,
    pod: Pod,
    container: Mapping[str, Any],
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A container's environment as the kubelet builds it (``base`` first, then envFrom, then env).

    ``secrets`` hold decoded strings. Each ``env`` value may refer to variables defined
    before it with ``$(NAME)``. Raises :class:`EnvError` naming what is missing.
    """
    env: dict[str, str] = dict(base or {})
    env.update(_env_from(container, config_maps=config_maps, secrets=secrets))
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(item.get("value", ""), env=env)
            continue
        source = item["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = _field(pod, source["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in source:
            value = _keyed("ConfigMap", source["configMapKeyRef"], config_maps)
        elif "secretKeyRef" in source:
            value = _keyed("Secret", source["secretKeyRef"], secrets)
        elif "resourceFieldRef" in source:
            value = _resource_field(container, source["resourceFieldRef"])
        else:
            raise EnvError(f"unsupported valueFrom of env {name!r}: {sorted(source)}")
        if value is not None:
            env[name] = value
    return env


def _env_from(
    container: Mapping[str, Any],
    *,
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("envFrom") or []:
        prefix = item.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key not in item:
                continue
            ref = item[key]
            data = (config_maps if kind == "ConfigMap" else secrets).get(ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"{kind} {ref['name']!r} not found")
            env.update({prefix + k: v for k, v in data.items()})
    return env


def _resource_field(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, resource = str(ref["resource"]).partition(".")
    quantity = ((container.get("resources") or {}).get(kind) or {}).get(resource)
    if quantity is None:
        return "0"
    divisor = parse_quantity(str(ref.get("divisor", "1")))
    value = parse_quantity(str(quantity)) / (divisor or 1)
    return str(-((-value.numerator) // value.denominator))  # rounded up, as the kubelet does


def substitute_paths(text: str, *, mounts: Mapping[str, str]) -> str:
    """Map container mount paths to host directories wherever they start a path in ``text``.

    A process cannot see the container's mounts, so an emptyDir/ConfigMap/Secret/token
    volume mounted at ``/state`` becomes a per-pod directory and ``--state-path=/state/x``
    becomes ``--state-path=<pod dir>/volumes/<volume>/x``. The longest mount path wins;
    a match must end at a path boundary.
    """
    if not mounts:
        return text
    table = {m.rstrip("/") or "/": host.rstrip("/") for m, host in mounts.items()}
    alternatives = "|".join(re.escape(m) for m in sorted(table, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w./-])(" + alternatives + r")(?=/|$|[^\w.-])")
    return pattern.sub(lambda match: table[match.group(1)], text)  # one pass: host paths are never re-mapped


_SUFFIX = {
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes resource quantity (``500m``, ``2Gi``, ``1e3``) as an exact fraction."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number = Fraction(match.group(1))
    if match.group(2):
        return number * Fraction(10) ** int(match.group(2)[1:])
    return number * _SUFFIX[match.group(3) or ""]


def container_requests(pod: Pod) -> dict[str, Fraction]:
    """What a pod requests of a node: the sum over its containers (limits stand in for absent requests).

    Init containers count with their maximum, as the scheduler does.
    """
    spec = pod.get("spec") or {}

    def one(container: Mapping[str, Any]) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: parse_quantity(str(v)) for k, v in merged.items()}

    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        for k, v in one(container).items():
            total[k] = total.get(k, Fraction(0)) + v
    for container in spec.get("initContainers") or []:
        for k, v in one(container).items():
            total[k] = max(total.get(k, Fraction(0)), v)
    return total


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and not tol.get("key"):
            return True
        if tol.get("key") != taint.get("key"):
            continue
        if tol.get("operator") == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def schedule_fit(*, pod: Pod, node: Mapping[str, Any], bound: Sequence[Pod]) -> str | None:
    """Why ``pod`` does not fit ``node`` given the non-terminal pods already ``bound`` there; None if it fits.

    Checks allocatable resources (every requested resource, ``pods`` included),
    ``nodeSelector`` against the node's labels and NoSchedule/NoExecute taints against
    the pod's tolerations. Node affinity and inter-pod (anti-)affinity are not evaluated.
    """
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node(s) didn't match Pod's node selector ({key}={value})"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in {"NoSchedule", "NoExecute"} and not _tolerated(taint, spec.get("tolerations") or []):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    allocatable = {k: parse_quantity(str(v)) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    used: dict[str, Fraction] = {"pods": Fraction(len(bound))}
    for other in bound:
        for k, v in container_requests(other).items():
            used[k] = used.get(k, Fraction(0)) + v
    wanted = {**container_requests(pod), "pods": Fraction(1)}
    short = sorted(
        k for k, v in wanted.items() if v > 0 and used.get(k, Fraction(0)) + v > allocatable.get(k, Fraction(0))
    )
    if short:
        return ", ".join(f"Insufficient {k}" if k != "pods" else "Too many pods" for k in short)
    return None


def backoff_seconds(*, crashes: int, base: float, cap: float) -> float:
    """Delay before restarting a container that has exited ``crashes`` times in a row (0 -> none)."""
    if crashes <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(crashes - 1, 62)))


_FIRST_HOST, _LAST_HOST = 2, 254


def allocate_ip(*, used: Iterable[str], preferred: str | None = None, prefix: str = "127.0.0.") -> str:
    """A loopback address for a new pod: ``preferred`` when free, else the lowest free ``<prefix>x`` (x >= 2).

    x = 1 is never handed out (127.0.0.1 is the control plane's). Raises RuntimeError when all are taken.
    """
    taken = set(used)
    if preferred and preferred.startswith(prefix) and preferred not in taken and preferred != f"{prefix}1":
        return preferred
    for x in range(_FIRST_HOST, _LAST_HOST + 1):
        candidate = f"{prefix}{x}"
        if candidate not in taken:
            return candidate
    raise RuntimeError(f"no free pod address left in {prefix}{_FIRST_HOST}-{_LAST_HOST}")

"""How the process kubelet runs a container from an image: Kubernetes' rules, applied without a runtime (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rolloutpool.dev.demo import demo_pool
from rolloutpool.dev.kubelet.container import ImageConfig, container_argv, container_plan, parse_passwd, run_as
from rolloutpool.dev.kubelet.decide import EnvError
from rolloutpool.reconcile.caps import parse_spec
from rolloutpool.reconcile.children import engine_pod, router_objects

ROOT = Path(__file__).resolve().parents[1]
TMP = "/tmp"  # noqa: S108 - a path inside the container, never the host's /tmp
IMAGE = ImageConfig.from_oci(
    {
        "User": "65532:65532",
        "Env": ["PATH=/opt/rolloutpool/bin:/usr/bin:/bin", f"HOME={TMP}", "EMPTY="],
        "Entrypoint": ["rolloutpool"],
        "Cmd": ["--help"],
        "WorkingDir": TMP,
    }
)
PASSWD = parse_passwd("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\nbad:line\n")


def _pod(pod_ctx: dict[str, Any] | None = None, **container: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i", **container}]}
    if pod_ctx is not None:
        spec["securityContext"] = pod_ctx
    return {"metadata": {"name": "p", "namespace": "n"}, "spec": spec}, spec["containers"][0]


def test_the_oci_config_and_passwd_parse() -> None:
    assert IMAGE.env == (("PATH", "/opt/rolloutpool/bin:/usr/bin:/bin"), ("HOME", TMP), ("EMPTY", ""))
    assert IMAGE.user == "65532:65532"
    assert PASSWD == {"root": (0, 0), "nobody": (65534, 65534)}
    assert ImageConfig.from_oci({}) == ImageConfig()


@pytest.mark.parametrize(
    ("command", "args", "argv"),
    [
        (None, None, ["rolloutpool", "--help"]),  # the image's Entrypoint and Cmd
        (None, ["router", "--port=1"], ["rolloutpool", "router", "--port=1"]),  # args replace Cmd only
        (["python", "-V"], None, ["python", "-V"]),  # command drops the image's Cmd as well
        (["sh"], ["-c", "true"], ["sh", "-c", "true"]),
        ([], [], ["rolloutpool", "--help"]),  # empty lists count as unset
    ],
)
def test_command_and_args_follow_kubernetes_rules(
    command: list[str] | None, args: list[str] | None, argv: list[str]
) -> None:
    container = {k: v for k, v in (("command", command), ("args", args)) if v is not None}
    assert container_argv(container=container, image=IMAGE) == argv


def test_the_user_comes_from_the_container_then_the_pod_then_the_image() -> None:
    pod, container = _pod()
    assert run_as(pod=pod, container=container, image=IMAGE, passwd=PASSWD).uid == 65532
    pod, container = _pod({"runAsUser": 1000, "runAsGroup": 1001, "fsGroup": 2000, "supplementalGroups": [3, 2000]})
    user = run_as(pod=pod, container=container, image=IMAGE, passwd=PASSWD)
    assert (user.uid, user.gid, user.groups) == (1000, 1001, (3, 2000))
    pod, container = _pod({"runAsUser": 1000}, securityContext={"runAsUser": 7, "runAsGroup": 8})
    user = run_as(pod=pod, container=container, image=IMAGE, passwd=PASSWD)
    assert (user.uid, user.gid) == (7, 8)


@pytest.mark.parametrize(
    ("image_user", "uid", "gid"),
    [("", 0, 0), ("65534", 65534, 65534), ("4242", 4242, 0), ("nobody", 65534, 65534), ("nobody:7", 65534, 7)],
)
def test_the_images_user_resolves_as_runc_resolves_it(image_user: str, uid: int, gid: int) -> None:
    pod, container = _pod()
    user = run_as(pod=pod, container=container, image=ImageConfig(user=image_user), passwd=PASSWD)
    assert (user.uid, user.gid) == (uid, gid)


def test_run_as_non_root_refuses_root_and_unverifiable_users_with_the_kubelets_words() -> None:
    pod, container = _pod({"runAsNonRoot": True})
    with pytest.raises(EnvError, match="container has runAsNonRoot and image will run as root"):
        run_as(pod=pod, container=container, image=ImageConfig(user="root"), passwd=PASSWD)
    with pytest.raises(EnvError, match=r"image has non-numeric user \(builder\), cannot verify user is non-root"):
        run_as(pod=pod, container=container, image=ImageConfig(user="builder"), passwd=PASSWD)
    pod, container = _pod({"runAsNonRoot": True, "runAsUser": 0})
    with pytest.raises(EnvError, match="will run as root"):
        run_as(pod=pod, container=container, image=IMAGE, passwd=PASSWD)
    pod, container = _pod()
    with pytest.raises(EnvError, match="unable to find user builder"):
        run_as(pod=pod, container=container, image=ImageConfig(user="builder"), passwd=PASSWD)
    pod, container = _pod({"runAsNonRoot": True}, securityContext={"runAsUser": 10})
    assert run_as(pod=pod, container=container, image=ImageConfig(user="builder"), passwd=PASSWD).uid == 10


def test_the_plan_mounts_volumes_at_their_paths_and_applies_the_security_context() -> None:
    pod, container = _pod(
        command=["rolloutpool", "router", "--host=$(POD_IP)", "--state=$$(NOT)"],
        workingDir="/work",
        volumeMounts=[
            {"name": "state", "mountPath": "/var/lib/rolloutpool"},
            {"name": "config", "mountPath": "/etc/app/a.yaml", "subPath": "a.yaml", "readOnly": True},
            {"name": "gone", "mountPath": "/gone"},
        ],
        securityContext={"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
    )
    plan = container_plan(
        pod=pod,
        container=container,
        image=IMAGE,
        passwd=PASSWD,
        env={"POD_IP": "127.0.0.9", "HOME": TMP},
        volumes={"state": "/pods/p/volumes/state", "config": "/pods/p/volumes/config"},
        rootfs="/cache/k/rootfs",
        container_dir="/pods/p/containers/c",
    )
    assert plan == {
        "rootfs": "/cache/k/rootfs",
        "container_dir": "/pods/p/containers/c",
        "hostname": "p",
        "read_only": True,
        "no_new_privs": True,
        "uid": 65532,
        "gid": 65532,
        "groups": [],
        "mounts": [
            {"source": "/pods/p/volumes/state", "target": "/var/lib/rolloutpool", "read_only": False},
            {"source": "/pods/p/volumes/config/a.yaml", "target": "/etc/app/a.yaml", "read_only": True},
        ],
        "cwd": "/work",
        "env": {"POD_IP": "127.0.0.9", "HOME": TMP},
        "argv": ["rolloutpool", "router", "--host=127.0.0.9", "--state=$(NOT)"],
    }
    pod, container = _pod()
    plain = container_plan(
        pod=pod, container=container, image=IMAGE, passwd=PASSWD, env={}, volumes={}, rootfs="/r", container_dir="/c"
    )
    assert (plain["read_only"], plain["no_new_privs"], plain["cwd"]) == (False, False, TMP)
    with pytest.raises(EnvError, match="no command specified"):
        container_plan(
            pod=pod,
            container=container,
            image=ImageConfig(),
            passwd=PASSWD,
            env={},
            volumes={},
            rootfs="/r",
            container_dir="/c",
        )


def _plan(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    volumes = {v["name"]: f"/pods/{v['name']}" for v in pod["spec"].get("volumes") or []}
    return container_plan(
        pod=pod,
        container=container,
        image=IMAGE,
        passwd=PASSWD,
        env={},
        volumes=volumes,
        rootfs="/r",
        container_dir="/c",
    )


def test_every_pod_of_our_image_runs_non_root_on_a_read_only_root_with_a_writable_tmp() -> None:
    pool = demo_pool(prometheus_url="http://127.0.0.1:9")
    pool["metadata"] |= {"namespace": "default", "uid": "u"}
    spec, error = parse_spec(pool=pool)
    assert spec is not None, error
    engine = engine_pod(pool=pool, spec=spec, index=0, default_image="i")
    deployment = next(o for o in router_objects(pool=pool, spec=spec, default_image="i") if o["kind"] == "Deployment")
    router = {"metadata": {"name": "r"}, "spec": deployment["spec"]["template"]["spec"]}
    values = yaml.safe_load((ROOT / "charts" / "rolloutpool" / "values.yaml").read_text())["operator"]
    operator = {
        "metadata": {"name": "o"},
        "spec": {"securityContext": values["podSecurityContext"], "volumes": [{"name": "tmp", "emptyDir": {}}]},
    }
    operator_container = {
        "name": "operator",
        "command": ["rolloutpool", "operator"],
        "securityContext": values["securityContext"],
        "volumeMounts": [{"name": "tmp", "mountPath": TMP}],
    }
    for pod, container in (
        (engine, engine["spec"]["containers"][0]),
        (router, router["spec"]["containers"][0]),
        (operator, operator_container),
    ):
        plan = _plan(pod, container)
        assert (plan["uid"], plan["gid"], plan["read_only"], plan["no_new_privs"]) == (65532, 65532, True, True)
        assert TMP in [m["target"] for m in plan["mounts"] if not m["read_only"]], pod["metadata"]["name"]

"""The image a cluster pulls: built from the Dockerfile (``buildah bud``) and run as its pods run it.

The image is built once per machine and content (``rolloutpool.dev.image.build``; ``.ci/dev test``
builds it before pytest, so these tests reuse it). Each container starts from the image's root
filesystem the way the process kubelet starts it (``enter.py``: chroot into an overlay of the image,
volumes at their mount paths), with the pod spec the chart or the operator writes: the chart's
operator container, an engine-sim pod and the router's pod, each as uid 65532 on a read-only root.
Skipped, saying why, only where buildah cannot run (not root, not Linux, buildah or debootstrap
missing); under CI that is a failure.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from image_kit import (
    built_image,
    container_pids,
    credentials,
    get,
    loopback_ip,
    read_only_root,
    run_container,
    start_container,
)
from rolloutpool.dev.demo import demo_pool
from rolloutpool.dev.image.base import base_reference
from rolloutpool.dev.image.build import (
    ENTER_SCRIPT,
    BuiltImage,
    ImageBuildError,
    build_image,
    checkout_root,
    write_archive,
)
from rolloutpool.dev.image.buildah import Buildah
from rolloutpool.dev.image.recipe import forbidden_content
from rolloutpool.dev.localcluster.build import ensure_binaries
from rolloutpool.dev.wait import wait_until
from rolloutpool.reconcile.caps import parse_spec
from rolloutpool.reconcile.children import engine_pod, router_objects
from rolloutpool.reconcile.labels import ENGINE_PORT, ROUTER_PORT

MAX_SIZE_MB = 600  # 364 MB when written (the kubernetes client alone is 126 MB); a heavy new dependency fails here
NON_ROOT = 65532
CONTAINER_TMP = "/tmp"  # noqa: S108 - the container's working directory (an emptyDir), not the host's /tmp


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    return built_image()


def _chart_operator_pod(image: BuiltImage) -> dict[str, Any]:
    """The operator pod as ``helm template`` of the chart writes it, pointed at this build."""
    helm = ensure_binaries(log=lambda _line: None).helm
    out = subprocess.run(
        [
            str(helm),
            "template",
            "rolloutpool",
            str(checkout_root() / "charts" / "rolloutpool"),
            "--namespace=rolloutpool-system",
            f"--set=image.repository={image.repository}",
            f"--set=image.tag={image.tag}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    deployment = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    return {"metadata": {"name": "rolloutpool-operator-0", "namespace": "rolloutpool-system"}, "spec": template["spec"]}


def _pool() -> tuple[dict[str, Any], Any]:
    pool = demo_pool(prometheus_url="http://127.0.0.1:9")
    pool["metadata"] |= {"namespace": "default", "uid": "00000000-0000-0000-0000-000000000001"}
    spec, error = parse_spec(pool=pool)
    assert spec is not None, error
    return pool, spec


def test_the_operator_command_runs_as_the_charts_non_root_user_on_a_read_only_root(
    image: BuiltImage, tmp_path: Path
) -> None:
    pod = _chart_operator_pod(image)
    (operator,) = pod["spec"]["containers"]
    assert operator["image"] == image.reference
    assert operator["securityContext"]["readOnlyRootFilesystem"] is True
    help_run = run_container(
        image, pod=pod, container={**operator, "command": ["rolloutpool", "operator", "--help"]}, directory=tmp_path
    )
    assert help_run.returncode == 0, help_run.stdout
    assert "Run the RolloutPool operator" in help_run.stdout
    probe = (
        "import os, sys\n"
        "print(os.getuid(), os.getgid(), os.getcwd(), os.environ['HOME'])\n"
        "open('/tmp/writable', 'w').write('ok')\n"  # the chart's emptyDir
        "try:\n    open('/opt/rolloutpool/x', 'w')\nexcept OSError as err:\n    print('root', err.strerror)\n"
        "import rolloutpool.handlers.lifecycle, rolloutpool.router.app\n"  # the operator's and router's code loads
        "for tool in ('numpy', 'matplotlib', 'pytest', 'hypothesis', 'mypy'):\n"
        "    try:\n        __import__(tool)\n        print('has', tool)\n    except ImportError:\n        pass\n"
    )
    check = run_container(
        image, pod=pod, container={**operator, "command": ["python", "-c", probe]}, directory=tmp_path / "check"
    )
    assert check.returncode == 0, check.stdout
    lines = check.stdout.splitlines()
    assert lines[0] == f"{NON_ROOT} {NON_ROOT} /tmp /tmp", check.stdout
    assert "root Read-only file system" in lines, check.stdout
    assert not [line for line in lines if line.startswith("has ")], check.stdout


def test_an_engine_sim_and_the_router_start_from_the_image_and_answer_health(image: BuiltImage, tmp_path: Path) -> None:
    pool, spec = _pool()
    engine = engine_pod(pool=pool, spec=spec, index=0, default_image=image.reference)
    router_deployment = next(
        o for o in router_objects(pool=pool, spec=spec, default_image=image.reference) if o["kind"] == "Deployment"
    )
    router = {
        "metadata": {"name": "demo-router-0", "namespace": "default"},
        "spec": copy.deepcopy(router_deployment["spec"]["template"]["spec"]),
    }
    (router_container,) = router["spec"]["containers"]
    engine_ip, router_ip = loopback_ip(), loopback_ip()
    # the router's own args discover engines through the API server; here it is given the engine directly
    state = next(a for a in router_container["args"] if a.startswith("--state-path="))
    router_container["args"] = [
        "--host=$(POD_IP)",
        f"--port={ROUTER_PORT}",
        f"--replica=engine-0=http://{engine_ip}:{ENGINE_PORT}",
        state,
    ]
    with (
        start_container(
            image, pod=engine, container=engine["spec"]["containers"][0], directory=tmp_path / "e", pod_ip=engine_ip
        ) as engine_proc,
        start_container(
            image, pod=router, container=router_container, directory=tmp_path / "r", pod_ip=router_ip
        ) as router_proc,
    ):
        for url in (f"http://{engine_ip}:{ENGINE_PORT}/health", f"http://{router_ip}:{ROUTER_PORT}/health"):
            status = wait_until(
                partial(_status, url), what=f"{url} to answer", timeout=90, interval=0.3, ignore=(OSError,)
            )
            assert status == 200
        for proc, where, name in ((engine_proc, tmp_path / "e", "engine"), (router_proc, tmp_path / "r", "router")):
            assert proc.poll() is None, (where / f"{name}.log").read_text(errors="replace")
            (pid,) = container_pids(where)
            assert pid == proc.pid  # enter.py became the container's command: the kubelet signals it directly
            uid, gid, _groups = credentials(pid)
            assert (uid, gid) == (NON_ROOT, NON_ROOT)
            assert read_only_root(pid)
        # an exec probe joins the running container: its root, its user
        spec_file = tmp_path / "e" / "engine.json"
        check = "import os; print(os.getuid(), os.path.isdir('/opt/rolloutpool'), os.getcwd())"
        join = [sys.executable, "-I", str(ENTER_SCRIPT), str(spec_file), "--join", str(engine_proc.pid)]
        joined = subprocess.run(
            [*join, "--", "python", "-c", check], capture_output=True, text=True, timeout=60, check=False
        )
        assert joined.stdout.split() == [str(NON_ROOT), "True", CONTAINER_TMP], joined.stdout + joined.stderr
        models = json.loads(get(f"http://{router_ip}:{ROUTER_PORT}/v1/models")[1])
        assert [m["id"] for m in models["data"]] == [spec.engine.model]
        body = {"model": spec.engine.model, "prompt": "Solve the task.", "max_tokens": 4}
        request = urllib.request.Request(
            f"http://{router_ip}:{ROUTER_PORT}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-Session-ID": "rollout-1"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own http URL
            answer = json.loads(response.read())
        assert answer["usage"]["completion_tokens"] == 4, answer
    # stopped with SIGTERM: the router wrote its last snapshot into its emptyDir, as uid 65532
    snapshot = tmp_path / "r" / "volumes" / "state" / "state.json"
    assert snapshot.exists(), (tmp_path / "r" / "router.log").read_text(errors="replace")
    assert snapshot.stat().st_uid == NON_ROOT
    assert "rollout-1" in snapshot.read_text()
    assert container_pids(tmp_path) == [], "container processes left running"


def _status(url: str) -> int:
    return get(url)[0]


def _rootfs_paths(root: Path) -> list[str]:
    paths = []
    for directory, dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        paths += [os.path.normpath(os.path.join(rel, name)) for name in dirs + files]
    return paths


def test_the_image_holds_no_compiler_no_test_tools_no_plotting_libraries_and_reports_its_size(
    image: BuiltImage, record_property: Any
) -> None:
    assert forbidden_content(paths=_rootfs_paths(image.rootfs)) == []
    record_property("image_size_mb", round(image.size_bytes / 1e6))
    assert 100 < image.size_bytes / 1e6 < MAX_SIZE_MB, f"image is {image.size_bytes / 1e6:.0f} MB"
    config = image.config
    assert config["User"] == f"{NON_ROOT}:{NON_ROOT}"
    assert config["Entrypoint"] == ["rolloutpool"]
    passwd = (image.rootfs / "etc" / "passwd").read_text()
    assert re.search(rf"^rolloutpool:x:{NON_ROOT}:{NON_ROOT}:", passwd, re.MULTILINE), passwd


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile(f"blobs/{digest.replace(':', '/')}")
    assert member is not None, digest
    data = member.read()
    assert hashlib.sha256(data).hexdigest() == digest.split(":")[1], f"blob {digest} does not match its digest"
    return data


def test_an_oci_archive_of_the_image_is_what_an_air_gapped_cluster_loads(image: BuiltImage, tmp_path: Path) -> None:
    name = "registry.example.com/ml/rolloutpool:0.1.0"
    path = write_archive(image, tmp_path / "rolloutpool.oci.tar", name=name)
    with tarfile.open(path) as archive:
        assert json.loads(_blob_free(archive, "oci-layout"))["imageLayoutVersion"] == "1.0.0"
        (entry,) = json.loads(_blob_free(archive, "index.json"))["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == name
        manifest = json.loads(_blob(archive, entry["digest"]))
        config = json.loads(_blob(archive, manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            _blob(archive, layer["digest"])
    assert config["config"]["User"] == f"{NON_ROOT}:{NON_ROOT}"
    assert config["config"]["Entrypoint"] == ["rolloutpool"]
    # loaded back into a storage of its own, it is the same image
    other = Buildah(tmp_path / "other-storage")
    other.run("pull", f"oci-archive:{path}")
    loaded = json.loads(other.run("inspect", "--type", "image", name).stdout)
    assert loaded["OCIv1"]["config"]["Entrypoint"] == ["rolloutpool"]
    assert loaded["OCIv1"]["rootfs"]["diff_ids"] == config["rootfs"]["diff_ids"]


def _blob_free(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    assert member is not None, name
    return member.read()


def test_a_broken_dockerfile_step_fails_the_build_with_a_message_naming_the_step(
    image: BuiltImage, tmp_path: Path
) -> None:
    context = checkout_root()
    text = (context / "Dockerfile").read_text()
    broken = text.replace("RUN python -m pip wheel", "RUN python -m pip wheel --no-such-option", 1)
    assert broken != text, "the Dockerfile's build step changed: update this test"
    (tmp_path / "Dockerfile").write_text(broken)
    buildah = Buildah(image.directory.parent)
    with pytest.raises(ImageBuildError) as failed:
        build_image(
            buildah,
            context=context,
            dockerfile=tmp_path / "Dockerfile",
            base=base_reference(),
            reference="localhost/rolloutpool-broken:test",
            log=lambda _line: None,
        )
    message = str(failed.value)
    assert message.startswith("the image build failed at [1/2] STEP 6/6: RUN python -m pip wheel --no-such-option")
    assert "no such option: --no-such-option" in message
    assert not buildah.exists("localhost/rolloutpool-broken:test")

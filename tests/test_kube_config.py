"""How components find the API server: kubeconfig flag, in-cluster account, then $KUBECONFIG."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.config import ConfigException

from rolloutpool.kube.pods import api_client

_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.9:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t0ken}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def outside_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)


@pytest.mark.usefixtures("outside_cluster")
def test_without_in_cluster_account_kubeconfig_env_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(_KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    api = api_client()
    try:
        assert api.configuration.host == "https://127.0.0.9:6443"
    finally:
        api.close()


@pytest.mark.usefixtures("outside_cluster")
def test_without_any_configuration_the_in_cluster_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(ConfigException, match="Service host/port is not set"):
        api_client()


def test_an_explicit_kubeconfig_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "explicit"
    path.write_text(_KUBECONFIG.replace("127.0.0.9", "127.0.0.8"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    api = api_client(str(path))
    try:
        assert api.configuration.host == "https://127.0.0.8:6443"
    finally:
        api.close()

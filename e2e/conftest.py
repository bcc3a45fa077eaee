"""Fixtures that run a real control plane (etcd + kube-apiserver + controller-manager)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rolloutpool.dev.crd_install import install_crd
from rolloutpool.dev.localcluster.cluster import LocalCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "e2e" in item.nodeid.split("/")[0]:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Routers started by tests keep their default snapshots here, never in the user's ~/.local/state."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One control plane for the whole session, with the CRD installed; always stopped."""
    with LocalCluster(tmp_path_factory.mktemp("cluster"), log=lambda _msg: None) as running:
        install_crd(running)
        yield running

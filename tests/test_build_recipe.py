"""The wrapper Go module recipe for the control plane (pure parts)."""

from __future__ import annotations

import pytest

from rolloutpool.dev.localcluster.build import (
    RECIPE,
    cache_root,
    staging_modules,
    staging_version,
    version_ldflags,
    wrapper_go_mod,
)

KUBE_MOD = """module k8s.io/kubernetes

go 1.25.0

require (
\tk8s.io/api v0.0.0
\tgo.etcd.io/etcd/server/v3 v3.6.5 // indirect
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kubectl => ./staging/src/k8s.io/kubectl
)
"""


def test_staging_modules_come_from_replace_lines() -> None:
    assert staging_modules(KUBE_MOD) == ["k8s.io/api", "k8s.io/client-go", "k8s.io/kubectl"]


def test_no_staging_lines_is_an_error() -> None:
    with pytest.raises(ValueError, match="staging"):
        staging_modules("module x\n")


def test_staging_version() -> None:
    assert staging_version("v1.35.4") == "v0.35.4"
    with pytest.raises(ValueError, match="release"):
        staging_version("v2.0.0-beta")


def test_wrapper_go_mod_pins_every_staging_module() -> None:
    text = wrapper_go_mod(kubernetes_go_mod=KUBE_MOD, kubernetes_version="v1.35.4", etcd_version="v3.6.5")
    assert "go 1.25.0" in text
    assert "\tk8s.io/kubernetes v1.35.4" in text
    assert "\tgo.etcd.io/etcd/server/v3 v3.6.5" in text
    for mod in ("k8s.io/api", "k8s.io/client-go", "k8s.io/kubectl"):
        assert f"\t{mod} => {mod} v0.35.4" in text


def test_cache_root_is_outside_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("ROLLOUTPOOL_CACHE", str(tmp_path))
    assert cache_root("v1.35.4") == tmp_path / f"k8s-v1.35.4-{RECIPE}"


def test_version_is_stamped_into_the_binaries() -> None:
    flags = version_ldflags("v1.35.4")
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in flags
    assert "-X k8s.io/component-base/version.gitMinor=35" in flags
    with pytest.raises(ValueError, match="release"):
        version_ldflags("master")

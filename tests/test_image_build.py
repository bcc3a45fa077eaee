"""The image build's I/O around buildah: when it cannot run, what the cache holds, what the key reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolloutpool.dev.image import build
from rolloutpool.dev.image.build import BuiltImage, buildah_unavailable, image_cache


def test_the_reason_buildah_cannot_run_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    assert "needs root" in (buildah_unavailable() or "")
    monkeypatch.setattr(build.os, "geteuid", lambda: 0)
    monkeypatch.setattr(build.shutil, "which", lambda tool: None if tool == "debootstrap" else f"/usr/bin/{tool}")
    reason = buildah_unavailable() or ""
    assert reason.startswith("debootstrap not installed")
    assert "apt-get install debootstrap" in reason
    monkeypatch.setattr(build.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert buildah_unavailable() is None


def test_a_build_record_round_trips_and_splits_its_reference(tmp_path: Path) -> None:
    image = BuiltImage(
        reference="localhost/rolloutpool:0.1.0-0123456789ab",
        key="0123456789abcdef",
        directory=tmp_path,
        image_id="sha",
        base="localhost/rolloutpool-base:bookworm-x",
        config={"User": "65532:65532"},
        size_bytes=364_000_000,
        build_seconds=99.5,
    )
    with pytest.raises(FileNotFoundError):
        BuiltImage.load(tmp_path)
    image.save()
    assert BuiltImage.load(tmp_path) == image
    assert (image.repository, image.tag) == ("localhost/rolloutpool", "0.1.0-0123456789ab")
    assert image.rootfs == tmp_path / "rootfs"


def test_the_cache_lives_under_rolloutpool_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLOUTPOOL_CACHE", str(tmp_path))
    assert image_cache() == tmp_path / "image-bookworm-r1"


def test_the_key_reads_what_the_dockerfile_copies_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "operator" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "operator" / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "operator" / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("")
    dockerfile = "FROM x\nCOPY pyproject.toml ./\nCOPY operator/ operator/\n"
    files = dict(build._context_files(tmp_path, dockerfile))
    assert files == {"pyproject.toml": b"[project]\n", "operator/pkg/a.py": b"x = 1\n"}

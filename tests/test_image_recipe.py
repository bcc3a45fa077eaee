"""The image build's pure parts: what goes into the cache key, which step failed, what the image must not hold."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from rolloutpool.dev.image.recipe import (
    base_key,
    copied_sources,
    failed_step,
    forbidden_content,
    ignored,
    image_key,
    image_tag,
)

ROOT = Path(__file__).resolve().parents[1]

FAILED_BUILD = """\
[1/2] STEP 1/6: FROM localhost/rolloutpool-base:bookworm-7eab8e1379bf6e48 AS build
[1/2] STEP 2/6: ENV PIP_NO_CACHE_DIR=1     PIP_DISABLE_PIP_VERSION_CHECK=1
[1/2] STEP 3/6: WORKDIR /src
[1/2] STEP 4/6: COPY pyproject.toml README.md ./
[1/2] STEP 5/6: COPY operator/ operator/
[1/2] STEP 6/6: RUN python -m pip wheel --no-such-option --wheel-dir /wheels ".[operator,router]"

Usage:
  /usr/bin/python -m pip wheel [options] <requirement specifier> ...

no such option: --no-such-option
subprocess exited with status 2
subprocess exited with status 2
Error: building at STEP "RUN python -m pip wheel --no-such-option --wheel-dir /wheels ".[operator,router]"": \
exit status 2
"""


def test_the_failed_step_is_named_with_its_stage_and_buildahs_reason() -> None:
    assert failed_step(FAILED_BUILD) == (
        '[1/2] STEP 6/6: RUN python -m pip wheel --no-such-option --wheel-dir /wheels ".[operator,router]" '
        "(exit status 2)"
    )


def test_the_failed_step_falls_back_to_buildahs_error_line_then_to_the_last_lines() -> None:
    assert failed_step('Error: building at STEP "COPY nope ./": no such file') == "STEP COPY nope ./ (no such file)"
    assert failed_step("STEP 1/2: FROM scratch\nError: something else") == "STEP 1/2: FROM scratch"
    assert failed_step("a\nb\nc\nd\n") == "b | c | d"
    assert failed_step("") == "no output"


def test_the_dockerfile_copies_exactly_what_dockerignore_lets_into_the_context() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert sorted(copied_sources(dockerfile)) == ["README.md", "operator", "pyproject.toml"]
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"]
    assert sorted(allowed) == sorted(copied_sources(dockerfile))


def test_copy_sources_skip_other_stages_and_read_continuation_lines() -> None:
    text = (
        "FROM x AS a\nCOPY --chown=1:1 a.txt \\\n  b/ /dst/\nCOPY --from=a /wheels /wheels\n"
        'ADD ["c.tar", "/c"]\nRUN echo COPY nothing\n'
    )
    assert copied_sources(text) == ["a.txt", "b", "c.tar"]


LEFT_OUT = [
    "operator/rolloutpool/__pycache__/cli.cpython-311.pyc",
    "operator/rolloutpool/x.pyc",
    "operator/rolloutpool/x.pyd",
    "operator/rolloutpool.egg-info/PKG-INFO",
    "operator/.mypy_cache/3.11/x.json",
    "operator/.pytest_cache/v",
    "operator/.ruff_cache/x",
    "operator/rolloutpool/sim/fleet.cpython-311-x86_64-linux-gnu.so",
    "operator/4b36b1ff2edbc0334ee2__mypyc.cpython-311-x86_64-linux-gnu.so",
    "operator/rolloutpool/.mypyc-sources.json",
]


def test_what_dockerignore_leaves_out_is_left_out_of_the_key() -> None:
    patterns = [line[3:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("**/")]
    assert patterns
    for pattern in patterns:
        matching = [p for p in LEFT_OUT if any(fnmatch.fnmatchcase(part, pattern) for part in p.split("/"))]
        assert matching, f".dockerignore leaves out {pattern}: add an example to LEFT_OUT"
        assert [p for p in matching if not ignored(p)] == [], pattern


def test_source_files_count_in_the_key() -> None:
    assert not ignored("operator/rolloutpool/cli/__init__.py")
    assert not ignored("operator/rolloutpool/data/dashboard.json")


def test_the_image_key_changes_with_every_input_and_only_with_them() -> None:
    files = [("pyproject.toml", b"[project]"), ("operator/rolloutpool/a.py", b"x = 1\n")]
    key = image_key(base="b1", dockerfile=b"FROM x", files=files)
    assert key == image_key(base="b1", dockerfile=b"FROM x", files=list(reversed(files)))
    assert (
        len(
            {
                key,
                image_key(base="b2", dockerfile=b"FROM x", files=files),
                image_key(base="b1", dockerfile=b"FROM y", files=files),
                image_key(
                    base="b1", dockerfile=b"FROM x", files=[*files[:1], ("operator/rolloutpool/a.py", b"x = 2\n")]
                ),
                image_key(base="b1", dockerfile=b"FROM x", files=[*files, ("operator/rolloutpool/b.py", b"")]),
                image_key(base="b1", dockerfile=b"FROM x", files=[files[0], ("operator/rolloutpool/c.py", b"x = 1\n")]),
            }
        )
        == 6
    )


def test_the_base_key_follows_the_mirror_and_the_tag_names_version_and_key() -> None:
    assert base_key(mirror="http://a/debian") != base_key(mirror="http://b/debian")
    assert image_tag(version="0.1.0", key="0123456789abcdef") == "localhost/rolloutpool:0.1.0-0123456789ab"


def test_forbidden_content_finds_compilers_test_tools_plotting_libraries_and_build_leftovers() -> None:
    site = "opt/rolloutpool/lib/python3.11/site-packages"
    paths = [
        "usr/bin/python3.11",
        f"{site}/aiohttp/web.py",
        f"{site}/rolloutpool/sim/fleet.py",  # our own modules are there; only their extras are not
        "usr/bin/gcc-12",
        "usr/bin/x86_64-linux-gnu-gcc-12",
        f"{site}/_pytest/main.py",
        "opt/rolloutpool/bin/pytest",
        f"{site}/hypothesis/core.py",
        f"{site}/matplotlib/pyplot.py",
        f"{site}/numpy/core/multiarray.py",
        "wheels",
        "src/pyproject.toml",
    ]
    found = {f.kind: f.paths for f in forbidden_content(paths=paths)}
    assert found == {
        "a build leftover": ("src/pyproject.toml", "wheels"),
        "a compiler": ("usr/bin/gcc-12", "usr/bin/x86_64-linux-gnu-gcc-12"),
        "a plotting or simulation library": (f"{site}/matplotlib/pyplot.py", f"{site}/numpy/core/multiarray.py"),
        "a test tool": ("opt/rolloutpool/bin/pytest", f"{site}/_pytest/main.py", f"{site}/hypothesis/core.py"),
    }
    assert forbidden_content(paths=paths[:3]) == []

"""The ``rolloutpool`` group imports a command's module only when it runs, and names the missing extra.

Each case runs in a fresh interpreter so what one command imported cannot hide what another did;
a package "not installed" is one set to ``None`` in ``sys.modules`` (what ``import`` then refuses).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rolloutpool.cli import COMMANDS

_PROBE = """
import json, sys
for blocked in {blocked!r}:
    sys.modules[blocked] = None
from rolloutpool.cli import main
try:
    main({argv!r})
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""

TOOLS = ("rolloutpool.sim", "rolloutpool.dev", "matplotlib", "numpy")


def _run(argv: list[str], blocked: tuple[str, ...] = ()) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(argv=argv, blocked=blocked)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], result["modules"], done.stdout + done.stderr


@pytest.mark.parametrize("command", ["operator", "router", "engine-sim", "plan", "crd", "validate"])
def test_a_shipped_command_imports_none_of_the_tools(command: str) -> None:
    code, modules, output = _run([command, "--help"])
    assert code == 0, output
    loaded = [m for m in modules if any(m == t or m.startswith(t + ".") for t in TOOLS)]
    assert loaded == [], loaded


def test_help_lists_every_command_even_without_the_simulator_packages() -> None:
    code, _, output = _run(["--help"], blocked=("numpy", "matplotlib"))
    assert code == 0, output
    for name in COMMANDS:
        assert f"  {name} " in output, name
    assert "not installed: pip install 'rolloutpool[sim]'" in output


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["simulate", "--duration", "60", "--no-plots"], ("numpy",), "sim"),  # imported as the command runs
        (["simulate-caps"], ("numpy",), "sim"),  # imported with the command's module
        (["operator"], ("kopf",), "operator"),
        (["demo", "--once"], ("cryptography",), "dev"),
    ],
)
def test_a_command_without_its_extra_fails_naming_it(argv: list[str], blocked: tuple[str, ...], extra: str) -> None:
    code, _, output = _run(argv, blocked=blocked)
    assert code == 1, output
    assert f"needs the '{extra}' extra" in output, output
    assert f"pip install 'rolloutpool[{extra}]'" in output
    assert "Traceback" not in output

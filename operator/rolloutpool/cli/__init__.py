"""The ``rolloutpool`` command: one module per command in this package, imported when it runs.

Shipped in the operator image (``[operator,router]``): ``operator``, ``router``, ``engine-sim``,
``plan``, ``crd``, ``validate``. Tools: ``simulate``, ``simulate-caps``, ``simulate-compare``
(``[sim]``) and ``bench``, ``localcluster``, ``image``, ``demo`` (``[dev]``).
"""

from __future__ import annotations

import click

from rolloutpool.cli.lazy import LazyCommand, LazyGroup

__all__ = ["COMMANDS", "main"]

COMMANDS = {
    "plan": LazyCommand("rolloutpool.cli.plan:plan"),
    "crd": LazyCommand("rolloutpool.cli.crd:crd"),
    "validate": LazyCommand("rolloutpool.cli.validate:validate"),
    "operator": LazyCommand("rolloutpool.cli.operator:operator_command", extra="operator"),
    "router": LazyCommand("rolloutpool.cli.router:router_command", extra="router"),
    "engine-sim": LazyCommand("rolloutpool.cli.engine_sim:engine_sim", extra="router"),
    "simulate": LazyCommand("rolloutpool.cli.simulate:simulate", extra="sim"),
    "simulate-caps": LazyCommand("rolloutpool.cli.sim_sweeps:caps_command", extra="sim"),
    "simulate-compare": LazyCommand("rolloutpool.cli.sim_sweeps:compare_command", extra="sim"),
    "bench": LazyCommand("rolloutpool.cli.bench:bench_command", extra="dev"),
    "localcluster": LazyCommand("rolloutpool.cli.localcluster:localcluster", extra="dev"),
    "image": LazyCommand("rolloutpool.cli.image:image", extra="dev"),
    "demo": LazyCommand("rolloutpool.cli.demo:demo", extra="dev"),
}
"""Every command: its name, where it lives and the extra it needs."""


@click.group(cls=LazyGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rolloutpool")
def main() -> None:
    """RolloutPool: operator, session router and simulator for vLLM rollout fleets."""

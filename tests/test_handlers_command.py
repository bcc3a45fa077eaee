"""``rolloutpool operator``: its options, and the arguments it refuses before starting kopf."""

from __future__ import annotations

from click.testing import CliRunner

from rolloutpool.cli import main


def test_help_lists_the_scope_liveness_and_peering_options() -> None:
    result = CliRunner().invoke(main, ["operator", "--help"])
    assert result.exit_code == 0
    for option in ("--namespace", "--all-namespaces", "--liveness-port", "--standalone / --peering", "--kubeconfig"):
        assert option in result.output


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    result = CliRunner().invoke(main, ["operator", "--namespace", "a", "--all-namespaces"])
    assert result.exit_code == 2
    assert "exclude each other" in result.output


def test_a_missing_kubeconfig_file_is_refused(tmp_path) -> None:
    result = CliRunner().invoke(main, ["operator", "--kubeconfig", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist" in result.output

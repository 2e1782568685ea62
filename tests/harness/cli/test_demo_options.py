"""``fedleak demo`` passes --iterations (and --compile) to its attack: an attack without them,
or an unknown one, is a usage error before any victim process starts."""

from __future__ import annotations

from click.testing import CliRunner

from fedleak.harness.cli.main import main


def test_an_attack_without_the_demos_options_is_a_usage_error() -> None:
    runner = CliRunner()
    with runner.isolated_filesystem():
        result = runner.invoke(main, ["demo", "--attack", "imprint"])
        assert result.exit_code == 2, result.output
        assert "has no option 'iterations'" in result.output
        assert "fedleak attack" in result.output
        unknown = runner.invoke(main, ["demo", "--attack", "inverting-gradient"])
        assert unknown.exit_code == 2 and "unknown attack 'inverting-gradient'" in unknown.output
        assert "victim started" not in result.output + unknown.output


def test_compile_is_an_option_of_the_optimisation_attacks() -> None:
    runner = CliRunner()
    with runner.isolated_filesystem():
        result = runner.invoke(main, ["demo", "--attack", "kkt", "--compile"])
    assert result.exit_code == 2, result.output
    assert "attack 'kkt' has no option 'compile'" in result.output
    help_text = runner.invoke(main, ["demo", "--help"]).output
    assert "--compile / --no-compile" in help_text and "saved step" in help_text

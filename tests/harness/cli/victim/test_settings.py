"""The victim the options describe: every option of ``fedleak victim serve`` that says which
victim it is reaches its place in :class:`VictimSettings`, and the defaults are the typed
defaults (a victim from the CLI and one a sweep builds differ only where told)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from fedleak.harness.cli.victim.option_settings import victim_settings
from fedleak.harness.cli.victim.victim_options import VictimOptions, victim_options
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.release.releaser import ReleaseSettings
from fedleak.harness.victim.settings import VictimSettings
from fedleak.harness.zoo.folder_look import with_look


def options(args: list[str]) -> VictimOptions:
    """What ``victim_options`` hands a command given ``args``."""
    seen: list[VictimOptions] = []

    @click.command()
    @victim_options
    def probe(victim: VictimOptions) -> None:
        seen.append(victim)

    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_the_defaults_are_the_typed_defaults() -> None:
    assert victim_settings(options([])) == VictimSettings()


def test_every_victim_option_reaches_its_setting() -> None:
    args = ["--dataset", "imagefolder", "--split", "test", "--images", "0-3", "--shuffle",
            "--data-root", "pics", "--image-size", "16",
            "--normalization", "0.5/0.25", "--download", "-n", "2",
            "--seq-len", "12", "--tokenizer", "tok.json", "--canaries", "3",
            "--model", "mlp:width=8", "--checkpoint", __file__, "--seed", "7",
            "--device", "cuda:1", "--protocol", "fedavg", "--local-epochs", "2",
            "--local-batch-size", "1", "--lr", "0.01", "--momentum", "0.9", "--nesterov",
            "--batchnorm", "eval", "--weight-decay", "0.1", "--shuffle-batches",
            "--users", "3", "--return-buffers", "always", "--secagg-drop", "1@masked-input",
            "--defense", "clip:max-norm=1", "--defense-file", __file__, "--defense-seed", "5",
            "--allow-reveal", "--score-budget", "2", "--image-score-budget", "9",
            "--allow-audit", "--audit-budget", "4", "--max-audit-trials", "100",
            "--informed-candidates", "8", "--informed-known", "1",
            "--release-size", "6", "--release-lr", "0.2", "--release-epochs", "30",
            "--release-target-loss", "0.001", "--max-local-epochs", "5",
            "--max-local-steps", "50", "--max-lr", "1.5", "--secagg-memory-mb", "10",
            "--feature-memory-mb", "11", "--release-memory-mb", "12"]
    settings = victim_settings(options(args))
    assert settings.dataset == with_look("imagefolder", 16, "0.5/0.25") != "imagefolder"
    assert settings == VictimSettings(
        dataset=settings.dataset, split="test", images="0-3", shuffle=True, data_root="pics",
        download=True, batch_size=2, seq_len=12, tokenizer="tok.json", canaries=3,
        model="mlp:width=8", checkpoint=__file__, seed=7, device="cuda:1",
        protocol=Protocol("fedavg", 2, 1, 0.01, batchnorm="eval", momentum=0.9,
                          weight_decay=0.1, nesterov=True, shuffle=True),
        users=3, buffers="always", secagg_drops=("1@masked-input",),
        defenses=("clip:max-norm=1",), defense_file=__file__, defense_seed=5,
        reveal=True, audit=True, informed_candidates=8, informed_known=1,
        release=ReleaseSettings(size=6, lr=0.2, max_epochs=30, target_loss=0.001),
        limits=VictimLimits(score_budget=2, image_score_budget=9, max_local_epochs=5,
                            max_local_steps=50, max_learning_rate=1.5, secagg_memory_mb=10,
                            feature_memory_mb=11, release_memory_mb=12, audit_budget=4,
                            max_audit_trials=100))

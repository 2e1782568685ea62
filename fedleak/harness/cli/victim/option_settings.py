"""The victim the options describe:
:class:`~fedleak.harness.cli.victim.victim_options.VictimOptions` →
:class:`~fedleak.harness.victim.settings.VictimSettings`, here and nowhere else, or the settings a
``--settings`` file holds (victim options given beside it refused by name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from fedleak.harness.cli.victim.serving_options import serving_names
from fedleak.harness.cli.victim.victim_options import VictimOptions

if TYPE_CHECKING:
    from fedleak.harness.victim.limits import VictimLimits
    from fedleak.harness.victim.release.releaser import ReleaseSettings
    from fedleak.harness.victim.settings import VictimSettings

#: ``--settings`` itself, which names the file, beside the serving options it leaves open.
SETTINGS_OPTION = "settings_file"


def victim_settings(victim: VictimOptions) -> VictimSettings:
    """The victim ``victim``'s options describe (a bad value raises ``ValueError``)."""
    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.victim.settings import VictimSettings
    from fedleak.harness.zoo.folder_look import with_look

    data, model, federation = victim.data, victim.model, victim.federation
    return VictimSettings(
        dataset=with_look(data.dataset, data.image_size, data.normalization),
        split=data.split, images=data.images, shuffle=data.shuffle, data_root=data.data_root,
        download=data.download, batch_size=data.batch_size,
        seq_len=victim.text.seq_len, tokenizer=victim.text.tokenizer,
        canaries=victim.text.canaries,
        model=model.model, checkpoint=model.checkpoint, seed=model.seed, device=model.device,
        protocol=Protocol.from_options(victim.protocol.values()),
        users=federation.users, buffers=federation.return_buffers,
        secagg_drops=tuple(federation.secagg_drop),
        defenses=tuple(victim.defenses.defense_specs),
        defense_file=victim.defenses.defense_file, defense_seed=victim.defenses.defense_seed,
        reveal=victim.scoring.allow_reveal, audit=victim.audit.allow_audit,
        informed_candidates=victim.audit.informed_candidates,
        informed_known=victim.audit.informed_known,
        release=release_settings(victim), limits=victim_limits(victim),
    )


def release_settings(victim: VictimOptions) -> ReleaseSettings:
    """The model release the options describe."""
    from fedleak.harness.victim.release.releaser import ReleaseSettings

    release = victim.release
    return ReleaseSettings(size=release.release_size, lr=release.release_lr,
                           max_epochs=release.release_epochs,
                           target_loss=release.release_target_loss)


def victim_limits(victim: VictimOptions) -> VictimLimits:
    """The caps on what a server may ask, how often Score answers and what the victim keeps."""
    from fedleak.harness.victim.limits import VictimLimits

    scoring, audit, requests, memory = (victim.scoring, victim.audit, victim.requests,
                                        victim.memory)
    return VictimLimits(
        score_budget=scoring.score_budget, image_score_budget=scoring.image_score_budget,
        max_local_epochs=requests.max_local_epochs, max_local_steps=requests.max_local_steps,
        max_learning_rate=requests.max_lr, secagg_memory_mb=memory.secagg_memory_mb,
        feature_memory_mb=memory.feature_memory_mb, release_memory_mb=memory.release_memory_mb,
        audit_budget=audit.audit_budget, max_audit_trials=audit.max_audit_trials)


def settings_file(ctx: click.Context, path: str) -> VictimSettings:
    """Settings from ``--settings``; victim options given beside it are refused by name."""
    from fedleak.harness.victim.settings import VictimSettings

    open_ = serving_names() | {SETTINGS_OPTION}
    given = [param for param in ctx.command.params if param.name not in open_
             and ctx.get_parameter_source(param.name or "") in (
                 click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)]
    if given:
        flags = ", ".join(sorted(max(param.opts, key=len) for param in given))
        raise click.UsageError(f"--settings describes the whole victim; drop {flags} or put "
                               "them into the settings file")
    return VictimSettings.load(path)

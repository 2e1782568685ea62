"""``fedleak sweep`` and ``fedleak report``: a grid of defense settings to a report a person reads.

    fedleak sweep --preset quick                 # the bundled default grid
    fedleak sweep my-grid.toml --jobs 2          # a spec of your own, two points at a time
    fedleak report runs/sweep-quick --open       # charts, image grids, CSV, one HTML page

Registered on the ``fedleak`` group by :mod:`fedleak.harness.cli.main`.
"""

from __future__ import annotations

import sys
import webbrowser
from pathlib import Path
from typing import Any

import click

from fedleak.harness.cli.options import TokenOptions, token_options


class PresetOption(click.Option):
    """``--preset``: its help lists the presets of the preset folder with their one-line
    descriptions (:func:`~fedleak.harness.sweep.grid.spec.preset_descriptions`), read when
    the help is shown, so a toml added there is listed without a change here."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from fedleak.harness.sweep.grid.spec import SpecError, preset_descriptions

        try:
            listed = "; ".join(f"{name} ({about})" if about else name
                               for name, about in preset_descriptions().items())
        except SpecError as err:
            listed = str(err)
        self.help = f"Run a bundled spec instead of SPEC.toml: {listed}."
        return super().get_help_record(ctx)


@click.command()
@click.argument("spec_file", metavar="[SPEC.toml]", required=False,
                type=click.Path(dir_okay=False, exists=True))
@click.option("--preset", default=None, metavar="NAME", cls=PresetOption,
              help="Run a bundled spec instead of SPEC.toml.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder holding results.sqlite and every picture "
                   "(default runs/sweep-NAME). Re-running into it skips finished work.")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1),
              help="Points measured in parallel, each with its own victim processes.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="Torch threads per job, victims included (default: cores / jobs).")
@click.option("--pack-points", default=1, show_default=True, type=click.IntRange(1),
              metavar="K",
              help="Attack up to K points that differ only in their defenses as one packed "
                   "computation (their victims side by side, each round of all of them in one "
                   "batch: one GPU kept busy). Each point keeps the result it gets alone.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu",
              show_default=True,
              help="Where attacks run without --ray (with --ray: [sweep.resources] num_gpus).")
@click.option("--victim", "victims", multiple=True, metavar="HOST:PORT",
              help="Measure victims you already run instead of starting them (repeatable): "
                   "one point per attack and victim; the defense is whatever that victim "
                   "runs, and utility training talks to it too.")
@token_options
@click.option("--report/--no-report", default=True, show_default=True,
              help="Write the report when the sweep ends.")
@click.option("--list", "list_only", is_flag=True,
              help="Print the grid's points and what the store holds, then exit.")
@click.option("--print-spec", is_flag=True, help="Print the spec's TOML and exit.")
@click.option("--quiet", is_flag=True, help="No progress bars (one line per point).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None,
              metavar="[ADDRESS]",
              help="Run each point as a Ray task (pip install 'fedleak[ray]'): --ray alone "
                   "starts a local Ray, --ray auto joins the running cluster, --ray HOST:PORT "
                   "that one. Resources per point: [sweep.resources] in the spec.")
@click.option("--max-points", default=None, type=click.IntRange(1), metavar="N",
              help="The most points the grid may have (default 10,000): a larger grid is "
                   "refused before any point is built.")
@click.option("--ray-retries", default=2, show_default=True, type=click.IntRange(0),
              help="With --ray: re-runs of a point whose worker process or node died, before "
                   "it is recorded as failed.")
def sweep(spec_file: str | None, preset: str | None, out: str | None, jobs: int,
          threads: int | None, pack_points: int, device: str, victims: tuple[str, ...],
          tokens: TokenOptions, report: bool, list_only: bool, print_spec: bool, quiet: bool,
          ray_address: str | None, max_points: int | None, ray_retries: int) -> None:
    """Measure a grid of defense settings: attack leakage, utility and ε per point.

    Every finished measurement is committed to RUN/results.sqlite as it completes; killing
    the sweep loses nothing already measured and running it again skips what is done.
    """
    from fedleak.harness.sweep.grid.spec import SpecError, load_preset, load_spec, preset_names
    from fedleak.harness.sweep.results import load_results, summary_table
    from fedleak.harness.sweep.runner import SweepOptions, default_run_dir, run_sweep

    try:
        if bool(spec_file) == bool(preset):
            raise click.UsageError("give SPEC.toml or --preset NAME (presets: "
                                   f"{', '.join(preset_names())})")
        spec = (load_preset(preset, max_points) if preset
                else load_spec(str(spec_file), max_points))
    except SpecError as err:
        raise click.UsageError(str(err)) from None
    if print_spec:
        click.echo(spec.source, nl=False)
        return
    run_dir = Path(out) if out else default_run_dir(spec)
    points = spec.points(victims)
    if list_only:
        _list_points(points, run_dir)
        return
    if device == "cuda" and ray_address is None:
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError("--device cuda: CUDA is not available on this machine; use "
                                   "--device cpu, or --ray with num_gpus in [sweep.resources]")
    where = (f"Ray at {ray_address or 'a local cluster'}"
             if ray_address is not None else f"{jobs} job(s)")
    click.echo(f"sweep {spec.name}: {len(points)} point(s) into {run_dir} ({where})")
    token, score_token = tokens.read()
    ray = None
    if ray_address is not None:
        from fedleak.harness.sweep.ray_backend import RayOptions, import_ray

        try:
            import_ray()
        except RuntimeError as err:
            raise click.UsageError(str(err)) from None
        ray = RayOptions(address=ray_address or None, retries=ray_retries)
    options = SweepOptions(jobs=jobs, threads=threads, victims=victims,
                           token=token, score_token=score_token,
                           show_progress=not quiet, ray=ray,
                           pack_points=pack_points, device=device)
    try:
        outcome = run_sweep(spec, run_dir, options, echo=click.echo)
    except RuntimeError as err:  # RayUnavailable: no cluster at the address
        raise click.ClickException(str(err)) from None
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: finished measurements are kept in {run_dir}; run the "
                   "same command again to continue", err=True)
        sys.exit(130)
    click.echo("")
    click.echo(summary_table(load_results(run_dir)))
    click.echo(f"\n{len(outcome.measured)} point(s) measured, {outcome.skipped} already done, "
               f"{len(outcome.failed)} failed, in {outcome.wall_time_s:.0f} s")
    for point_id, label, error in outcome.failed:
        click.echo(f"failed {label} [{point_id}]: {error}", err=True)
    if report:
        from fedleak.harness.sweep.report.folder import write_report

        click.echo(f"report: {write_report(run_dir)}")
    if outcome.failed:
        sys.exit(1)


def _list_points(points: list[Any], run_dir: Path) -> None:
    from fedleak.harness.sweep.store import STORE_NAME, ResultStore

    store = ResultStore(run_dir / STORE_NAME) if (run_dir / STORE_NAME).exists() else None
    for point in points:
        held = [k for k in ("attack", "utility") if store and store.done(point.point_id, k)]
        click.echo(f"{point.point_id}  {point.label:<36}  {' | '.join(point.defenses) or '-':<50}"
                   f"  done: {', '.join(held) or '-'}")
    if store:
        store.close()


@click.command()
@click.argument("run", type=click.Path(exists=True))
@click.option("--open", "open_page", is_flag=True, help="Open the page in a web browser.")
def report(run: str, open_page: bool) -> None:
    """Write RUN/report.html: privacy–utility charts, image grids and a CSV of a sweep.

    RUN is a sweep's run folder (or its results.sqlite).
    """
    from fedleak.harness.sweep.report.folder import write_report

    run_dir = Path(run)
    if run_dir.is_file():
        run_dir = run_dir.parent
    try:
        page = write_report(run_dir)
    except FileNotFoundError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"report: {page}")
    click.echo(f"csv:    {page.parent / 'report' / 'results.csv'}")
    if open_page and not webbrowser.open(page.resolve().as_uri()):
        click.echo("no web browser could be started here (a headless machine?): open the "
                   "page above yourself", err=True)

"""`fecomlite sweep`, `fecomlite model fit` and `fecomlite model predict`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fecomlite.analysis.units import scaled
from fecomlite.model.cache import MemoryHierarchy, cpu_hierarchy
from fecomlite.model.features import FeatureError, StepFeatures, training_step
from fecomlite.model.network import (
    ConfigError,
    NetworkConfig,
    layers_from_summary,
    read_summary,
    training_of,
)
from fecomlite.model.sweep import (
    CONFIG_KIND,
    CPU_TIME,
    DEFAULT_GRID,
    FRAMEWORKS,
    MODEL_RESULT,
    PROCESS_DOMAIN,
    TINY_GRID,
    SweepGrid,
    default_domain,
    default_threads,
    feature_columns,
    grid_from_mapping,
    latest_sweep_id,
    load_sweep,
    measured_columns,
    on_cpu_time,
    parse_list,
    read_grid_file,
)

if TYPE_CHECKING:  # the fit, the prediction (numpy) and the store are imported where used
    from fecomlite.model.duration import Minimum, Planned
    from fecomlite.model.fit import EnergyModels, LinearFit
    from fecomlite.model.power_law import PowerLawFit
    from fecomlite.model.predict import Prediction
    from fecomlite.store import Store

# piped output keeps whole tables (rich would otherwise fit them into 80 columns)
console = Console(width=None if sys.stdout.isatty() else 1000)
errors = Console(stderr=True)

HomeOption = Annotated[
    Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    errors.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


# -- fecomlite sweep ------------------------------------------------------------------------------


def _print_sweep(
    result: Any, hierarchy: MemoryHierarchy, minimum: Minimum | None, store: Path
) -> None:
    """The sweep's table, its warnings, where it is stored and what to do next."""
    rows = result.table["rows"]
    console.print(_config_table(rows, hierarchy, result.table["domains"]))
    _warn_too_short(rows, minimum)
    console.print(f"attribution method, the same for every configuration: "
                  f"{result.table['attribution_method']}", highlight=False)
    for row in rows:
        for key, check in row.items():
            if key.startswith("power_check_") and check.startswith("implied"):
                console.print(f"[yellow]power check[/] {row['key']} "
                              f"{key.removeprefix('power_check_')}: {check}", highlight=False)
    console.print(f"sweep [bold]{result.sweep_id}[/] ({result.status}) stored in "
                  f"{store}; table: {result.csv_path}")
    console.print(f"fit the model: `fecomlite model fit --sweep {result.sweep_id}`")


def _grid_from_options(
    grid_file: Path | None, tiny: bool, options: dict[str, str | None], epochs: int | None
) -> tuple[SweepGrid, bool]:
    """The grid the options describe (a grid file over the default or tiny grid, then the
    command line's lists), and whether its samples were fixed by the user (then never scaled)."""
    fixed = tiny or options.get("dataset_sizes") is not None
    grid = TINY_GRID if tiny else DEFAULT_GRID
    if grid_file:
        from_file = read_grid_file(grid_file)
        grid = grid_from_mapping(from_file, grid)
        fixed = fixed or any(k.replace("-", "_") == "dataset_sizes" for k in from_file)
    changes: dict[str, Any] = {k: parse_list(v) for k, v in options.items() if v}
    if epochs is not None:
        changes["epochs"] = epochs
    return grid_from_mapping(changes, grid), fixed


def sweep_command(
    grid_file: Annotated[
        Path | None, typer.Option("--grid", help="A TOML or JSON grid file (SweepGrid's keys).")
    ] = None,
    tiny: Annotated[bool, typer.Option(help="Start from the 2-configuration CI grid.")] = False,
    widths: Annotated[str | None, typer.Option(help="Widest hidden layer, e.g. 16,64,256.")] = None,
    depths: Annotated[str | None, typer.Option(help="Hidden layers, e.g. 1,3.")] = None,
    shapes: Annotated[
        str | None, typer.Option(help="rectangle, funnel, exponential, wide_first.")
    ] = None,
    batch_sizes: Annotated[str | None, typer.Option(help="e.g. 32,256.")] = None,
    dataset_sizes: Annotated[str | None, typer.Option(help="Training samples, e.g. 8192.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs per configuration.")] = None,
    framework: Annotated[str, typer.Option(help="keras or torch.")] = "keras",
    repeat: Annotated[int, typer.Option(min=1, help="Repetitions per configuration.")] = 2,
    idle: Annotated[float, typer.Option(help="Idle baseline per configuration, s.")] = 1.0,
    tail: Annotated[float, typer.Option(help="Sampling after each repetition, s.")] = 0.5,
    gate: Annotated[
        bool, typer.Option("--gate/--no-gate", help="Wait for stable power before each rep.")
    ] = True,
    gate_max_wait: Annotated[float, typer.Option(help="Longest gate wait, s.")] = 5.0,
    csv_path: Annotated[
        Path | None, typer.Option("--csv", help="Where the table goes (.fecomlite/sweeps/).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="List the configurations and their features; run nothing.")
    ] = False,
    threads: Annotated[
        int | None, typer.Option(min=1, help=(
            "The program's intra- and inter-op threads (torch.set_num_threads, TensorFlow's "
            f"threading), recorded as the hyperparameter `threads`. Default: every usable CPU "
            f"but one, at least 1 (here {default_threads()})."))
    ] = None,
    min_training: Annotated[
        float | None, typer.Option(min=0, help=(
            "Shortest training the sensors resolve, s. Default: 20 periods of the coarsest "
            "energy sensor, at least 1 s (2 s with 0.1 s sensors). 0: no check."))
    ] = None,
    home: HomeOption = None,
) -> None:
    """Train a grid of small fully connected networks, each as a measured run, into one table.

    Each configuration is one fecomlite run of fecomlite/model/fc_program.py at project level:
    an idle baseline, then per repetition a stability gate (10 samples, at most --gate-max-wait),
    the program, and a tail. Its energy and time are the training region's, without start-up.

    Trainings too short for the sensors: unless the samples are fixed (--dataset-sizes, a grid
    file's dataset_sizes, --tiny), a pilot times each configuration's CPU seconds a step first
    and doubles the samples of each that would train under 1.5 × --min-training.
    Configurations measured under it are named after the sweep either way.
    """
    from fecomlite.runner.settings import RunSettings
    from fecomlite.runner.sweep import run_sweep
    from fecomlite.server.client import ServerError, ensure_server
    from fecomlite.store import default_home

    options = {"widths": widths, "depths": depths, "shapes": shapes, "batch_sizes": batch_sizes,
               "dataset_sizes": dataset_sizes}
    try:
        grid, fixed = _grid_from_options(grid_file, tiny, options, epochs)
        if framework not in FRAMEWORKS:
            raise ConfigError(f"framework must be one of {', '.join(FRAMEWORKS)}")
        configs = grid.configurations()
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    hierarchy = cpu_hierarchy()
    if dry_run:
        console.print(_config_table([feature_columns(c, hierarchy) for c in configs], hierarchy))
        return
    home = (home or default_home()).resolve()
    settings = RunSettings(level="project", repeat=repeat, idle_s=idle, tail_s=tail, gate=gate,
                           gate_max_wait_s=gate_max_wait, gate_window=10, pause_s=(0.2, 0.5))
    threads = threads or default_threads()
    try:
        client = ensure_server(home)
    except ServerError as exc:
        raise _fail(str(exc), 1) from exc
    minimum = _minimum(client, min_training)
    try:
        planned = _plan(configs, framework, threads, minimum, fixed)
    except ConfigError as exc:
        raise _fail(str(exc), 1) from exc
    console.print(f"{len(configs)} configurations × {repeat} repetitions, {framework}, "
                  f"{threads} thread{'s' if threads > 1 else ''}; measurement server {client.url}",
                  highlight=False)

    def progress(i: int, n: int, config: NetworkConfig) -> None:
        console.print(f"[{i + 1}/{n}] {config.key}", highlight=False)

    result = run_sweep(client, grid, settings, home=home, framework=framework,
                       csv_path=csv_path, on_config=progress, threads=threads, planned=planned,
                       minimum=minimum)
    _print_sweep(result, hierarchy, minimum, client.store_path)
    if result.status != "finished":
        raise typer.Exit(130)


def _minimum(client: Any, seconds: float | None) -> Minimum | None:
    """The shortest training the server's sensors resolve, or the user's (0: no check)."""
    from fecomlite.model.duration import Minimum, minimum_training

    if seconds is not None:
        return Minimum(seconds, "given by --min-training") if seconds > 0 else None
    return minimum_training(client.status().get("sensors") or [])


def _plan(configs: list[NetworkConfig], framework: str, threads: int, minimum: Minimum | None,
          fixed: bool) -> list[Planned] | None:
    """The configurations as the sweep runs them: where the samples are not fixed, a pilot
    times each and the short ones get their samples doubled until they last the minimum."""
    from fecomlite.model.duration import pilot, plan

    if minimum is None or fixed:
        return None
    console.print(f"minimum training {minimum.seconds:.3g} s ({minimum.reason}); timing each "
                  "configuration first (pilot)", highlight=False, soft_wrap=True)
    planned = plan(configs, pilot(configs, framework, threads), minimum, scale=True)
    for p in planned:
        if p.scaled_up:
            console.print(f"  {p.config.key}: samples {p.grid_samples:,} → "
                          f"{p.config.dataset_size:,} (~{p.expected_s:.2g} s of training)",
                          highlight=False)
    return planned


def _warn_too_short(rows: list[dict[str, Any]], minimum: Minimum | None) -> None:
    short = [r for r in rows if r.get("too_short")]
    if minimum is None or not short:
        return
    names = ", ".join(f"{r['key']} ({r['time_s']:.2g} s)" for r in short)
    console.print(f"[yellow]too short for the sensors[/] (under {minimum.seconds:.3g} s, "
                  f"{escape(minimum.reason)}): {names}. Their energies are uncertain and a model "
                  "fitted on them predicts poorly: give more --dataset-sizes or --epochs, or "
                  "leave the samples unset so the sweep scales them.", highlight=False,
                  soft_wrap=True)


def _config_table(
    rows: list[dict[str, Any]], hierarchy: MemoryHierarchy, domains: dict[str, Any] | None = None
) -> Table:
    measured = any("time_s" in r for r in rows)
    title = f"cache levels: {_levels(hierarchy)}"
    domain = default_domain(domains)[0] if domains else "all"
    if domains:
        meta = [m for d, m in domains.items() if d == domain or (domain == "all" and m["additive"])]
        label = ", ".join(sorted({m["provenance"] + (f" ({m['model']})" if m["model"] else "")
                                  for m in meta}))
        title += f"\nenergy above idle of the training, domain {domain}: {label}"
    table = Table(title=title, title_justify="left")
    for name in ("configuration", "layers", "params", "FLOPs/step", "bytes/step",
                 "working set", "level"):
        table.add_column(name, justify="left" if name in ("configuration", "layers") else "right")
    if measured:
        for name in ("time", "energy", "pJ/FLOP", "status"):
            table.add_column(name, justify="right")
    for r in rows:
        cells = [r["key"], r["hidden_widths"], f"{r['params']:,}", f"{r['flops_per_step']:.3g}",
                 scaled(r["bytes_per_step"], "B"), scaled(r["max_working_set_bytes"], "B"),
                 r["working_set_level"]]
        if measured:
            energy = r.get(f"energy_J_{domain}")
            flops = r["flops_per_step"] * r["steps"]
            cells += [scaled(r.get("time_s"), "s"), scaled(energy, "J"),
                      f"{energy / flops * 1e12:.3g}" if energy is not None else "–",
                      r.get("status", "")]
        table.add_row(*cells)
    return table


def _levels(hierarchy: MemoryHierarchy) -> str:
    return ", ".join(f"{name} {scaled(size, 'B')}" for name, size in hierarchy.breakpoints())


# -- fecomlite model fit / predict ----------------------------------------------------------------

model_app = typer.Typer(
    help="Fit and use the energy model: energy from FLOPs, bytes by cache level and time.",
    no_args_is_help=True,
)


@model_app.command("fit")
def fit_command(
    runs: Annotated[
        list[int] | None, typer.Argument(help="Sweep-config runs to fit on (else --sweep).")
    ] = None,
    sweep: Annotated[int | None, typer.Option(help="A sweep's id (default: the latest).")] = None,
    domain: Annotated[
        str, typer.Option(help="auto, all, or one: cpu-process, cpu-package, dram, gpu:0, ...")
    ] = "auto",
    target: Annotated[str, typer.Option(help="above-idle, or total (idle power × time too).")] = (
        "above-idle"),
    weighting: Annotated[str, typer.Option(help="relative or absolute errors.")] = "relative",
    folds: Annotated[
        int | None, typer.Option(min=2, help="Cross-validation folds (default 5).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the model here (JSON).")] = None,
    home: HomeOption = None,
) -> None:
    """Fit the memory-aware model and the naive ones on a sweep (or runs) and compare them."""
    from fecomlite.model.fit import DEFAULT_FOLDS, TARGETS, WEIGHTINGS, FitError, fit_models
    from fecomlite.store import Store, StoreError, default_home

    folds = DEFAULT_FOLDS if folds is None else folds
    if target not in TARGETS or weighting not in WEIGHTINGS:
        raise _fail(f"target is one of {TARGETS}, weighting one of {WEIGHTINGS}")
    if runs and sweep is not None:
        raise _fail("give RUNS or --sweep, not both")
    store_path = (home or default_home()).resolve() / "store.sqlite"
    try:
        with Store(store_path, create=False) as store:
            if runs:
                rows, hierarchy, domains, source = _rows_of_runs(store, runs)
            else:
                sweep_id = sweep if sweep is not None else latest_sweep_id(store)
                table = load_sweep(store, sweep_id)
                rows, hierarchy, domains = table["rows"], table["hierarchy"], table["domains"]
                rows = _with_repetitions(store, rows)
                source = {"sweep_id": sweep_id, "framework": table["framework"],
                          "threads": table.get("threads"),  # None: a sweep from before them
                          "attribution_method": table.get("attribution_method")}
            if domain == "auto":
                domain, why = default_domain(domains)
                console.print(f"energy domain [bold]{domain}[/]: {why}", highlight=False)
            column = f"energy_J_{domain}"
            usable = [r for r in rows if r.get(column) is not None]
            source["runs"] = [r["run_id"] for r in usable]
            source["skipped"] = [r["key"] for r in rows if r.get(column) is None]
            if source["skipped"]:
                console.print(f"[yellow]left out[/] (no {domain} energy above its uncertainty): "
                              f"{', '.join(source['skipped'])}", highlight=False)
            on_cpu = on_cpu_time(usable) if (
                domain == PROCESS_DOMAIN and target == "above-idle") else None
            if on_cpu is not None:
                usable, source["time"] = on_cpu, "cpu"
                console.print(f"time: {CPU_TIME}", highlight=False, soft_wrap=True)
            models = fit_models(usable, hierarchy, domains, target=target, domain=domain,
                                weighting=weighting, folds=folds, source=source)
            if not runs:
                store.put_result(source["sweep_id"], MODEL_RESULT, models.to_json())
    except (StoreError, ConfigError, FitError) as exc:
        raise _fail(str(exc)) from exc
    if out:
        out.write_text(json.dumps(models.to_json(), indent=1), encoding="utf-8")
    _print_fit(models)
    where = f"sweep {source['sweep_id']} (result {MODEL_RESULT!r})" if not runs else None
    saved = ", ".join(str(p) for p in (where, out) if p)
    if saved:
        console.print(f"saved: {saved}")
    elif runs:
        console.print("[yellow]not saved[/]: give --out FILE to keep a model fitted on runs")


def _with_repetitions(store: Store, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A sweep's rows with their repetitions (`reps_*`) and CPU time, read again from its runs
    where it was stored before they were kept; a row whose run is not in the store stays as it
    is."""
    from fecomlite.store import StoreError

    if any("reps_time_s" in r and "cpu_s" in r for r in rows):
        return rows
    out = []
    for row in rows:
        try:
            measured = measured_columns(store, int(row["run_id"]))[0] if row.get(
                "time_s") is not None else {}
        except (StoreError, KeyError, TypeError, ValueError):
            measured = {}
        out.append({**row, **measured} if "reps_time_s" in measured or "cpu_s" in measured
                   else row)
    return out


def _rows_of_runs(
    store: Store, run_ids: list[int]
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Sweep rows rebuilt from sweep-config runs, on their sweep's cache hierarchy (this
    machine's when the runs come from several sweeps)."""
    parents = {store.run(run_id)["parent_id"] for run_id in run_ids}
    table = store.result(parents.pop(), "sweep") if len(parents) == 1 else None
    if table is not None:
        hierarchy = MemoryHierarchy.from_json(table["hierarchy"])
        note = f"the cache levels of sweep {table['sweep_id']}"
    else:
        hierarchy, note = cpu_hierarchy(), "this machine's CPU cache levels"
    rows: list[dict[str, Any]] = []
    domains: dict[str, Any] = {}
    for run_id in run_ids:
        run = store.run(run_id)
        network = (run["settings"] or {}).get("network")
        if run["kind"] != CONFIG_KIND or network is None:
            raise ConfigError(f"run {run_id} ({run['kind']}) carries no network configuration; "
                              "fit on runs of `fecomlite sweep`")
        if run["status"] != "finished":
            raise ConfigError(f"run {run_id} is {run['status']}, not finished")
        measured, found = measured_columns(store, run_id)
        if "time_s" not in measured:
            raise ConfigError(f"run {run_id}: {measured['status']}")
        rows.append({**feature_columns(NetworkConfig.from_json(network), hierarchy),
                     **measured, "run_id": run_id})
        domains.update(found)
    source = {"runs": run_ids, "hierarchy": note}
    return rows, hierarchy.to_json(), domains, source


_UNITS = {"flops": ("pJ/FLOP", 1e12), "time_s": ("W", 1.0), "steps": ("ms/step", 1e3),
          "params_steps": ("pJ/(param·step)", 1e12)}


def _unit(feature: str, fit: LinearFit) -> tuple[str, float]:
    if fit.target == "time_s":
        return {"flops": ("ps/FLOP", 1e12), "steps": ("ms/step", 1e3),
                "fixed": ("ms/run", 1e3)}.get(feature, ("ps/byte", 1e12))
    return _UNITS.get(feature, ("pJ/byte", 1e12))


def _print_fit(models: EnergyModels) -> None:
    from fecomlite.model.fit import TIME_MODEL_NOTE
    from fecomlite.model.identify import sentence
    from fecomlite.model.power_law import PowerLawFit

    p = models.provenance
    console.print(f"fitted on [bold]{escape(p['label'])}[/] energy, {models.target}, domain "
                  f"{models.domain}, {models.configurations} configurations"
                  + (f" ({models.memory_aware.n} repetitions, each a row)"
                     if models.memory_aware.n != models.configurations else ""), highlight=False)
    if models.left_out:
        console.print(f"[yellow]note:[/] {escape(models.left_out)}", highlight=False,
                      soft_wrap=True)
    for info in models.load.values():
        console.print(f"load: {escape(info['text'])}", highlight=False, soft_wrap=True)
    check = models.identification
    for name, fit in models.fits.items():
        if name == "memory_aware" and not check.get("identified", False):
            continue  # its per-level costs are not costs: the time/FLOP model stands for it
        if isinstance(fit, PowerLawFit):
            _print_power_law(fit)
            continue
        cv = (f"{_percent(fit.cv_rel_rmse)} ({fit.cv_folds}-fold)" if math.isfinite(fit.cv_rel_rmse)
              else f"none: no fold leaves more than {len(fit.features)} configurations to fit")
        table = Table(title=f"{name}: R² {fit.r2:.3f}, cross-validated error {cv}, residual σ "
                      f"{_spread(fit)}", title_justify="left")
        for column in ("feature", "coefficient", "± std. error", "unit"):
            table.add_column(column, justify="left" if column in ("feature", "unit") else "right")
        for i, feature in enumerate(fit.features):
            unit, factor = _unit(feature, fit)
            table.add_row(feature, f"{fit.coef[i] * factor:.4g}",
                          f"{fit.std_errors[i] * factor:.2g}", unit)
        for feature in fit.dropped:
            table.add_row(feature, "–", "–", "no configuration reached it")
        for feature in fit.omitted:
            table.add_row(feature, "–", "–", "left out: too few configurations, a multiple "
                          "of another term's column, or a smaller model predicts held-out ones "
                          "better")
        console.print(table)
    if not check.get("identified", False):
        console.print(f"[yellow]note:[/] {escape(sentence(check))}", highlight=False,
                      soft_wrap=True)
    _print_time_models(models)
    compare = Table(title="the energy models ranked by out-of-sample (cross-validated) error; "
                    "predictions use the first", title_justify="left")
    for column in ("rank", "model", "cross-validated error", "R² (in-sample)"):
        compare.add_column(column)
    for row in models.comparison():
        compare.add_row(str(row["rank"]), row["model"], _percent(row["cv_rel_rmse"]),
                        f"{row['r2']:.3f}")
    console.print(compare)
    if models.time_proportional:
        console.print(f"[yellow]note:[/] {TIME_MODEL_NOTE}", highlight=False, soft_wrap=True)
    worst = sorted(models.points, key=lambda pt: -abs(pt["fitted_J"] / pt["measured_J"] - 1)
                   if pt["measured_J"] else 0)[:3]
    for pt in worst:
        console.print(f"largest residual: {pt['key']}: measured {scaled(pt['measured_J'], 'J')}, "
                      f"fitted {scaled(pt['fitted_J'], 'J')}", highlight=False)


def _print_power_law(fit: PowerLawFit) -> None:
    """The power-law time model: its law, exponents with standard errors, and errors."""
    table = Table(title=f"time (power law): {fit.formula()}; R² {fit.r2:.3f}, cross-validated "
                  f"error {_percent(fit.cv_rel_rmse)} ({fit.cv_folds}-fold), residual σ "
                  f"{_spread(fit)} on the log scale", title_justify="left")
    for column in ("term", "value", "± std. error"):
        table.add_column(column, justify="left" if column == "term" else "right")
    for i, term in enumerate(fit.features):
        table.add_row(POWER_LAW_TERMS[term], f"{fit.coef[i]:.4g}", f"{fit.std_errors[i]:.2g}")
    for term, exponent in fit.fixed.items():
        table.add_row(POWER_LAW_TERMS[term], f"{exponent:g}",
                      "taken: every configuration ran the same steps")
    console.print(table)


NOT_VALIDATED = "– (no fold could fit its terms)"
POWER_LAW_TERMS = {"log_scale": "log A (A in s)", "flops_per_step": "exponent of FLOPs per step",
                   "steps": "exponent of steps"}


def _print_time_models(models: EnergyModels) -> None:
    """The time models that competed, best first by held-out error; the chosen one marked."""
    if not models.time_models:
        return
    table = Table(title="the time models ranked by out-of-sample (cross-validated) error; "
                  "predictions without a given time use the first", title_justify="left")
    for column in ("time model", "terms", "cross-validated error", "R² (in-sample)"):
        table.add_column(column)
    for row in sorted(models.time_models, key=_by_held_out_error):
        cv = row["cv_rel_rmse"]
        table.add_row(row["form"] + (" (used)" if row["chosen"] else ""), row["terms"],
                      _percent(cv) if math.isfinite(cv) else NOT_VALIDATED, f"{row['r2']:.3f}")
    console.print(table)


def _by_held_out_error(row: dict[str, Any]) -> tuple[bool, float]:
    return not row["chosen"], row["cv_rel_rmse"] if math.isfinite(row["cv_rel_rmse"]) else math.inf


def _spread(fit: LinearFit | PowerLawFit) -> str:
    """The residual σ, and with repetitions its two parts."""
    def show(value: float) -> str:
        return _percent(value) if fit.weighting == "relative" else f"{value:.3g}"

    parts = (f" (repetitions' spread {show(fit.sigma_within)}, misfit between configurations "
             f"{show(fit.sigma_between)})" if fit.groups else "")
    return show(fit.sigma) + parts


def _percent(value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value * 100:.1f} %"


@model_app.command("predict")
def predict_command(
    width: Annotated[int | None, typer.Option(help="Widest hidden layer.")] = None,
    depth: Annotated[int | None, typer.Option(help="Hidden layers.")] = None,
    shape: Annotated[str, typer.Option(help="rectangle, funnel, exponential, wide_first.")] = (
        "rectangle"),
    batch_size: Annotated[int | None, typer.Option(help="Batch size.")] = None,
    dataset_size: Annotated[int | None, typer.Option(help="Training samples.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs.")] = None,
    inputs: Annotated[int, typer.Option(help="Input features.")] = 32,
    outputs: Annotated[int, typer.Option(help="Output classes.")] = 10,
    optimizer: Annotated[str | None, typer.Option(help="adam or sgd.")] = None,
    summary: Annotated[
        Path | None, typer.Option(help="A fecomlite-summary/1 JSON file instead of a width.")
    ] = None,
    sweep: Annotated[int | None, typer.Option(help="Use the model fitted on this sweep.")] = None,
    model: Annotated[Path | None, typer.Option(help="Use a model file (from fit --out).")] = None,
    time_s: Annotated[
        float | None, typer.Option(help="The training time, if known (else predicted); CPU "
                                   "seconds where `model fit` says it fitted on them.")
    ] = None,
    confidence: Annotated[float, typer.Option(help="Interval coverage.")] = 0.9,
    wait: Annotated[
        float | None, typer.Option(help="The run's run-queue wait per CPU second, if the sweep "
                                   "took load out (else the sweep's median load).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    home: HomeOption = None,
) -> None:
    """Predict the energy of training a network, with an interval, from a fitted model."""
    from fecomlite.model.fit import FitError
    from fecomlite.model.predict import predict
    from fecomlite.store import StoreError

    try:
        models = _load_models(home, sweep, model)
        hierarchy = MemoryHierarchy.from_json(models.hierarchy)
        step, steps = _network(hierarchy, width, depth, shape, batch_size, dataset_size, epochs,
                               inputs, outputs, optimizer, summary)
        result = predict(models, step, steps, time_s=time_s, confidence=confidence, wait=wait)
    except (StoreError, ConfigError, FitError, FeatureError) as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        _print_prediction(result, models)


def _load_models(home: Path | None, sweep: int | None, model: Path | None) -> EnergyModels:
    from fecomlite.model.fit import EnergyModels
    from fecomlite.store import Store, default_home

    if model is not None:
        try:
            return EnergyModels.from_json(json.loads(model.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read model {model}: {exc}") from exc
    store_path = (home or default_home()).resolve() / "store.sqlite"
    with Store(store_path, readonly=True) as store:
        sweep_id = sweep if sweep is not None else latest_sweep_id(store)
        load_sweep(store, sweep_id)
        data = store.result(sweep_id, MODEL_RESULT)
    if data is None:
        raise ConfigError(f"sweep {sweep_id} has no fitted model; run "
                          f"`fecomlite model fit --sweep {sweep_id}` first")
    return EnergyModels.from_json(data)


def _network(
    hierarchy: MemoryHierarchy, width: int | None, depth: int | None, shape: str,
    batch_size: int | None, dataset_size: int | None, epochs: int | None, inputs: int,
    outputs: int, optimizer: str | None, summary: Path | None,
) -> tuple[StepFeatures, int]:
    if summary is not None:
        if width is not None or depth is not None:
            raise ConfigError("give either --summary or --width/--depth, not both")
        data = read_summary(summary)
        training = training_of(data, batch_size=batch_size, dataset_size=dataset_size,
                               epochs=epochs, optimizer=optimizer)
        layers = layers_from_summary(data, training.batch_size)
        return training_step(layers, hierarchy, training.optimizer), training.steps
    if width is None or depth is None:
        raise ConfigError("give --width and --depth (or --summary FILE)")
    config = NetworkConfig(width, depth, shape, 32 if batch_size is None else batch_size,
                           4096 if dataset_size is None else dataset_size,
                           1 if epochs is None else epochs, inputs, outputs, optimizer or "adam")
    return training_step(config.layers(), hierarchy, config.optimizer), config.steps


def _print_prediction(result: Prediction, models: EnergyModels) -> None:
    from fecomlite.model.fit import TIME_MODEL_NOTE

    p = result.provenance
    level = f"{result.confidence * 100:g} %"
    reps = models.memory_aware.reps
    console.print(
        f"predicted energy ({models.target}, {models.domain}): [bold]"
        f"{scaled(result.energy_J, 'J')}[/]  ({level} interval "
        f"{scaled(result.low_J, 'J')} – {scaled(result.high_J, 'J')}"
        + (f", for the mean of {reps:.3g} repetitions as the sweep measured"
           if models.memory_aware.groups else "") + ")", highlight=False)
    console.print(
        f"training {'CPU ' if p.get('time') == 'cpu' else ''}time: "
        f"{scaled(result.time_s, 's')} ({result.time_source}"
        + (f", {level} interval {scaled(result.time_low_s, 's')} – "
           f"{scaled(result.time_high_s, 's')})" if result.time_source == "predicted" else ")"),
        highlight=False)
    for name, (mean, low, high) in result.naive.items():
        console.print(f"other model {name}: {scaled(mean, 'J')} ({scaled(low, 'J')} – "
                      f"{scaled(high, 'J')})", highlight=False)
    shown = ("sweep_id", "framework", "threads", "runs")
    source = ", ".join(f"{k} {v}" for k, v in p.items() if k in shown and v is not None
                       and not isinstance(v, list)) or f"runs {p.get('runs')}"
    console.print(f"model fitted on [bold]{escape(p['label'])}[/] energy ({escape(source)}, "
                  f"{models.configurations} configurations)", highlight=False)
    console.print(f"energy model: {result.model} (lowest cross-validated error)", highlight=False)
    if result.time_source == "predicted":
        console.print(f"time model: {escape(models.time_model)} (lowest cross-validated "
                      "error)", highlight=False, soft_wrap=True)
    notes = [*result.notes, *([TIME_MODEL_NOTE] if models.time_proportional else [])]
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)

"""`python -m frlab.report PATH [PATH ...]`: a sweep's runs as the paper's table.

PATH is a run folder, a sweep folder, or a folder of either; several PATHs are read together
(a rerun of the same sweep with more seeds adds seeds). Writes report.md, report.csv,
report.json and PNGs into `--out` (default: the first PATH's `report/`) and prints the main
tables. Exit codes: 0 written; 2 bad input (a folder with no run, an unknown baseline, a
malformed threshold) or a missing extra, named in one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from frlab.report.build import Options, build_report
from frlab.report.runs import ReportError
from frlab.report.stats import MissingExtra


def threshold(text: str) -> tuple[str, float]:
    metric, sep, value = text.partition("=")
    try:
        if not sep or not metric:
            raise ValueError
        return metric, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--threshold {text!r}: expected METRIC=VALUE, e.g. train/reward_mean=0.8"
        ) from None


def window(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--window {text}: a fraction in (0, 1]")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m frlab.report", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", metavar="PATH", help="run folders or sweep folders")
    p.add_argument("--out", type=Path, help="output folder (default: the first PATH's report/)")
    p.add_argument(
        "--baseline",
        help="the arm the others are compared with (its label or a "
        "part of it; default: the arm that runs the experiment's preset)",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        help="another metrics.csv column for the table (mean over the final window); repeatable",
    )
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        type=threshold,
        help="METRIC=VALUE: time to reach it, per arm (Kaplan-Meier); repeatable",
    )
    p.add_argument(
        "--smooth",
        type=positive,
        default=1,
        help="test a threshold on the "
        "trailing mean of this many updates (default 1: the raw value)",
    )
    p.add_argument(
        "--window",
        type=window,
        default=0.1,
        help="the final window of training metrics, a fraction of the updates (default 0.1)",
    )
    p.add_argument(
        "--include-unfinished",
        action="store_true",
        help="also use failed, killed and running runs (their last window)",
    )
    p.add_argument("--reps", type=positive, default=5000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    p.add_argument("--no-plots", action="store_true", help="only the text outputs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options = Options(
        metrics=tuple(args.metric),
        thresholds=tuple(args.threshold),
        smooth=args.smooth,
        window=args.window,
        baseline=args.baseline,
        include_unfinished=args.include_unfinished,
        reps=args.reps,
        seed=args.seed,
    )
    try:
        report = build_report(args.paths, options)
    except (ReportError, MissingExtra) as exc:
        print(f"frlab.report: {exc}", file=sys.stderr)
        return 2
    from frlab.report.write import terminal, write_text_outputs

    out = args.out or Path(args.paths[0]) / "report"
    written = write_text_outputs(report, out)
    if not args.no_plots:
        from frlab.report.plots import write_plots

        written += write_plots(report, out)
    print(terminal(report))
    print(f"\nwritten: {out} ({len(written)} files: report.md, report.csv, report.json, PNGs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

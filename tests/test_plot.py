"""`python -m frlab.plot`: PNG curves of reward, acceptance, lag and length, runs overlaid."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from frlab import plot

COLUMNS = [
    "step",
    "elapsed_s",
    "train/reward_mean",
    "train/acceptance_rate",
    "train/policy_lag_mean",
    "train/policy_lag_max",
    "train/response_tokens_mean",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(folder: Path, slope: float, steps: int = 12) -> Path:
    folder.mkdir(parents=True)
    with (folder / "metrics.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for s in range(1, steps + 1):
            w.writerow([s, s * 0.5, min(1.0, slope * s), 0.9, 1.0, 2, 3 + s])
    return folder


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun" / "toy"
    write_run(root / "objective.trust_region=none", 0.05)
    write_run(root / "objective.trust_region=sequence_bernoulli_kl", 0.1)
    return root


def test_sweep_folder_expands_to_its_runs(sweep: Path) -> None:
    runs = plot.load_runs([sweep])
    assert [r.label for r in runs] == [
        "objective.trust_region=none",
        "objective.trust_region=sequence_bernoulli_kl",
    ]
    assert len(runs[0].rows) == 12


def write_lightning_csv(run: Path) -> None:
    """The Lightning CSV logger's own metrics.csv inside a run folder (steps shifted by one)."""
    folder = run / "csv" / "version_0"
    folder.mkdir(parents=True)
    with (folder / "metrics.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for s in range(0, 12):
            w.writerow([s, s * 0.5, 0.5, 0.9, 1.0, 2, 3 + s])
    (run / "summary.json").write_text("{}")


def test_lightning_csv_inside_a_run_is_not_a_run_of_its_own(sweep: Path) -> None:
    for run in sorted(sweep.iterdir()):
        write_lightning_csv(run)
    names = ["objective.trust_region=none", "objective.trust_region=sequence_bernoulli_kl"]
    assert plot.expand_run_dirs([sweep]) == [sweep / n for n in names]
    runs = plot.load_runs([sweep])
    assert [r.label for r in runs] == names
    assert [r.rows[0]["step"] for r in runs] == [1.0, 1.0]  # frlab's file, not Lightning's
    fig = plot.make_figure(runs, "Mean reward", "reward", [("train/reward_mean", "-")])
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == names
    # A run folder given directly also reads only its own metrics.csv.
    assert plot.expand_run_dirs([sweep / names[0]]) == [sweep / names[0]]


def test_writes_valid_pngs_for_every_panel(sweep: Path, tmp_path: Path) -> None:
    import matplotlib.image

    written = plot.plot_runs([sweep], tmp_path / "plots")
    assert sorted(p.name for p in written) == sorted(
        ["reward.png", "acceptance.png", "lag.png", "response_length.png"]
    )
    for path in written:
        assert path.read_bytes()[:8] == PNG_MAGIC
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_runs_are_overlaid_with_a_legend(sweep: Path) -> None:
    runs = plot.load_runs([sweep])
    fig = plot.make_figure(runs, "Mean reward", "reward", [("train/reward_mean", "-")])
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [r.label for r in runs]
    assert list(ax.lines[1].get_ydata())[:3] == [0.1, 0.2, pytest.approx(0.3)]
    lag = plot.make_figure(
        runs, "lag", "v", [("train/policy_lag_mean", "-"), ("train/policy_lag_max", "--")]
    )
    assert len(lag.axes[0].lines) == 4 and len(lag.axes[0].get_legend().get_texts()) == 2


def test_cli_with_several_run_dirs_and_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = write_run(tmp_path / "a", 0.1)
    b = write_run(tmp_path / "b", 0.2, steps=5)
    out = tmp_path / "figs"
    assert plot.main([str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 4 and all(Path(p).parent == out for p in printed)
    assert plot.default_out([str(a)]) == a / "plots"


def test_cli_rejects_a_folder_without_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        plot.main([str(tmp_path)])
    assert info.value.code == 2

"""A short, readable summary of the pipeline's reports: headline test metrics, training times, best throughput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainlab import tasks
from trainlab.core.cli import command_parser, run_cli
from trainlab.profiling.report import percent


def read(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} when the stage has not written it yet."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def summary_lines(reports: Path) -> list[str]:
    """Markdown lines: one row per model, then where the rest of the numbers and pictures are."""
    evaluation = read(reports / "evaluate" / "metrics.json")
    profile = read(reports / "profile" / "measurements.json")
    lines = ["| model | test metric | also | training stage | fastest training setting (profile) |",
             "|---|---|---|---|---|"]
    for spec in tasks.REGISTRY.values():
        task, (key, label), (other, other_label) = spec.name, spec.headline, spec.second_metric
        metrics = evaluation.get(task, {})
        timing = read(reports / task / "run.json").get("timing", {})  # git-ignored: this machine's last training
        best = max(((setting, figures) for setting, figures in profile.get(task, {}).items()
                    if isinstance(figures, dict) and "train_samples_per_s" in figures),
                   key=lambda item: item[1]["train_samples_per_s"], default=None)
        lines.append("| " + " | ".join([
            task,
            f"{label} {metrics[key]:.4f}" if key in metrics else "not evaluated yet",
            f"{other_label} {metrics[other]:.4f}" if other in metrics else "",
            f"{timing['stage_time_s']:.0f} s" if "stage_time_s" in timing else "",
            (f"{best[0]}: {best[1]['train_samples_per_s']:,.0f} samples/s, MFU {percent(best[1].get('train_mfu'))}"
             if best and "train_samples_per_s" in best[1] else ""),
        ]) + " |")
    lines += ["", "Headline numbers: `dvc metrics show`; curves, per-class figures and confusion matrices: "
              "`dvc plots show`; every number: MLflow; pictures: "
              f"{reports / 'evaluate'}/*.png; profile report: {reports / 'profile' / 'report.md'}; "
              "runs: `mlflow ui --backend-store-uri sqlite:///mlflow.db`."]
    return lines


def main(argv: list[str]) -> None:
    parser = command_parser(prog="python -m trainlab.jobs.summary", description=__doc__)
    parser.add_argument("reports", type=Path, nargs="?", default=Path("reports"), help="the reports folder")
    args = parser.parse_args(argv)
    print("\n".join(summary_lines(args.reports)))


if __name__ == "__main__":
    run_cli(main)

"""The command line of the training stages: params and the MLflow server checked before torch loads, torchrun
when more than one process is asked for, then the training."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from trainlab.jobs.stage_cli import stage_params, stage_parser


def train_stage_main(name: str, argv: list[str],
                     add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The command line shared by the training stages: DATA_DIR MODEL_DIR REPORTS_DIR [--params FILE], plus the
    task's own options (`add_arguments`), which reach the task's code (TaskCode.training_extras)."""
    parser = stage_parser(f"python -m stages.train_{name}", f"Train the {name} model on prepared data (a DVC stage).")
    parser.add_argument("data_dir", type=Path, help="prepared data folder (train/val/test.safetensors, meta.json)")
    parser.add_argument("model_dir", type=Path, help="where the trained model is written")
    parser.add_argument("reports_dir", type=Path, help="where metrics.json and history.csv are written")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    params = stage_params(args, probe=os.environ.get("RANK", "0") == "0")  # under torchrun, rank 0 probes
    dist_params = params.base.distributed
    if dist_params.nproc_per_node * dist_params.nnodes > 1 and "LOCAL_RANK" not in os.environ:
        from trainlab.core.distributed import torchrun_command

        cmd = torchrun_command(dist_params, f"stages.train_{name}", argv)
        print(f"{name}: launching {dist_params.nproc_per_node} x {dist_params.nnodes} processes: {' '.join(cmd)}",
              flush=True)
        os.execv(cmd[0], cmd)
    from trainlab.jobs.train import train_task

    common = ("data_dir", "model_dir", "reports_dir", "params", "debug")
    options = {k: v for k, v in vars(args).items() if k not in common}
    outcome = train_task(name, params, args.data_dir, args.model_dir, args.reports_dir, **options)
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 speaks for all
        return
    shown = ", ".join(f"{k} {v:.4f}" for k, v in outcome.test.items())
    print(f"{name}: test {shown} ({outcome.seconds:.1f} s, {outcome.fit.samples_per_s:,.0f} samples/s)")

"""Every stage's first checks (params, then the MLflow server, before torch loads); the training command line."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from trainlab.config import Params, load_params


def probe_tracking(params: Params) -> None:
    """Report an unreachable MLflow server now, before torch and the stage's work load (exit 6 within seconds);
    when `tracking.fallback_to_local` chose the local store instead, the stage logs there."""
    if not params.tracking.enabled:
        return
    from trainlab.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(params, check=True)
    if uri != resolve_tracking_uri(params):
        params.tracking.uri = uri


def train_stage_main(name: str, argv: list[str]) -> None:
    """The command line shared by the three training stages: DATA_DIR MODEL_DIR REPORTS_DIR [--params FILE]."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.train_{name}",
                                     description=f"Train the {name} model on prepared data (a DVC stage).")
    parser.add_argument("data_dir", type=Path, help="prepared data folder (train/val/test.safetensors, meta.json)")
    parser.add_argument("model_dir", type=Path, help="where the trained model is written")
    parser.add_argument("reports_dir", type=Path, help="where metrics.json and history.csv are written")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    if name == "text":
        parser.add_argument("--baseline", type=Path, default=None,
                            help="the text_baseline stage's baseline.json (default: fit the TF-IDF baseline here)")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    if os.environ.get("RANK", "0") == "0":
        probe_tracking(params)
    dist_params = params.base.distributed
    if dist_params.nproc_per_node * dist_params.nnodes > 1 and "LOCAL_RANK" not in os.environ:
        from trainlab.distributed import torchrun_command

        cmd = torchrun_command(dist_params, f"stages.train_{name}", argv)
        print(f"{name}: launching {dist_params.nproc_per_node} x {dist_params.nnodes} processes: {' '.join(cmd)}",
              flush=True)
        os.execv(cmd[0], cmd)
    from trainlab.training import train_task

    outcome = train_task(name, params, args.data_dir, args.model_dir, args.reports_dir,
                         baseline_file=getattr(args, "baseline", None))
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 speaks for all
        return
    shown = ", ".join(f"{k} {v:.4f}" for k, v in outcome.test.items())
    print(f"{name}: test {shown} ({outcome.seconds:.1f} s, {outcome.fit.samples_per_s:,.0f} samples/s)")

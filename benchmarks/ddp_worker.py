"""One engine training run of the classifier on CPU, alone or as a torchrun rank; rank 0 writes its throughput."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="JSON file written by rank 0")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch (split over the processes)")
    parser.add_argument("--samples", type=int, default=0, help="train samples (0: the whole train split)")
    args = parser.parse_args()
    started = time.time()

    import torch

    from benchmarks.common import engine_runtime, quiet_stderr, task_data
    from benchmarks.training_speed import SCALES, build
    from trainlab.core import distributed
    from trainlab.core.config import DistributedParams
    from trainlab.engine.loop import fit

    runtime = engine_runtime("cpu")
    ctx = distributed.setup(DistributedParams(backend="gloo"), "cpu")
    data = task_data("classifier").subset(args.samples or None)
    setup = SCALES["full"]["classifier"]
    cfg = setup.train_params().model_copy(update={"epochs": args.epochs, "batch_size": args.batch_size})
    val = {k: v[:64] for k, v in data.val.items()}
    with quiet_stderr():
        fit(build(setup, data, 0, cfg), data.train, val, cfg.model_copy(update={"max_steps": 3}), runtime, seed=0)
        result = fit(build(setup, data, 0, cfg), data.train, val, cfg, runtime, seed=0)
    if ctx.is_main:
        args.out.write_text(json.dumps({
            "world_size": ctx.world_size, "threads_per_process": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "samples_per_s": result.samples_per_s,
            "train_s": result.train_time_s, "global_batch": args.batch_size, "epochs": args.epochs,
            "train_samples": len(data.train["labels"]), "process_s": time.time() - started,
            "precision": runtime.precision, "val_accuracy": result.final.get("val_accuracy"),
        }))
    distributed.teardown()


if __name__ == "__main__":
    main()

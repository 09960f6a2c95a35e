"""Benchmark: the engine (best settings for the device) against a plain fp32 DataLoader loop, same CNN and data.

    python -m benchmarks.engine_vs_plain [--epochs 1] [--repeats 3] [--json reports/bench/engine_vs_plain.json]

Contenders alternate within one process after a warm-up; the table shows medians of the repeats and the ratio of
the medians. Timing only: this is a benchmark that prints figures, not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainlab.config import BaseParams, ClassifierParams
from trainlab.data.embedded import load_mnist_5k
from trainlab.engine import fit
from trainlab.models import build_classifier
from trainlab.runtime import resolve_runtime
from trainlab.tasks import IMAGE_MEAN, IMAGE_STD, classification_task


def mnist_tensors(n: int) -> dict[str, torch.Tensor]:
    images, labels = load_mnist_5k()
    return {"images": torch.from_numpy(images[:n]).unsqueeze(1), "labels": torch.from_numpy(labels[:n])}


def cfg_for(epochs: int, batch_size: int) -> ClassifierParams:
    # Augmentation off so that both contenders do the same work per sample.
    return ClassifierParams(epochs=epochs, batch_size=batch_size, lr=3e-3, augment=False, warmup_epochs=0,
                            grad_clip=None, label_smoothing=0.0)


def run_engine(data, cfg, device: str) -> float:
    runtime = resolve_runtime(BaseParams(device=device, precision="auto", channels_last=True, deterministic=False))
    torch.manual_seed(0)
    model = build_classifier(cfg, num_classes=10, in_channels=1)
    task = classification_task(model, 10, augment=False)
    val = {k: v[:256] for k, v in data.items()}
    t0 = time.perf_counter()
    result = fit(task, data, val, cfg, runtime, seed=0)
    del t0
    return result.samples_per_s


def run_plain(data, cfg, device: str) -> float:
    """What many people write first: a DataLoader over float tensors, fp32, default memory layout."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = build_classifier(cfg, num_classes=10, in_channels=1).to(dev)
    images = (data["images"].float() / 255 - IMAGE_MEAN) / IMAGE_STD
    loader = DataLoader(TensorDataset(images, data["labels"]), batch_size=cfg.batch_size, shuffle=True,
                        drop_last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    seen = 0
    t0 = time.perf_counter()
    for _ in range(cfg.epochs):
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(y)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--samples", type=int, default=3500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, default=Path("reports/bench/engine_vs_plain.json"))
    args = parser.parse_args()

    data = mnist_tensors(args.samples)
    cfg = cfg_for(args.epochs, args.batch_size)
    small = {k: v[: args.batch_size * 4] for k, v in data.items()}
    run_engine(small, cfg_for(1, args.batch_size), args.device)  # warm-up both paths
    run_plain(small, cfg_for(1, args.batch_size), args.device)
    engine, plain = [], []
    for r in range(args.repeats):
        engine.append(run_engine(data, cfg, args.device))
        plain.append(run_plain(data, cfg, args.device))
        print(f"repeat {r + 1}: engine {engine[-1]:,.0f} img/s, plain {plain[-1]:,.0f} img/s", flush=True)
    med_e, med_p = statistics.median(engine), statistics.median(plain)
    runtime = resolve_runtime(BaseParams(device=args.device))
    result = {"device": str(runtime.device), "engine_settings": runtime.describe(), "batch_size": args.batch_size,
              "samples": args.samples, "epochs": args.epochs, "repeats": args.repeats,
              "engine_img_per_s": engine, "plain_img_per_s": plain,
              "engine_median": med_e, "plain_median": med_p, "ratio": med_e / med_p,
              "torch_threads": torch.get_num_threads()}
    print()
    print("| contender | settings | img/s (median) |")
    print("|---|---|---|")
    print(f"| engine | {runtime.precision}, channels_last, data on {runtime.device} | {med_e:,.0f} |")
    print(f"| plain loop | fp32, DataLoader, default layout | {med_p:,.0f} |")
    print(f"\nratio engine/plain: {med_e / med_p:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

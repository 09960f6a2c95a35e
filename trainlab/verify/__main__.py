"""`python -m trainlab.verify TARGET [--epochs N] [--bisect]` | `python -m trainlab.verify --lock`: see
docs/reproducibility.md. Exit 0 identical, 10 differs, 11 could not rerun."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from trainlab.core.cli import command_parser, run_cli
from trainlab.verify import DIFFERS, IDENTICAL, CouldNotRerun


def parse(argv: list[str]):
    parser = command_parser("python -m trainlab.verify", "Train a recorded run again here and say whether it "
                            "reproduces to the bit; if not, from where and why. Exit 0 identical, 10 differs, 11 could "
                            "not rerun.")
    parser.add_argument("target", nargs="?", help="a model folder (models/classifier), an MLflow run (runs:/<id>) "
                        "or a DVC training stage (train_classifier)")
    parser.add_argument("--epochs", type=int, default=0, help="train only the first N epochs again (same schedule)")
    parser.add_argument("--bisect", action="store_true", help="narrow a difference to the first optimizer step: "
                        "replay the epoch where it appears twice, with a trail record at every step")
    parser.add_argument("--lock", action="store_true", help="instead: `dvc repro` a temporary copy of this repo and "
                        "compare every output with the committed dvc.lock")
    parser.add_argument("--keep", action="store_true", help="keep the temporary workspace")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: the cwd)")
    args = parser.parse_args(argv)
    if bool(args.target) == args.lock:
        parser.error("give a TARGET, or --lock")
    return args


def main(argv: list[str]) -> None:
    args = parse(argv)
    root = args.root.resolve()
    workspace = Path(tempfile.mkdtemp(prefix="trainlab-verify-"))
    keep = args.keep
    try:
        if args.lock:
            from trainlab.verify.lock import verify_lock

            code = verify_lock(root, workspace)
        else:
            code = verify_run(args.target, root, workspace, args.epochs or None, args.bisect)
    except CouldNotRerun:
        keep = keep or any(workspace.iterdir())  # an empty one (the record could not be read) shows nothing
        if keep:
            print(f"verify: the workspace is kept for a look: {workspace}", file=sys.stderr)
        raise
    finally:  # any other error (a missing target, an interrupt) leaves nothing behind either
        if not keep:
            shutil.rmtree(workspace, ignore_errors=True)
    if args.keep:
        print(f"verify: workspace kept: {workspace}")
    sys.stdout.flush()
    sys.exit(code)


def verify_run(target: str, root: Path, workspace: Path, epochs: int | None, bisecting: bool) -> int:
    from trainlab.verify.compare import compare, fingerprint_differences, metric_gaps
    from trainlab.verify.record import load_record
    from trainlab.verify.rerun import check_inputs, rerun

    record = load_record(target, root)
    check_inputs(record)
    recorded_epochs = len(record.trail.get("epochs", []))
    epochs = epochs if epochs and epochs < recorded_epochs else None
    shown = f"its first {epochs} epochs" if epochs else f"all {recorded_epochs} epochs"
    print(f"verify: {record.task} ({record.source}): training {shown} again in {workspace}", flush=True)
    here = rerun(record, workspace / "rerun", epochs=epochs)
    result = compare(record.trail, here.trail, None if epochs else (record.model_md5, here.model_md5))
    p = result.parting
    took = f"training {here.train_time_s or 0:.1f} s here" + (
        f" against {record.train_time_s:.1f} s in the original run" if record.train_time_s is not None and not epochs
        else "") + f" (the whole rerun {here.seconds:.1f} s)"
    differences = fingerprint_differences(record.fingerprint, here.fingerprint)
    if result.identical:
        md5 = ", model.safetensors md5 equal" if result.model_md5_equal else ""
        print(f"verify: IDENTICAL to the bit: {result.epochs} epochs (weights and optimizer hashes), "
              f"{result.steps} recorded steps (loss and gradient norm){md5}; {took}")
        if differences:
            print("  (the fingerprints differ, without effect on the bits: " + "; ".join(differences) + ")")
        return IDENTICAL
    print(f"verify: DIFFERS ({took})")
    if p.epoch is not None:
        print(f"  first epoch that differs: {p.epoch} ({', '.join(p.epoch_what)} hashes)")
    if p.step is not None:
        values = ", ".join(f"{k} {a!r} recorded, {b!r} here" for k, (a, b) in p.step_values.items())
        print(f"  first recorded step that differs: optimizer step {p.step} ({values}); the last that agrees: "
              f"{p.last_agreeing_step or 'none'}")
    elif result.model_md5_equal is False and p.epoch is None:
        print("  every trail record agrees, but the saved weights differ (after the last epoch's record)")
    print("  fingerprint differences that can explain it:" if differences else
          "  the fingerprints agree: a nondeterminism here, or a change the fingerprint does not see "
          "(try --bisect)")
    for line in differences:
        print(f"    {line}")
    n = min(len(record.history), len(here.history))
    if n:
        print(f"  metrics after epoch {n}: " + "; ".join(metric_gaps(record.history[n - 1], here.history[n - 1])))
    if here.test and record.test:
        print("  test metrics: " + "; ".join(metric_gaps(record.test, here.test)))
    if bisecting:
        from trainlab.verify.bisect import bisect

        candidates = [e for e in (p.epoch, p.step and _epoch_of(record.trail, p.step)) if e]
        epoch = min(candidates) if candidates else len(record.trail.get("epochs", []))
        for line in bisect(record, epoch, workspace / "bisect").lines():
            print(line)
    return DIFFERS


def _epoch_of(trail: dict, step: int) -> int:
    return next((e["epoch"] for e in trail.get("epochs", []) if e["step"] >= step), len(trail.get("epochs", [])))


if __name__ == "__main__":
    run_cli(main)

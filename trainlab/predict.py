"""`python -m trainlab.predict MODEL INPUTS... --out DIR`: a trained model (models/<name>/ or an MLflow model URI) on
raw images or texts (the body is trainlab.jobs.predict)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import command_parser, run_cli
from trainlab.core.config import DEFAULT_PARAMS, Params, load_params


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m trainlab.predict", description="Predict raw images or texts with a "
                            "trained model (a models/<name>/ folder or an MLflow model URI); the outputs go into "
                            "--out.")
    parser.add_argument("model", help="a model folder (models/classifier) or an MLflow model URI "
                        "(models:/trainlab-text@champion, models:/trainlab-text/3, runs:/<run id>/text)")
    parser.add_argument("inputs", nargs="*", help="image files, folders and globs (image models); CSV/TSV files "
                        "(or folders of them) with the text column of data.text.text_column, or - (the default) for "
                        "one text per line of stdin (text model). Hidden files (.DS_Store, ._x.jpg) and files of "
                        "other suffixes in folders are skipped, as prepare skips them")
    parser.add_argument("--out", type=Path, required=True, help="output folder, replaced whole")
    parser.add_argument("--params", type=Path, default=None, help="params file for base.device/precision, the text "
                        "column and the tracking URI (default: params.yaml if there is one, else the defaults)")
    parser.add_argument("--batch-size", type=int, default=None, help="inputs per forward (default: "
                        "evaluate.batch_size)")
    parser.add_argument("--top-k", type=int, default=3, help="classes listed per input in the top_k column")
    args = parser.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    if args.top_k < 1:
        parser.error("--top-k must be at least 1")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.params is None and not DEFAULT_PARAMS.is_file():
        params = Params()
    else:
        params = load_params(args.params or DEFAULT_PARAMS)
    from trainlab.jobs.predict import run_predict

    summary = run_predict(args.model, args.inputs, args.out, params, args.batch_size, args.top_k)
    skipped = f" (skipped {summary.skipped} hidden or other files)" if summary.skipped else ""
    print(f"predict: {summary.predicted} {summary.task} predictions in {summary.out_dir}{skipped}")


if __name__ == "__main__":
    run_cli(main)

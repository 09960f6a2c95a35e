"""DVC stage train_text: train the text classifier on the prepared data; its metrics carry the TF-IDF baseline's."""

import argparse
from pathlib import Path

from trainlab.core.cli import run_cli
from trainlab.jobs.train_command import train_stage_main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=Path, required=True,
                        help="the text_baseline stage's baseline.json: the TF-IDF + logistic regression figures on "
                             "the same split, which the text model's metrics carry (dvc.yaml passes it)")


def main(argv: list[str]) -> None:
    train_stage_main("text", argv, add_arguments)


if __name__ == "__main__":
    run_cli(main, teardown=False)

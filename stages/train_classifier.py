"""DVC stage train_classifier: train the image classifier on the prepared data."""

from trainlab.core.cli import run_cli
from trainlab.jobs.train_command import train_stage_main


def main(argv: list[str]) -> None:
    train_stage_main("classifier", argv)


if __name__ == "__main__":
    run_cli(main, teardown=False)

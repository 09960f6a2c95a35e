"""DVC stage train_segmenter: train the image segmenter (U-Net) on the prepared data."""

from trainlab.core.cli import run_cli
from trainlab.jobs.train_command import train_stage_main


def main(argv: list[str]) -> None:
    train_stage_main("segmenter", argv)


if __name__ == "__main__":
    run_cli(main, teardown=False)

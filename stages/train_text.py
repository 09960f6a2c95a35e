"""DVC stage train_text: train the text classifier on the prepared data; its metrics carry the TF-IDF baseline's."""

from trainlab.cli import run_cli
from trainlab.stage_cli import train_stage_main


def main(argv: list[str]) -> None:
    train_stage_main("text", argv)


if __name__ == "__main__":
    run_cli(main)

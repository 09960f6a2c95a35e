"""`python -m benchmarks.figures`: README.md's generated blocks, from the reports (`--check`: exit 1 if stale)."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WIDTH = 120  # the README's column limit
# The report files the blocks are made of (relative to the reports folder): all of them committed.
SOURCES = ("evaluate/metrics.json", "profile/measurements.json", "profile/report.md")
SUMMARY_SOURCES = SOURCES[:2]  # what trainlab.jobs.summary reads of them (its run.json files are git-ignored)
TASKS = ("classifier", "segmenter", "text")
# report.md's first line: "Device **cpu** (Intel(R) Xeon(R) Processor, 2 threads), torch 2.14.1+cu130. ..."
DEVICE_LINE = re.compile(r"^Device \*\*(?P<device>[^*]+)\*\* \((?P<name>.*?)\), torch ", re.M)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"benchmarks.figures: cannot read {path}: {exc}") from None


def device_of(reports: Path) -> str | None:
    """The machine the profile ran on, as its report.md names it ("Intel Xeon Processor, 2 threads"), or None."""
    try:
        found = DEVICE_LINE.search((reports / "profile" / "report.md").read_text())
    except OSError:
        return None
    return re.sub(r"\((R|TM)\)", "", found["name"]) if found else None


def fastest(settings: dict) -> tuple[str, float, float]:
    """(setting, training samples/s, times fp32's) of the fastest training setting the profile measured."""
    timed = {name: f["train_samples_per_s"] for name, f in settings.items() if "train_samples_per_s" in f}
    best = max(timed, key=timed.__getitem__)
    return best, timed[best], timed[best] / timed["fp32"] if timed.get("fp32") else float("nan")


def bullet(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)


def figures_block(reports: Path) -> list[str]:
    """A few short lines: the test split's headline figures, each model's fastest training throughput, the machine."""
    metrics = read_json(reports / "evaluate" / "metrics.json")
    profile = read_json(reports / "profile" / "measurements.json")
    c, s, t = (metrics[task] for task in TASKS)
    speeds = []
    for task in TASKS:
        _, samples, ratio = fastest(profile[task])
        speeds.append(f"{task} {samples:,.0f} ({ratio:.2f}x)")
    device = device_of(reports)
    return [
        *bullet(f"Test split: classifier accuracy {c['accuracy']:.4f}, segmenter mean IoU {s['mean_iou']:.4f}, "
                f"text accuracy {t['accuracy']:.4f} (TF-IDF baseline {t['baseline_accuracy']:.4f})."),
        *bullet(f"Training samples/s (fastest setting, vs fp32): {', '.join(speeds)}."),
        *bullet(f"Measured by the profile stage{f' on {device}' if device else ''} (`reports/profile/report.md`)."),
    ]


def summary_block(reports: Path) -> list[str]:
    """The table `scripts/repro` ends with (trainlab.jobs.summary), as it reads these reports on a fresh clone: no
    run.json (git-ignored), so no training times."""
    from trainlab.jobs.summary import summary_lines

    with tempfile.TemporaryDirectory() as tmp:
        for name in SUMMARY_SOURCES:
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(reports / name, Path(tmp) / name)
        table = [line for line in summary_lines(Path(tmp)) if line.startswith("|")]
    return ["```text", *table, "```"]


BLOCKS = {"summary": summary_block, "figures": figures_block}


def rewrite(readme: str, reports: Path) -> str:
    """`readme` with every generated block between its markers replaced by what `reports` say."""
    for name, make in BLOCKS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
        if not pattern.search(readme):
            raise SystemExit(f"benchmarks.figures: README has no block {start} ... {end}")
        body = "\n".join([start, *make(reports), end])
        readme = pattern.sub(lambda _: body, readme, count=1)
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.figures", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    parser.add_argument("--reports", type=Path, default=REPO / "reports", help="the reports folder (default reports/)")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md", help="the README to rewrite")
    args = parser.parse_args(argv)
    current = args.readme.read_text()
    wanted = rewrite(current, args.reports)
    if current == wanted:
        print(f"{args.readme.name}: the generated blocks say what {args.reports} says")
        return 0
    if args.check:
        diff = difflib.unified_diff(current.splitlines(), wanted.splitlines(), str(args.readme), "from the reports",
                                    lineterm="", n=0)
        print("\n".join(diff), file=sys.stderr)
        print(f"{args.readme.name}: the generated blocks differ from {args.reports}; run python -m benchmarks.figures",
              file=sys.stderr)
        return 1
    args.readme.write_text(wanted)
    print(f"{args.readme.name}: generated blocks rewritten from {args.reports}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

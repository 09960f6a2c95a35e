"""`python -m benchmarks`: run the benchmark parts, print one markdown report, write reports/bench/*.json and
summary.md.

    python -m benchmarks                       # everything: about 80 minutes on a 2-core CPU (an estimate, 30 of
                                               # them the quality part; benchmarks/README.md)
    python -m benchmarks --quick               # a smoke version (not timed as a whole; its quality part ~4 min)
    python -m benchmarks --only classifier,mfu # some parts: classifier, segmenter, text, mfu, overhead, scaling
    python -m benchmarks --only text_quality   # model quality: text_quality, segmentation_quality (or model_quality)
    python -m benchmarks --only quality        # the default params on the real data sets of ../shared/data/quality
    python -m benchmarks --only predict        # the trained models in use: predict command, pyfunc, served requests
    python -m benchmarks --only data_scale     # prepare and streamed training on N and 8N generated JPEGs
    python -m benchmarks --only search         # a search with and without pruning; text weight decay on validation
    python -m benchmarks --only pipeline       # the default pipeline's dvc repro: wall, stages, test metrics
    python -m benchmarks --only trail          # the reproducibility trail's overhead: training with and without it
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_OUT, PartResult, environment, fmt, log, table, write_json, write_text

TRAINING = ("classifier", "segmenter", "text")
MODEL_QUALITY = ("text_quality", "segmentation_quality")  # model quality on user-like data (minutes each)
# quality: params.yaml's defaults on real data sets (benchmarks/quality.py; about half an hour)
PARTS = (*TRAINING, "mfu", "overhead", "pipeline", "scaling", *MODEL_QUALITY, "quality", "data_scale", "predict",
         "search", "trail")
ALIASES = {"training": TRAINING, "training_speed": TRAINING, "all": PARTS, "model_quality": MODEL_QUALITY}

# The targets per device: (headline key, comparison, threshold, what). CPU: the 2-core machine's; CUDA: one H200's.
TARGETS = {
    "cpu": (
        ("classifier_engine_over_plain", ">=", 2.0, "classifier: engine / plain loop throughput"),
        ("classifier_engine_over_lightning", ">=", 2.0, "classifier: engine / Lightning throughput"),
        ("classifier_max_accuracy_gap_points", "<=", 0.3, "classifier: test accuracy gap (points)"),
        ("classifier_engine_mfu", ">=", 0.6, "classifier: engine MFU (of the measured matmul peak)"),
        ("noop_dvc_repro_s", "<=", 1.5, "no-op `dvc repro` (s)"),
        ("cold_start_s", "<=", 4.0, "stage cold start to the first training step (s)"),
        *((f"stage_start_over_import_torch_s_{task}", "<=", 1.5,
           f"train_{task}: spawn to first step, over `import torch` (s)")
          for task in ("classifier", "segmenter", "text")),
        *((f"stage_end_s_{task}", "<=", 1.0,
           f"train_{task}: last step to exit in a two-epoch run, less the test pass (s)")
          for task in ("classifier", "segmenter", "text")),
        ("prefect_overhead_fraction_default_pipeline", "<=", 0.10,
         "Prefect overhead / (default training stages + overhead)"),
        ("default_pipeline_s", "<=", 180, "default pipeline: `dvc repro` of params.yaml in a fresh copy (s)"),
        ("default_classifier_accuracy_over_floor_points", ">=", 0,
         "default pipeline: classifier test accuracy over this CPU kind's floor (points)"),
        ("default_segmenter_iou_over_floor_points", ">=", 0,
         "default pipeline: segmenter test mean IoU over this CPU kind's floor (points)"),
        ("default_text_accuracy_over_baseline_points", ">=", 1.0,
         "default pipeline: text test accuracy over its TF-IDF baseline (points)"),
        ("predict_pyfunc_over_direct_min", ">=", 0.8, "predict: MLflow pyfunc / direct batch throughput (worst model)"),
        ("predict_text_request_p50_ms", "<=", 25, "predict: one-text /invocations request p50 (ms)"),
        ("predict_image_request_p50_ms", "<=", 30, "predict: one 28x28 image /invocations request p50 (ms)"),
        ("predict_pyfunc_log_extra_s", "<=", 1.0, "predict: logging the pyfunc, added to a stage's exit (s)"),
        ("prepare_rss_8n_over_n", "<=", 1.3, "prepare: peak RSS at 8N images / at N"),
        ("streamed_rss_8n_over_n", "<=", 1.3, "streamed training: peak RSS at 8N images / at N"),
        ("streamed_over_in_memory", ">=", 0.8, "streamed / in-memory training samples/s"),
        ("prepare_images_per_s_per_core", ">=", 300, "prepare: JPEGs decoded and resized per second per core"),
        ("search_pruning_wall_ratio", "<=", 0.5, "search: wall time with pruning / without (same trials)"),
        ("search_pruning_best_val_gap_points", "<=", 0.5, "search: best val accuracy lost to pruning (points)"),
        ("trail_overhead_fraction", "<=", 0.01, "trail: its own calls / training wall time (small CNN)"),
    ),
    "cuda": (
        # the MFU part runs params.yaml's batch (64 for the classifier); this target was set for a batch-128 step
        ("classifier_engine_step_samples_per_s", ">=", 100_000,
         "classifier: engine step samples/s (params.yaml batch; target set for 128)"),
        ("classifier_engine_over_bare_graph_step", ">=", 0.8, "classifier: engine / bare CUDA-graph step"),
        ("segmenter_engine_step_samples_per_s", ">=", 14_000, "segmenter: engine step samples/s (batch 32)"),
        ("text_engine_step_samples_per_s", ">=", 90_000, "text: engine step samples/s (batch 128)"),
        ("text_engine_over_bare_graph_step", ">=", 0.75, "text: engine / bare CUDA-graph step"),
        ("classifier_engine_over_bare_eager_step", ">=", 1.0, "classifier: engine / bare eager step"),
        ("segmenter_engine_over_bare_eager_step", ">=", 1.0, "segmenter: engine / bare eager step"),
        ("text_engine_over_bare_eager_step", ">=", 1.0, "text: engine / bare eager step"),
        ("classifier_engine_over_lightning", ">=", 4.0, "classifier: engine / Lightning throughput"),
    ),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke version of every part")
    parser.add_argument("--only", default="all",
                        help=f"comma-separated parts: {', '.join(PARTS)} (or training = the three models)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per contender (at least 3 for the "
                        "reported medians; fewer only for smoke tests)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu) | cpu | cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--epochs", type=int, default=0, help="epochs of every training comparison (0: the "
                        "defaults of training_speed.SCALES; more epochs sharpen the accuracy comparison)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the engine's model as well")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON files and summary.md go")
    parser.add_argument("--keep-workspace", action="store_true",
                        help="keep the overhead, pipeline and search parts' repo copies")
    args = parser.parse_args(argv)
    parts: list[str] = []
    for item in (x.strip() for x in args.only.split(",") if x.strip()):
        if item in ALIASES:
            parts += ALIASES[item]
        elif item in PARTS:
            parts.append(item)
        else:
            parser.error(f"--only: unknown part {item!r}; choose from {', '.join(PARTS)}, training, all")
    args.parts = list(dict.fromkeys(parts))
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


# Below this test accuracy the classifier is too far from trained for an accuracy gap to mean anything.
MEANINGFUL_ACCURACY = 0.9


def check_targets(headline: dict[str, Any], device: str = "cpu") -> list[list[str]]:
    rows = []
    for key, op, threshold, what in TARGETS["cuda" if device == "cuda" else "cpu"]:
        value = headline.get(key)
        if value is None:
            verdict = "not measured"
        else:
            ok = value >= threshold if op == ">=" else value <= threshold
            verdict = "met" if ok else "MISSED"
        shown = fmt(value, "pct") if "fraction" in key or key.endswith("_mfu") else (
            fmt(value, "x") if "_over_" in key and not key.endswith(("_s", "_points")) and "_s_" not in key
            else fmt(value))
        accuracy = headline.get("classifier_engine_test_accuracy")
        if key == "classifier_max_accuracy_gap_points" and accuracy is not None:
            shown += f" (engine at {100 * accuracy:.1f}%)"
            if accuracy < MEANINGFUL_ACCURACY:
                verdict = "not meaningful: undertrained"
        limit = f"{op} {fmt(threshold, 'pct') if 'fraction' in key or key.endswith('_mfu') else threshold}"
        rows.append([what, shown, limit, verdict])
    return rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device is available here (use --device auto or cpu)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    env = environment(torch.device(device))
    log(f"parts {', '.join(args.parts)} on {env['device']} ({env['device_name']}, {env['torch_threads']} threads)"
        f"{' [quick]' if args.quick else ''}; repeats {args.repeats}")
    settings = {"quick": args.quick, "repeats": args.repeats, "parts": args.parts, "threads": args.threads or None,
                "compile": args.compile, "epochs": args.epochs or None}
    results = WrittenWhenDone(args.out, env, settings)  # each part's JSON is on disk as soon as the part ends
    models = tuple(p for p in args.parts if p in TRAINING)
    if models:
        results.append(run_part("training_speed", lambda m: m.run(args.quick, args.repeats, device, models,
                                                                   args.compile, args.epochs)))
    if "mfu" in args.parts:
        results.append(run_part("mfu", lambda m: m.run(args.quick, args.repeats, device, compile=args.compile,
                                                       out_dir=args.out)))
    if "scaling" in args.parts:
        results.append(run_part("scaling", lambda m: m.run(args.quick, args.repeats, device)))
    if "overhead" in args.parts:
        results.append(run_part("overhead", lambda m: m.run(args.quick, args.repeats, keep=args.keep_workspace)))
    if "pipeline" in args.parts:
        results.append(run_part("pipeline", lambda m: m.run(args.quick, keep=args.keep_workspace)))
    for part in (*MODEL_QUALITY, "quality", "data_scale"):
        if part in args.parts:
            results.append(run_part(part, lambda m: m.run(args.quick)))

    if "predict" in args.parts:
        results.append(run_part("predict", lambda m: m.run(args.quick, args.repeats)))
    if "search" in args.parts:
        results.append(run_part("search", lambda m: m.run(args.quick, keep=args.keep_workspace)))
    if "trail" in args.parts:
        results.append(run_part("trail", lambda m: m.run(args.quick, args.repeats, device)))

    seconds = time.perf_counter() - started
    headline: dict[str, Any] = {}
    for r in results:
        headline.update(r.headline)
    targets = check_targets(headline, device)
    report = summary_markdown(env, settings, results, targets, seconds)
    write_json(args.out / "summary.json", {"environment": env, "settings": settings, "seconds": seconds,
                                           "headline": headline,
                                           "targets": [dict(zip(("what", "value", "target", "verdict"), row))
                                                       for row in targets]})
    write_text(args.out / "summary.md", report)
    print(report)
    log(f"wrote {args.out}/summary.md and {len(results) + 1} JSON files ({seconds:.0f} s)")
    failed = [r.name for r in results if failed_part(r)]
    if failed:
        log(f"FAILED parts: {', '.join(failed)} (their JSON holds the errors)")
    return 1 if failed else 0


class WrittenWhenDone(list):
    """The parts' results; each part's JSON file is written the moment its result is appended, so a run stopped
    later (a deadline, a crash in another part) keeps the figures of every part that finished."""

    def __init__(self, out: Path, env: dict[str, Any], settings: dict[str, Any]):
        super().__init__()
        self.out, self.env, self.settings = out, env, settings

    def append(self, r: PartResult) -> None:
        super().append(r)
        write_json(self.out / f"{r.name}.json", {"environment": self.env, "settings": self.settings,
                                                 "seconds": r.seconds, "headline": r.headline, "results": r.data})


def failed_part(r: PartResult) -> bool:
    # "traceback": what run_part records for a part that raised; "failed": the rows of a part that did not run
    # (the quality part's data sets that failed or whose files are missing)
    return isinstance(r.data, dict) and ("traceback" in r.data or bool(r.data.get("failed")))


# BENCH_INJECT_FAILURE=mfu,training_speed makes those parts raise at their start: a rehearsal of a failure
INJECT_FAILURE = "BENCH_INJECT_FAILURE"


def run_part(name: str, call) -> PartResult:
    """Import benchmarks.<name> and run it; a part that fails is reported (with its traceback in the JSON) and the
    others still run."""
    import importlib
    import traceback

    t0 = time.perf_counter()
    try:
        if name in os.environ.get(INJECT_FAILURE, "").split(","):
            raise RuntimeError(f"injected failure ({INJECT_FAILURE}={os.environ[INJECT_FAILURE]})")
        return call(importlib.import_module(f"benchmarks.{name}"))
    except Exception as exc:  # noqa: BLE001 - one broken part must not cost the figures of the others
        log(f"{name}: FAILED: {type(exc).__name__}: {exc}")
        return PartResult(name, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()},
                          f"## {name}\n\nFailed: `{type(exc).__name__}: {str(exc)[:500]}`\n", {},
                          time.perf_counter() - t0)


def summary_markdown(env: dict[str, Any], settings: dict[str, Any], results: list[PartResult],
                     targets: list[list[str]], seconds: float) -> str:
    load = env.get("load_average_at_start")
    lines = [
        "# Benchmarks", "",
        f"{env['device']} ({env['device_name']}), {env['torch_threads']} torch threads, {env['cpu_count']} CPUs, "
        f"torch {env['torch']}" + (f", lightning {env['lightning']}" if env.get("lightning") else "") +
        f"; {'quick (smoke) run' if settings['quick'] else 'full run'}, {settings['repeats']} alternating repeats "
        f"per contender after a warm-up; {seconds:.0f} s in all. " +
        (f"Load average at the start: {load[0]:.1f} (1 min)." if load else ""), "",
        "## Targets", "", table(["figure", "measured", "target", "verdict"], targets), "",
    ]
    if load and load[0] > 0.5 * (env.get("cpu_count") or 1):
        lines += ["**The machine was busy when this run started: timings are noisy; rerun on a quiet machine.**", ""]
    for r in results:
        lines += [r.markdown, f"({r.name}: {r.seconds:.0f} s)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

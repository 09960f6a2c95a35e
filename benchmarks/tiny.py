"""The tiny params of the whole-pipeline tests, the overhead benchmark and the GPU check's rehearsal: the real stages on
the embedded default data with tiny models and a couple of optimizer steps (about a minute for every stage on 2 busy
cores). Here, not under tests/, because benchmarks may not import the tests."""

# min_steps off: a test that lifts max_steps (the search's trials) counts exactly the epochs it asked for.
TINY_PARAMS = {
    "base": {"num_workers": 0},
    # width 8, not 4: a 4-wide classifier's channels_last backward hangs or crashes in oneDNN on AVX2-only CPUs
    # (torch 2.14.1, seen on this project's 2-core machine)
    "classifier": {"width": 8, "epochs": 1, "max_steps": 2, "min_steps": None, "batch_size": 4, "warmup_epochs": 0},
    "segmenter": {"base_channels": 4, "depth": 1, "epochs": 1, "max_steps": 2, "min_steps": None, "batch_size": 2,
                  "warmup_epochs": 0},
    # the Transformer, not the default TF-IDF bag: the whole pipeline then runs the text model that has attention
    # (the bag trains through the stage in tests/stages/test_train.py)
    "text": {"arch": "transformer", "optimizer": "adamw", "lr": 0.001, "d_model": 8, "n_heads": 1, "n_layers": 1,
             "dim_feedforward": 8, "epochs": 1, "max_steps": 2, "min_steps": None, "batch_size": 4, "warmup_epochs": 0,
             "baseline_max_features": 50},
    "evaluate": {"batch_size": 64, "n_examples": 1},
    "profile": {"batch_size": 2, "warmup_steps": 0, "steps": 1, "repeats": 1, "trace": False, "compile": False},
}

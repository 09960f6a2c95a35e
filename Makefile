# Shortcuts for the scripts in scripts/ (each sets up .venv from requirements.lock first).
.PHONY: repro test bench

repro:  ## dvc repro on the embedded default data, then a summary
	scripts/repro

test:  ## the test suite, as CI runs it
	scripts/test

bench:  ## benchmarks: markdown table on stdout, JSON in reports/bench/ (ARGS="--quick" for a smoke run)
	scripts/setup && .venv/bin/python -m benchmarks $(ARGS)

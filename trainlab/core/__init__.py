"""The core: params, errors, atomic writes, seeds and determinism, the runtime, DDP setup, the CLI wrapper,
flattening nested params and metrics."""

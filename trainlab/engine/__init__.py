"""One training engine for all tasks: device-resident batches, mixed precision, checkpoints, exact resume.
Import the module you need (trainlab.engine.loop: fit, evaluate; trainlab.engine.contract: Trainable)."""

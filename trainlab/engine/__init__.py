"""One training engine for all tasks: device-resident batches, mixed precision, checkpoints, exact resume."""

from trainlab.engine.loop import FitResult, TrainingInterrupted, evaluate, fit, scalars
from trainlab.engine.task import Task

__all__ = ["FitResult", "Task", "TrainingInterrupted", "evaluate", "fit", "scalars"]

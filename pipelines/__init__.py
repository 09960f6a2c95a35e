"""Prefect flows over the DVC pipeline: run the stages as tasks, serve on a schedule, sweep, compare and promote."""

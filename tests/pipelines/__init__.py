"""Tests of the Prefect flows in pipelines/: DAG from DVC, stages as tasks, schedules, sweeps, compare/promote."""

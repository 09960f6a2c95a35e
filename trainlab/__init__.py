"""trainlab: the core library behind the DVC stages and Prefect flows (config, data, models, engine, tracking)."""

__version__ = "0.1.0"

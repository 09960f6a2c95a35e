"""DVC stages: one thin module per stage (`python -m stages.<name> <inputs> <outputs>`) that calls the core."""

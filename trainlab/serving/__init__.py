"""Trained models on raw inputs: the predictor, the MLflow pyfunc model built on it, and its signature."""

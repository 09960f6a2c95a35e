"""The MLflow model of a trainlab model ("models from code"): raw inputs in a DataFrame to predictions, through
trainlab.serving.frames; its artifact `model` is the trained model folder (weights, config, preprocessing,
tokenizer)."""

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class TrainlabModel(PythonModel):
    """Loads the model folder once; predicts DataFrames of raw images (bytes) or texts."""

    def load_context(self, context):
        import torch

        from trainlab.serving.predictor import Predictor, cpu_runtime

        self.predictor = Predictor.load(context.artifacts["model"],
                                        cpu_runtime("cuda" if torch.cuda.is_available() else "cpu"))

    # A DataFrame hint: MLflow infers no schema from it (the signature is given at logging, trainlab.serving.flavor)
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        from trainlab.core.errors import DataError
        from trainlab.serving.frames import predict_frame

        try:
            return predict_frame(self.predictor, model_input)
        except DataError as exc:  # the scoring server answers 400 with this message
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None


mlflow.models.set_model(TrainlabModel())

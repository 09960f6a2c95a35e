"""How a trained model folder becomes an MLflow pyfunc on raw inputs: signature, input example, artifacts, code
and pinned requirements; and, for a downloaded MLflow model, the model folder inside it (or why there is none)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from trainlab.core.errors import CheckpointError

MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")
PACKAGE = Path(__file__).resolve().parents[1]  # trainlab/, logged as the model's code
MODEL_ARTIFACT = "model"  # the artifact holding the model folder
TENSOR_ARTIFACT = "tensor_model"  # the torch.export ('pt2') MLflow model on tensors, kept beside it
# What the pyfunc imports, pinned to the installed versions (no inference subprocess, no network).
REQUIREMENTS = ("mlflow", "torch", "numpy", "pandas", "pillow", "tifffile", "safetensors", "pydantic", "pyyaml",
                "torchmetrics", "tqdm")
EXAMPLE_ROWS = 2


def pip_requirements() -> list[str]:
    pins = []
    for name in REQUIREMENTS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def signature(task: str, class_names: list[str]) -> Any:
    """Input: one `text` string or `image` binary column; output: the columns frames.output_columns names."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    from trainlab.serving.frames import LABEL_COLUMN, MASK_COLUMN, input_column, output_columns

    column = input_column(task)
    inputs = Schema([ColSpec("binary" if column == "image" else "string", column)])
    kinds = {LABEL_COLUMN: "string", MASK_COLUMN: "binary"}
    outputs = Schema([ColSpec(kinds.get(c, "double"), c) for c in output_columns(task, class_names)])
    return ModelSignature(inputs=inputs, outputs=outputs)


SERVED_TASKS = ("classifier", "segmenter", "text")  # the tasks whose raw inputs trainlab.serving knows how to read


def served(task: str, model_dir: Path) -> bool:
    """Whether a trained model folder becomes a pyfunc on raw inputs: a task serving knows, with the preprocessing
    record prepare wrote (else the registered model stays the tensor-level one)."""
    from trainlab.data.preprocessing import PREPROCESSING_FILE

    return task in SERVED_TASKS and (Path(model_dir) / PREPROCESSING_FILE).is_file()


def raw_example(task: str, test: dict[str, Any], data_dir: Path) -> dict[str, list[Any]]:
    """A couple of raw test inputs as the model takes them: PNG bytes of stored test images, or the test texts as
    prepare read them (data_dir/test.jsonl)."""
    from trainlab.serving.frames import IMAGE_COLUMN, TEXT_COLUMN
    from trainlab.serving.masks import png_bytes

    if task == "text":
        texts = []
        path = Path(data_dir) / "test.jsonl"
        if path.is_file():
            with open(path) as f:
                for line in f:
                    if line.strip() and len(texts) < EXAMPLE_ROWS:
                        texts.append(str(json.loads(line)["text"]))
        return {TEXT_COLUMN: texts or ["an example text"]}
    images = test["images"][:EXAMPLE_ROWS]
    return {IMAGE_COLUMN: [png_bytes(image.permute(1, 2, 0).numpy()) for image in images]}


def example_frame(example: dict[str, list[Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(example)


def pyfunc_arguments(model_dir: Path, tensor_model: Path | None, example: dict[str, list[Any]]) -> dict[str, Any]:
    """The keyword arguments of mlflow.pyfunc's save/log for `model_dir` (a folder a training stage wrote)."""
    from trainlab.serving.predictor import read_record

    record = read_record(Path(model_dir))
    artifacts = {MODEL_ARTIFACT: str(model_dir)}
    if tensor_model is not None:
        artifacts[TENSOR_ARTIFACT] = str(tensor_model)
    return {"python_model": str(MODEL_CODE), "artifacts": artifacts, "code_paths": [str(PACKAGE)],
            "signature": signature(record["task"], [str(n) for n in record["class_names"]]),
            "input_example": example_frame(example), "pip_requirements": pip_requirements()}


def model_folder(local_model: str | Path, uri: str) -> Path:
    """The trained model folder inside a downloaded MLflow model; a CheckpointError saying why when the model is
    not a trainlab pyfunc on raw inputs (a tensor-level version registered before them)."""
    from mlflow.models import Model

    local_model = Path(local_model)
    try:
        flavors = Model.load(str(local_model)).flavors
    except Exception as exc:  # noqa: BLE001 - any unreadable MLmodel is reported the same way
        raise CheckpointError(f"{uri}: not an MLflow model ({type(exc).__name__}: {exc})") from None
    artifacts = (flavors.get("python_function") or {}).get("artifacts") or {}
    if MODEL_ARTIFACT not in artifacts:
        kind = "a tensor-level torch model (it takes model tensors: scaled images or token ids)" if "pytorch" in \
            flavors else f"an MLflow model of flavors {', '.join(flavors) or 'none'}"
        raise CheckpointError(f"{uri}: {kind}, registered before trainlab's models took raw inputs; it cannot "
                              "predict images or texts. Train again (`dvc repro`) to register a raw-input version, "
                              "or predict with the model folder (models/<task>/)")
    return local_model / artifacts[MODEL_ARTIFACT]["path"]

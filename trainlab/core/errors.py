"""User-facing errors: bad params, bad data, bad checkpoints; each says what is wrong and where."""


class UserError(Exception):
    """An error caused by the user's input (params, data, files), reported without a traceback."""

    exit_code = 1


class ParamsError(UserError):
    """params.yaml is invalid: unknown key, wrong type or out-of-range value."""

    exit_code = 2


class DataError(UserError):
    """Input data is missing, corrupt or inconsistent."""

    exit_code = 3


class CheckpointError(UserError):
    """A checkpoint or saved model does not match what is being loaded into."""

    exit_code = 4


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""

    exit_code = 5


class TrackingUnavailable(UserError):
    """The MLflow tracking server cannot be reached."""

    exit_code = 6


class OutputNotWritten(UserError):
    """An output (checkpoint, model, report) could not be written: the disk is full or a file-size limit was hit."""

    exit_code = 7


class InputsRejected(UserError):
    """Some inputs of a prediction could not be read; the others were predicted and written."""

    exit_code = 8


class TrialPruned(UserError):
    """A search trial's training was stopped by the study's pruner (its validation metric fell behind); no model."""

    exit_code = 9

"""`python -m trainlab.verify`: train a recorded run again and say whether it reproduces to the bit, and if not, where
and why; `--lock` does the same for the committed dvc.lock."""

from __future__ import annotations

from trainlab.core.errors import UserError

IDENTICAL, DIFFERS = 0, 10  # the exit codes of a verdict (docs/errors.md); 11: CouldNotRerun


class CouldNotRerun(UserError):
    """The recorded run cannot be trained again here: its record, params or data are missing or changed."""

    exit_code = 11

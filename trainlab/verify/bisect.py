"""`verify --bisect`: the epoch where two runs part, replayed here twice from the checkpoint at its start with a trail
record at every optimizer step: the first step where the replays part (nondeterminism here), else where they part
from the recorded run (between two of its recorded steps)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainlab.verify import CouldNotRerun
from trainlab.verify.compare import epoch_bounds, part, same
from trainlab.verify.record import RunRecord
from trainlab.verify.rerun import rerun


@dataclass
class Bisection:
    epoch: int
    first: int  # the epoch's first and last optimizer steps
    last: int
    replays_part_at: int | None  # the first step where the two replays here differ
    values: dict[str, tuple]  # at that step: name -> (first replay, second replay)
    recorded_parts_between: tuple[int, int] | None  # (last agreeing, first differing) recorded step, replays agree

    def lines(self) -> list[str]:
        head = f"--bisect: epoch {self.epoch} (optimizer steps {self.first}-{self.last}) replayed twice here from " \
               "the checkpoint at its start, with a trail record at every step:"
        if self.replays_part_at is not None:
            shown = ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in self.values.items())
            return [head, f"  the replays part at optimizer step {self.replays_part_at} ({shown}): training is not "
                          "deterministic here from that step"]
        if self.recorded_parts_between is None:
            return [head, "  the replays agree with each other and with every recorded step of the run: the rerun's "
                          "difference did not come back (a nondeterminism that strikes rarely)"]
        agree, differ = self.recorded_parts_between
        return [head, f"  the replays agree with each other (deterministic here); they part from the recorded run "
                      f"after step {agree}, at or before step {differ} (the recorded trail has no step between): "
                      "a difference of machine or code, see the fingerprint"]


def bisect(record: RunRecord, epoch: int, root: Path) -> Bisection:
    """Replay `epoch` (1-based) of `record`'s run twice in workspaces under `root`."""
    checkpoint = None
    if epoch > 1:
        prefix = rerun(record, root / "prefix", epochs=epoch - 1, label="prefix")
        ours = {e["epoch"]: e for e in prefix.trail.get("epochs", [])}
        theirs = {e["epoch"]: e for e in record.trail.get("epochs", [])}
        if not all(same(ours.get(epoch - 1, {}).get(k), theirs.get(epoch - 1, {}).get(k)) for k in ("weights",)):
            raise CouldNotRerun(f"--bisect: the state at the end of epoch {epoch - 1} already differs from the "
                                "recorded run's here; nothing to replay from")
        checkpoint = prefix.checkpoint(record.task)
    replays = [rerun(record, root / f"replay{i}", epochs=epoch, trail_every=1, checkpoint=checkpoint,
                     label=f"replay{i}") for i in (1, 2)]
    first, last = epoch_bounds(replays[0].trail, epoch)
    between, _, _ = part(replays[0].trail, replays[1].trail, (first, last))
    if between.step is not None:
        return Bisection(epoch, first, last, between.step, between.step_values, None)
    against, _, _ = part(record.trail, replays[0].trail, (first, last))
    parts = (against.last_agreeing_step, against.step) if against.step is not None else None
    if parts is None and any(e["epoch"] == epoch for e in record.trail.get("epochs", [])):
        ours = {e["epoch"]: e for e in replays[0].trail.get("epochs", [])}.get(epoch, {})
        theirs = {e["epoch"]: e for e in record.trail.get("epochs", [])}[epoch]
        if ours.get("weights") != theirs.get("weights"):  # parts after the last recorded step of the epoch
            parts = (against.last_agreeing_step or first - 1, last)
    return Bisection(epoch, first, last, None, {}, parts)

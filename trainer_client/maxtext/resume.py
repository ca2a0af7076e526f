"""Where a MaxText run's data resumes: the step MaxText restores, checked against the run that trained it.

MaxText checkpoints its train state with orbax in ``checkpoint_dir``; the checkpoint of step ``N`` holds the
state after training step ``N``, and its train loop goes on at ``N + 1`` (``get_first_step``: the restored
``state.step``). taskdata's data state is one step number (plus the fingerprint of what decided the steps
before it), so the pipeline is stateless, as MaxText's ``olmo_grain`` pipeline is: it starts at the step after
the latest checkpoint orbax lists there, the same one MaxText restores, on any number of processes. MaxText's
own Grain ``iter`` item is not used: its restore refuses another number of processes than the one that saved
(``grain_utility.restore_grain_iterator``), and it would hold nothing the step does not already say.

What the step cannot say is which run trained the steps before it. So each start writes a *run record* into
``{checkpoint_dir}/taskdata/``: the plan it reads from that step (``start-{step:09d}.json``, written once by
process 0, whole). A resume at step ``s`` finds the record of the start that trained step ``s - 1`` and refuses
a plan whose ``fingerprint_before(s)`` differs from that record's (``ResumeError``): the same check a
``DataState`` makes, so a stage appended later, a skip range or another number of processes resume, and a run
that would give other batches for the steps already trained does not. Orbax lists only step folders
(``N``), so it never sees the record folder.
"""

from __future__ import annotations

import json
import re
from typing import Any

from taskdata import fs
from taskdata.index import RunPlan
from trainer_client.iterator import ResumeError

__all__ = ["RECORD_FOLDER", "check_and_record", "latest_checkpoint", "start_step"]

RECORD_FOLDER = "taskdata"
_RECORD = re.compile(r"^start-(\d{9})\.json$")


def latest_checkpoint(checkpoint_dir: str) -> int | None:
    """The latest step orbax lists as a complete checkpoint in ``checkpoint_dir`` (what MaxText restores)."""
    import orbax.checkpoint as ocp
    from etils import epath

    path = epath.Path(checkpoint_dir)
    if not path.exists():
        return None
    manager = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        step = manager.latest_step()
    finally:
        manager.close()
    return None if step is None else int(step)


def start_step(config: Any) -> int:
    """The step MaxText's train loop starts at for ``config`` (a MaxText ``HyperParameters``): 0, or the step
    after the latest checkpoint in its ``checkpoint_dir``. Refuses what starts at another step unseen."""
    for name in ("enable_emergency_checkpoint", "enable_multi_tier_checkpointing", "elastic_enabled"):
        if getattr(config, name, False):
            raise ResumeError(
                f"{name}=true restores through other checkpoint managers, whose step taskdata's pipeline does not "
                f"read; it resumes from MaxText's orbax checkpoints in checkpoint_dir only. Set {name}=false."
            )
    latest = latest_checkpoint(config.checkpoint_dir) if config.enable_checkpointing else None
    if latest is not None:
        return latest + 1
    if config.load_full_state_path:
        raise ResumeError(
            f"load_full_state_path={config.load_full_state_path!r} restores a train state at that state's "
            "step, which taskdata's pipeline cannot see (it starts at the step after the latest checkpoint in "
            "checkpoint_dir, here none: step 0). Load only the parameters (load_parameters_path) to train "
            "them on the run from step 0, or resume from a checkpoint in checkpoint_dir."
        )
    return 0


def check_and_record(checkpoint_dir: str, plan: RunPlan, step: int, *, write: bool) -> None:
    """Refuses to resume ``plan`` at ``step`` if the run that trained step ``step - 1`` decided the steps before
    ``step`` otherwise; then, with ``write``, records ``plan`` as the one read from ``step`` on."""
    records = fs.join(checkpoint_dir, RECORD_FOLDER)
    if step > 0:
        starts = sorted(int(m.group(1)) for name in fs.listdir(records) if (m := _RECORD.match(name)))
        trained = [s for s in starts if s < step]
        if not trained:
            raise ResumeError(
                f"MaxText resumes {checkpoint_dir} at step {step}, but no taskdata run record there says which run "
                "trained the steps before it (a checkpoint trained on another input pipeline?). Start a new MaxText "
                "run (another run_name) to train on this run from step 0."
            )
        path = fs.join(records, _record_name(trained[-1]))
        recorded = RunPlan.from_dict(json.loads(fs.read_bytes(path))["plan"])
        if recorded.fingerprint_before(step) != plan.fingerprint_before(step):
            raise ResumeError(
                f"The checkpoint's steps 0..{step - 1} were trained on run {recorded.name!r} (recorded in {path}), "
                f"whose fingerprint of those steps is {recorded.fingerprint_before(step)}, but run {plan.name!r} has "
                f"{plan.fingerprint_before(step)}: its batches would differ from the ones the checkpoint was trained "
                "on. Resume with the run the checkpoint was made with, or start a new MaxText run (another run_name)."
            )
    if write:
        record = {"run": plan.name, "start_step": step, "fingerprint": plan.fingerprint(), "plan": plan.to_dict()}
        fs.write_atomic(fs.join(records, _record_name(step)), (json.dumps(record, sort_keys=True) + "\n").encode())


def _record_name(step: int) -> str:
    return f"start-{step:09d}.json"

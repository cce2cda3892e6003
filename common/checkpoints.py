"""The checkpoints directory of a run, as files: which `iter_NNNNNNN` checkpoints are complete, the state file beside
the tensors, and the partial names saves write under. Plain Python: the launcher reads it to check a run directory
before resuming into it, the trainer and the export to find the newest checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json
import os
import re
import shutil

from common.files import atomic_write

TRACKER = "latest_checkpointed_iteration.txt"
STATE_FILE = "train_state.json"
_COMPLETE = re.compile(r"^iter_(\d{7})$")
_PARTIAL_PREFIX = ".partial_"


@dataclass
class TrainState:
    """What, beside the tensors, a resumed run needs to continue exactly where it stopped."""

    step: int
    consumed_samples: int


def checkpoint_name(step: int) -> str:
    return f"iter_{step:07d}"


def partial_path(root: str, step: int, attempt: str = "") -> str:
    """Where a save of `step` writes before it is complete; `attempt` tells apart the saves of different processes
    (a writer left over from a killed process never writes into a later save)."""
    return os.path.join(root, _PARTIAL_PREFIX + checkpoint_name(step) + (f".{attempt}" if attempt else ""))


def _numbered(root: str) -> list[tuple[int, str]]:
    """(step, path) of every `iter_NNNNNNN` directory, oldest first, complete or not."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = _COMPLETE.match(name)
        if match and os.path.isdir(os.path.join(root, name)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def read_train_state(path: str) -> TrainState:
    """The state file of a checkpoint; OSError or ValueError when it is missing or damaged."""
    with open(os.path.join(path, STATE_FILE)) as f:
        state = json.load(f)
    if not isinstance(state, dict) or set(state) != {"step", "consumed_samples"}:
        raise ValueError(f"{STATE_FILE} holds {str(state)[:60]}, not a step and consumed samples")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in state.values()):
        raise ValueError(f"{STATE_FILE} holds {state}")
    return TrainState(**state)


def state_problem(path: str) -> str | None:
    """Why a checkpoint directory is not complete (its state file, written last, is missing or damaged), or None."""
    try:
        read_train_state(path)
    except FileNotFoundError:
        return f"it has no {STATE_FILE}"
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError: a truncated file
        return f"its {STATE_FILE} is damaged ({str(err).splitlines()[0][:80]})"
    return None


def complete_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint (its state file readable), oldest first."""
    return [(step, path) for step, path in _numbered(root) if state_problem(path) is None]


def damaged_checkpoints(root: str) -> list[tuple[int, str, str]]:
    """(step, path, why) of every `iter_NNNNNNN` directory that is not complete: a resume or an export would pass it
    over for an older one (disk full, a truncated copy)."""
    return [(step, path, why) for step, path in _numbered(root) if (why := state_problem(path))]


def latest_checkpoint(root: str) -> tuple[int, str] | None:
    complete = complete_checkpoints(root)
    return complete[-1] if complete else None


def finalize_checkpoint(root: str, state: TrainState, partial: str | None = None) -> str:
    """Mark the partial checkpoint of state.step (at `partial`, default its plain partial path) complete: state
    file, rename, tracker. Run on one rank after every rank has written its shards. Until the rename, nothing
    looks complete: a crash before it leaves the previous checkpoint the newest."""
    partial = partial or partial_path(root, state.step)
    atomic_write(os.path.join(partial, STATE_FILE), json.dumps(asdict(state), indent=1))
    final = os.path.join(root, checkpoint_name(state.step))
    if os.path.exists(final):  # the same step saved again (e.g. after a signal at a save step)
        shutil.rmtree(final)
    os.rename(partial, final)
    atomic_write(os.path.join(root, TRACKER), f"{state.step}\n")
    return final


def prune_checkpoints(root: str, keep_last: int) -> list[str]:
    """Delete all but the newest keep_last complete checkpoints (keep_last <= 0 keeps everything)."""
    if keep_last <= 0:
        return []
    removed = []
    for _, path in complete_checkpoints(root)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def remove_partials(root: str) -> list[str]:
    """Leftovers of interrupted saves; they never count as checkpoints."""
    if not os.path.isdir(root):
        return []
    removed = []
    for name in os.listdir(root):
        if name.startswith(_PARTIAL_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


# --------------------------------------------------------------------------- the base of an adapter checkpoint
# A LoRA run (peft=lora) saves its adapters and their training state only; this file, beside them, says which base
# weights they were trained on, so that a resume or an export never puts them on another base.
BASE_FILE = "peft_base.json"
_SAMPLE_BYTES = 2**20


def fingerprint(path: str) -> str:
    """A SHA-256 over every file under `path` (a Hugging Face directory, a checkpoint; symbolic links followed, as a
    hub cache's snapshot links its blobs): its relative name, its size, and its first, middle and last MiB. Reads a
    few MiB per file, so that a resume of a 405B run checks its base in seconds: a changed, re-exported, truncated
    or other base is told apart; an edit inside one file that keeps its size and those three MiB is not."""
    import hashlib

    digest = hashlib.sha256()
    root = os.path.abspath(path)
    files = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, names in os.walk(root, followlinks=True)
        for f in names
        if not f.startswith(".lock")
    )
    for relative in files:
        full = os.path.join(root, relative)
        size = os.path.getsize(full)
        digest.update(f"{relative}\0{size}\0".encode())
        with open(full, "rb") as f:
            for start in sorted({0, max(0, size // 2 - _SAMPLE_BYTES // 2), max(0, size - _SAMPLE_BYTES)}):
                f.seek(start)
                digest.update(f.read(_SAMPLE_BYTES))
    return digest.hexdigest()


@dataclass(frozen=True)
class BaseRecord:
    """What an adapter checkpoint records of its base: the config key and value that named it, where it was read
    from, and its fingerprint."""

    key: str
    value: str
    path: str
    fingerprint: str


def base_record(key: str, value: str, path: str) -> BaseRecord:
    return BaseRecord(key=key, value=value, path=os.path.abspath(path), fingerprint=fingerprint(path))


def random_base_record(seed: int) -> BaseRecord:
    """A benchmark's random frozen base (peft.random_base=true), named by the seed that drew it: its adapters resume
    only on the same draw."""
    return BaseRecord(key="peft.random_base", value="true", path="", fingerprint=f"random initialisation, seed {seed}")


def write_base_record(checkpoint: str, record: BaseRecord) -> None:
    atomic_write(os.path.join(checkpoint, BASE_FILE), json.dumps(asdict(record), indent=1) + "\n")


def read_base_record(checkpoint: str) -> BaseRecord | None:
    """The checkpoint's record of its base; None where it has none (not an adapter checkpoint) or one this version
    cannot read."""
    try:
        with open(os.path.join(checkpoint, BASE_FILE)) as f:
            return BaseRecord(**json.load(f))
    except FileNotFoundError:
        return None
    except (TypeError, ValueError):  # not a mapping of exactly these keys
        return None


def base_problem(checkpoint: str, record: BaseRecord) -> str | None:
    """One line when the adapter checkpoint was trained on another base than `record` (this run's), else None."""
    saved = read_base_record(checkpoint)
    if saved is None:
        return (
            f"{checkpoint} holds no {BASE_FILE}: it is not a LoRA adapter checkpoint, and peft=lora resumes only "
            "from its own adapters; start in a new run directory"
        )
    if saved.fingerprint != record.fingerprint:
        return (
            f"{checkpoint} holds adapters trained on the base {saved.path} ({saved.key}, fingerprint "
            f"{saved.fingerprint[:12]}), and this run's base {record.path} ({record.key}) has "
            f"fingerprint {record.fingerprint[:12]}: set {saved.key}={saved.value} to resume, or "
            "start in a new run directory"
        )
    return None

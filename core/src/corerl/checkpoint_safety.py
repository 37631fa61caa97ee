"""Reading checkpoints without running code from them.

A pickle can name any importable callable, and unpickling calls it: a run directory from
someone else could run code on resume. corerl writes its own checkpoint files as tensors and
plain data and reads them with ``torch.load(weights_only=True)`` (:func:`load_plain`). The engines'
own files are checked before the engine reads them (:func:`verify_folder`): every pickle in them
(the records of torch's zip files, raw pickles such as the ``.metadata`` of
``torch.distributed.checkpoint``) is walked opcode by opcode without executing any, and any
global outside :data:`PLAIN_GLOBALS` is refused. A refusal is one line naming the file.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from corerl.errors import RunError

#: what a raw pickle in a checkpoint may name: torch's own checkpoint metadata types, tensor
#: rebuilding, and builtin containers
PLAIN_GLOBALS = (
    "torch.distributed.checkpoint.metadata.",
    "torch.distributed.checkpoint.planner.",
    "torch.distributed.checkpoint._nested_dict.",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.strided", "torch.sparse_coo", "torch.contiguous_format", "torch.channels_last", "torch.preserve_format",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePosixPath",
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_parameter",
    "torch.storage.", "torch.serialization._get_layout",
    "torch.Size",
    "torch.float", "torch.bfloat16", "torch.int", "torch.uint8", "torch.bool", "torch.long", "torch.half",
    "torch.complex",
    "collections.OrderedDict",
    "builtins.set", "builtins.frozenset", "builtins.slice", "builtins.tuple", "builtins.list", "builtins.dict",
    "builtins.int", "builtins.float", "builtins.bool", "builtins.str", "builtins.bytes", "builtins.complex",
    "torch._tensor._rebuild_from_type_v2", "torch.Tensor",
)
# An engine whose own files name more (its enums, its loss scaler's plain attributes) states those
# globals on its registration (``TrainingBackend.checkpoint_globals``): the callers pass them as ``also``.
_HINT = "a corerl checkpoint holds tensors and plain data only; resume only run directories you (or corerl) wrote"


class CheckpointRefused(RunError):
    """A checkpoint file that would run code (or cannot be read as plain data) when loaded."""


def load_plain(path: str | Path, map_location: Any = "cpu") -> Any:
    """``torch.load`` of a checkpoint file that may hold tensors and plain data only."""
    import torch

    try:
        return torch.load(str(path), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()
        why = next((line for line in reason if "GLOBAL" in line or "Unsupported" in line), reason[0] if reason else "")
        raise CheckpointRefused(f"{path} holds more than tensors and plain data ({why.strip()[:160]}); refused "
                                "without running it", key="run.name", hint=_HINT) from None


def pickle_globals(data: bytes) -> list[str]:
    """The ``module.name`` globals a pickle refers to, read from its opcodes (nothing is run): the
    stack's strings are followed through the memo far enough to name each ``STACK_GLOBAL``."""
    names: list[str] = []
    pushed: list[Any] = []  # what each push put on the stack: a string, or None for anything else
    memo: dict[int, Any] = {}
    for opcode, arg, _ in pickletools.genops(data):
        name = opcode.name
        if name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING"):
            pushed.append(str(arg))
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg)] = pushed[-1] if pushed else None
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(int(arg)))
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            names.append(f"{module}.{attr}")
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            module, attr = (pushed[-2], pushed[-1]) if len(pushed) >= 2 else (None, None)
            names.append(f"{module}.{attr}" if isinstance(module, str) and isinstance(attr, str) else "?")
            pushed.append(None)
        elif opcode.stack_after:
            pushed.append(None)
    return names


def _plain(name: str, also: Iterable[str] = ()) -> bool:
    module, _, attr = name.rpartition(".")
    if module == "torch" and attr.endswith("Storage"):  # torch.FloatStorage and kin: typed storage markers
        return True
    return any(name == allowed.rstrip(".") or name.startswith(allowed) for allowed in (*PLAIN_GLOBALS, *also))


def _refuse_unplain(where: str, names: list[str], also: Iterable[str] = ()) -> None:
    """Refuse the pickle at ``where`` when a global it names is not plain data (nor in ``also``)."""
    unsafe = [name for name in names if not _plain(name, also)]
    if unsafe:
        raise CheckpointRefused(f"{where} names {unsafe[0]}, which loading it would call; refused without "
                                "running it", key="run.name", hint=_HINT)


def verify_file(path: Path, also: Iterable[str] = ()) -> None:
    """Refuse ``path`` if loading it could run code: every pickle in it (a torch zip's
    ``data.pkl`` records, or the file itself) may name only :data:`PLAIN_GLOBALS` and ``also``
    (the engines' :attr:`~corerl.registry.TrainingBackend.checkpoint_globals`)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            records = [(f"{path}:{name}", archive.read(name)) for name in archive.namelist() if name.endswith(".pkl")]
    else:
        with open(path, "rb") as handle:
            head = handle.read(2)
        if len(head) < 2 or head[0] != 0x80 or not 2 <= head[1] <= 5:  # not a pickle (protocols 2-5 open 0x80 0x0N)
            return
        records = [(str(path), path.read_bytes())]
    for where, data in records:
        try:
            names = pickle_globals(data)
        except Exception as exc:  # malformed: the engine's load would fail on it too; refuse it here, readably
            raise CheckpointRefused(f"{where} is not a readable pickle ({exc}); refused", key="run.name",
                                    hint=_HINT) from None
        _refuse_unplain(where, names, also)


def verify_folder(folder: str | Path, also: Iterable[str] = ()) -> None:
    """:func:`verify_file` on every file under ``folder`` (before any engine reads it), and on
    every record of each ``torch.distributed.checkpoint`` data file (:func:`verify_dcp_records`);
    ``also``: the globals the run's engines state their own files may name."""
    also = tuple(also)
    paths = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    for path in paths:
        verify_file(path, also)
    for metadata in (p for p in paths if p.name == ".metadata"):
        verify_dcp_records(metadata, also)


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that can only build :data:`PLAIN_GLOBALS` (a second guard: the file's globals
    were already checked by :func:`verify_file`)."""

    def __init__(self, handle: Any, also: Iterable[str] = ()) -> None:
        super().__init__(handle)
        self.also = tuple(also)

    def find_class(self, module: str, name: str) -> Any:
        if not _plain(f"{module}.{name}", self.also):
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data")
        return super().find_class(module, name)


def verify_dcp_records(metadata_path: Path, also: Iterable[str] = ()) -> None:
    """Each record a ``torch.distributed.checkpoint`` folder's data files hold (a ``torch.save``
    archive at the offset its ``.metadata`` gives; non-tensor records are read back with a full
    unpickler by torch) may name only :data:`PLAIN_GLOBALS`."""
    with open(metadata_path, "rb") as handle:
        metadata = _PlainUnpickler(handle, also).load()
    folder = metadata_path.parent
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        path = folder / str(info.relative_path)
        with open(path, "rb") as handle:
            handle.seek(info.offset)
            record = handle.read(info.length)
        where = f"{path}@{info.offset}"
        try:
            archive = zipfile.ZipFile(io.BytesIO(record))
        except zipfile.BadZipFile:
            continue  # a raw tensor record: torch reads those with weights_only=True
        with archive:
            pickles = [archive.read(name) for name in archive.namelist() if name.endswith(".pkl")]
        for data in pickles:
            _refuse_unplain(where, pickle_globals(data), also)


def engines_checkpoint_globals(selection: Any) -> tuple[str, ...]:
    """The globals the run's training backends (the policy's, and the critic's where there is one)
    state their own checkpoint files may name (``TrainingBackend.checkpoint_globals``)."""
    choices = (selection.training_backend, getattr(selection, "critic_backend", None))
    return tuple(name for choice in choices if choice is not None and choice.registration is not None
                 for name in getattr(choice.registration, "checkpoint_globals", ()))

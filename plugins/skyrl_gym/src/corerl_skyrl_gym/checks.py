"""``corerl validate`` (and a run's start) refuse, in one line each, a ``skyrl_gym`` recipe whose
environments cannot play: an id skyrl-gym does not have, an entry point that does not import,
``lcb`` where no sandbox ``env.skyrl_gym.isolation`` names can run (as corerl's ``code``
environment is refused), and ``searchcode``, which runs the model's code unsandboxed, without the
opt-in (:func:`check_skyrl_gym`, the registration's ``check_supported``). What a class needs from this machine (text2sql's database
folder, search's retrieval server, llm_as_a_judge's API key and endpoint) is checked with the run's other inputs, its model and data
files (:func:`check_skyrl_gym_inputs`, the registration's ``check_inputs``): ``corerl validate
--recipe-only`` judges the recipe without them. The classes checked are ``env.skyrl_gym.env_class``
and those the data files' ``env_class`` column names."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from corerl.sdk import ConfigError, ConfigErrors
from corerl_skyrl_gym.sandboxed import SANDBOXED, sandbox_runner

SECTION = "env.skyrl_gym"
#: classes whose environments run the model's code in a plain Python process (no sandbox)
RUNS_MODEL_CODE = {"lcb": "runs the model's code against the row's tests",
                   "searchcode": "runs the model's <python> tool calls"}
#: classes whose tools call a retrieval server: where its address is read (None: skyrl-gym's default only)
SEARCH_SERVER = {"search": "search_url", "searchcode": None}
DEFAULT_SEARCH_URL = "http://127.0.0.1:8000/retrieve"


def check_skyrl_gym(config: Any) -> None:
    """The recipe's skyrl-gym environments, checked (see the module's docstring)."""
    settings = config.section(SECTION)
    errors = _check_register(settings.register)
    if errors:
        raise ConfigErrors(errors)
    from corerl_skyrl_gym.environment import register_extra

    register_extra(settings.register)
    for env_class, key in _classes(config, settings).items():
        errors += _check_class(env_class, key, settings)
    if errors:
        raise ConfigErrors(errors)


def check_skyrl_gym_inputs(config: Any) -> None:
    """What the recipe's skyrl-gym environments need from this machine, checked (see the module's
    docstring): run after :func:`check_skyrl_gym` has passed."""
    from corerl_skyrl_gym.environment import env_config_for

    settings = config.section(SECTION)
    errors = []
    for env_class, key in _classes(config, settings).items():
        errors += _check_machine(env_class, key, settings, env_config_for)
    if errors:
        raise ConfigErrors(errors)


def _classes(config: Any, settings: Any) -> dict[str, str]:
    """The environment classes the recipe plays, each with the key (or data file key) naming it."""
    data = getattr(config.core, "data", None)
    classes = {settings.env_class: f"{SECTION}.env_class"}
    for env_class, where in data_env_classes(data).items():
        classes.setdefault(env_class, where)
    return classes


def _check_register(entries: dict[str, str]) -> list[ConfigError]:
    import importlib

    import skyrl_gym

    errors = []
    for env_id, entry_point in entries.items():
        key = f"{SECTION}.register.{env_id}"
        module, _, name = str(entry_point).partition(":")
        known = skyrl_gym.registry.get(env_id)
        if known is not None and known.entry_point != entry_point:
            errors.append(ConfigError(f"skyrl-gym already has an environment {env_id!r} ({known.entry_point})", key=key,
                                      hint="give yours another id, and name that id in env.skyrl_gym.env_class"))
            continue
        if not module or not name:
            errors.append(ConfigError(f"{entry_point!r} is not an entry point", key=key,
                                      hint="write 'module:Class', the module importable here"))
            continue
        try:
            found = getattr(importlib.import_module(module), name, None)
        except Exception as error:  # a user's module: whatever it raises is the one line to show
            errors.append(ConfigError(f"cannot import {module!r}: {type(error).__name__}: {error}", key=key,
                                      hint="put the environment's module on PYTHONPATH (or install its package)"))
            continue
        if found is None:
            errors.append(ConfigError(f"module {module!r} has no {name!r}", key=key,
                                      hint="name the environment class defined in that module"))
    return errors


def _check_class(env_class: str, key: str, settings: Any) -> list[ConfigError]:
    import difflib

    import skyrl_gym

    if env_class not in skyrl_gym.registry:
        known = sorted(skyrl_gym.registry)
        close = difflib.get_close_matches(env_class, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return [ConfigError(f"skyrl-gym has no environment {env_class!r} (registered: {', '.join(known)})", key=key,
                            hint=hint + f"or register yours: {SECTION}.register.{env_class}=module:Class")]
    errors = []
    if env_class in SANDBOXED and not settings.allow_unsandboxed_code:
        try:
            sandbox_runner(settings.isolation)
        except ConfigError as error:  # no sandbox: refused in one line at env.skyrl_gym.isolation
            errors.append(error)
    elif env_class in RUNS_MODEL_CODE and not settings.allow_unsandboxed_code:
        errors.append(ConfigError(
            f"skyrl-gym environment {env_class!r} {RUNS_MODEL_CODE[env_class]} in a plain Python process on this "
            "machine, with no sandbox", key=key,
            hint=f"set {SECTION}.allow_unsandboxed_code=true to accept that (on a machine you can lose), or pick "
                 "another environment"))
    return errors


def _check_machine(env_class: str, key: str, settings: Any, env_config_for: Any) -> list[ConfigError]:
    import skyrl_gym

    from corerl_skyrl_gym.llm_judge import ENTRY as JUDGE

    errors: list[ConfigError] = []
    if env_class not in skyrl_gym.registry:  # refused by check_skyrl_gym already
        return errors
    if env_class == "text2sql":
        db_path = env_config_for(env_class, settings.env_config).db_path
        if not Path(db_path).is_dir():
            errors.append(ConfigError(
                f"skyrl-gym environment 'text2sql' needs its SQLite databases, and db_path {db_path} is not a folder",
                key=f"{SECTION}.env_config.db_path",
                hint="download the databases SkyRL's text-to-SQL example uses (SynSQL, Spider or BIRD) and set "
                     f"{SECTION}.env_config.db_path to their folder"))
    if env_class in SEARCH_SERVER:
        field = SEARCH_SERVER[env_class]
        url = env_config_for(env_class, settings.env_config).get(field) if field else DEFAULT_SEARCH_URL
        if (why := unreachable(url)) is not None:
            where = f"{SECTION}.env_config.{field}" if field else key
            errors.append(ConfigError(
                f"skyrl-gym environment {env_class!r} needs a retrieval server, and {url} {why}", key=where,
                hint="start the retrieval server of SkyRL's search example"
                     + (f" and set {SECTION}.env_config.{field} to its address" if field else
                        f" at {DEFAULT_SEARCH_URL} (searchcode reads no other address)")))
    if skyrl_gym.registry[env_class].entry_point == JUDGE:
        errors += _check_judge(env_class, key, env_config_for(env_class, settings.env_config))
    return errors


def _check_judge(env_class: str, key: str, env_config: Any) -> list[ConfigError]:
    """The llm_as_a_judge environment's judge: its API key set, its endpoint answering."""
    from corerl_skyrl_gym.llm_judge import API_KEY, judge_settings

    model, base_url = judge_settings(env_config)
    if not os.environ.get(API_KEY):
        return [ConfigError(
            f"skyrl-gym environment {env_class!r} asks a judge model ({model} at {base_url}), and {API_KEY} is not "
            "set in the environment", key=key,
            hint=f"export {API_KEY}=<the judge endpoint's API key> before the run (corerl does not read the file "
                 "a SkyRL script gives uv run --env-file)")]
    if (why := unreachable(base_url)) is not None:
        return [ConfigError(
            f"skyrl-gym environment {env_class!r} asks a judge model ({model}), and its endpoint {base_url} {why}",
            key=f"{SECTION}.env_config.base_url",
            hint=f"set {SECTION}.env_config.base_url (SkyRL: environment.skyrl_gym.{env_class}.base_url) to an "
                 "OpenAI-compatible server that answers, or check this machine's network")]
    return []


def unreachable(url: str, timeout_s: float = 2.0) -> str | None:
    """Why nothing answers at ``url``'s host and port (None: a connection opens)."""
    parsed = urlparse(str(url))
    if not parsed.hostname:
        return "is not a URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout_s):
            return None
    except OSError as error:
        return f"does not answer ({error.strerror or type(error).__name__})"


def data_env_classes(data: Any) -> dict[str, str]:
    """The ``env_class`` values of the dataset files' rows, each with the first file naming it
    (``data.train_files`` / ``data.held_out_files``); files that cannot be read are left to the
    dataset task's own checks."""
    found: dict[str, str] = {}
    for key in ("train_files", "held_out_files"):
        files = getattr(data, key, None) if data is not None else None
        for path in [files] if isinstance(files, str) else list(files or []):
            for value in _column_values(Path(path)):
                found.setdefault(value, f"data.{key}")
    return found


def _column_values(path: Path) -> Iterable[str]:
    from corerl_skyrl_gym.environment import ENV_CLASS_COLUMN

    values: set[str] = set()
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            if ENV_CLASS_COLUMN in pq.read_schema(path).names:
                values = {v for v in pq.read_table(path, columns=[ENV_CLASS_COLUMN]).column(0).to_pylist()}
        elif path.suffix.lower() in (".jsonl", ".json"):
            with path.open(encoding="utf-8") as handle:
                for line in handle:
                    row = json.loads(line) if line.strip() else None
                    if isinstance(row, dict):
                        values.add(row.get(ENV_CLASS_COLUMN))
    except Exception:  # not readable (a missing file, not Parquet, not JSON lines): the task's checks say why
        return []
    return sorted(v for v in values if isinstance(v, str) and v.strip())

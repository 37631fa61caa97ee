"""How many of SkyRL's own launch scripts `corerl validate --recipe-only` accepts (issue 75's count).

Point it at a SkyRL checkout (or the copy beside this one, ``../shared/skyrl``): every ``*.sh`` under
its ``examples`` folder is read as ``corerl validate --recipe-only SCRIPT`` reads it (same reader,
translator and selection, in this process), from the checkout's root as SkyRL runs its scripts. A
script that starts no training command (a data-preparation, server or cluster script) is counted
apart, as is one refused for its shell (a loop, a function) that names no entry point (a cluster or
server script); the training scripts are counted by their entry point: accepted, refused only for want of a
GPU here, or refused, with the key of each refusal. The data files and models a script names are
this machine's business, not the script's (``--recipe-only``). A variable a script requires
(``${SYNC_DIR:?...}``) is given a placeholder, as its user would give a value, and the table says so.

    .venv/bin/python bench/skyrl_recipes.py ../shared/skyrl

Nothing runs: the scripts are read, not executed, and nothing is downloaded.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from bench_output import results_path
from nemo_rl_recipes import machine_only  # the same machine-only refusals in both corpora

#: the environment the scripts are read in (their shell defaults decide the rest)
ENVIRONMENT = {"HOME": "/home/user", "PATH": "/usr/bin:/bin"}
NOT_TRAINING = "no training command"
_REQUIRED = re.compile(r"^(\w+) is not set: ")


def entry_point_of(path: Path, environ: dict[str, str]) -> tuple[str | None, str, dict[str, str]]:
    """(the entry point's id, or None where the script is refused before one is known; the
    refusal; the environment it was read with, the placeholders a required variable was given)."""
    from corerl.config.dialects.skyrl import script
    from corerl.errors import ConfigError

    for _ in range(4):
        try:
            return script.read(path, [], environ).entry_point.id, "", environ
        except ConfigError as exc:
            required = _REQUIRED.match(exc.message)
            if required is None:
                return None, exc.one_line(), environ
            environ = {**environ, required.group(1): f"/placeholder/{required.group(1).lower()}"}
    return None, "required variables left unset", environ


def names_an_entry_point(path: Path) -> bool:
    """Whether a script's text names a SkyRL entry point (as a module or a script path) anywhere
    but in a Python import (a set-up script checking, in a here-document, that the example's
    modules import: it starts no training)."""
    from corerl.config.dialects.skyrl.entry_points import ENTRY_POINTS

    text = "\n".join(line for line in path.read_text(errors="replace").splitlines()
                     if not re.match(r"\s*(from|import)\s", line))
    return any(e.module in text or e.module.replace(".", "/") + ".py" in text for e in ENTRY_POINTS)


def validate(path: Path, environ: dict[str, str]) -> tuple[bool, str]:
    """(accepted, the first refusal's line): the steps of ``corerl validate --recipe-only``."""
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.errors import ConfigErrors, CorerlError
    from corerl.plugin_manager import PluginHost

    try:
        host = PluginHost()
        config = load_config(str(path), [], host, [], "skyrl", environ=environ)
        select(config, host)
    except ConfigErrors as exc:
        return False, exc.errors[0].one_line() if exc.errors else exc.one_line()
    except CorerlError as exc:
        return False, exc.one_line()
    except Exception as exc:  # noqa: BLE001 - a crash on someone's script is a finding, reported as such
        return False, f"CRASH {type(exc).__name__}: {exc}"
    return True, ""


def refusal_key(reason: str) -> str:
    """What a refusal names first: its key (``trainer.strategy``), else its opening words."""
    head = reason.split(":")[0]
    if re.fullmatch(r"[\w.\-\[\]]+", head):
        return head
    entry = re.match(r"SkyRL's (\w+) entry point", reason)  # refused for the code its module adds
    return f"the {entry.group(1)} entry point" if entry else " ".join(head.split()[:6])


def first_refusals(rows: list[dict[str, Any]]) -> collections.Counter[str]:
    """The key each refused script's first refusal names (not for want of a GPU), counted."""
    return collections.Counter(refusal_key(row["reason"]) for row in rows
                               if not row["accepted"] and not machine_only(row["reason"]))


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Scripts, accepted, refused for want of a GPU here, and refused otherwise."""
    accepted = sum(row["accepted"] for row in rows)
    machine = sum(not row["accepted"] and machine_only(row["reason"]) for row in rows)
    return {"scripts": len(rows), "accepted": accepted, "refused_no_gpu_here": machine,
            "refused": len(rows) - accepted - machine}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a SkyRL checkout (its examples/ folder holds the launch scripts)")
    parser.add_argument("--show", type=int, default=40, help="refused scripts to list (default 40)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where the figures go (default bench/results/skyrl_recipes.json, or the folder "
                             "CORERL_BENCH_RESULTS names)")
    args = parser.parse_args(argv)
    root = args.checkout.resolve()
    if not (root / "examples").is_dir():
        parser.error(f"{args.checkout}: no examples/ folder; give a SkyRL checkout")
    target = (args.json or results_path("skyrl_recipes.json")).resolve()
    os.chdir(root)  # SkyRL runs its scripts from its checkout's root (a script starting another names it from there)

    by_entry: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    others: list[dict[str, Any]] = []
    for path in sorted(Path("examples").rglob("*.sh")):
        entry, reason, environ = entry_point_of(path, dict(ENVIRONMENT))
        placeholders = sorted(set(environ) - set(ENVIRONMENT))
        if entry is None and (NOT_TRAINING in reason or not names_an_entry_point(path)):
            others.append({"script": str(path), "reason": reason})
            continue
        accepted, reason = validate(path, environ) if entry is not None else (False, reason)
        by_entry[entry or "(refused before its entry point)"].append(
            {"script": str(path), "accepted": accepted, "reason": reason, "placeholders": placeholders})

    from rich.table import Table

    from corerl.reporting.console import make_console

    console = make_console()
    table = Table(title=f"corerl validate --recipe-only on SkyRL's launch scripts in {args.checkout}")
    for column in ("entry point", "scripts", "accepted", "refused: no GPU here", "refused", "accepted or GPU-only %",
                   "first refusals by key"):
        table.add_column(column, justify="left" if column in ("entry point", "first refusals by key") else "right",
                         overflow="fold")
    every = [row for rows in by_entry.values() for row in rows]
    order = sorted(by_entry, key=lambda name: (-len(by_entry[name]), name))
    for label, rows in [*((name, by_entry[name]) for name in order), ("all training scripts", every)]:
        c = counts(rows)
        share = f"{100 * (c['accepted'] + c['refused_no_gpu_here']) / c['scripts']:.0f}" if rows else "-"
        firsts = ", ".join(f"{key} ({n})" for key, n in first_refusals(rows).most_common(3))
        table.add_row(label, str(c["scripts"]), str(c["accepted"]), str(c["refused_no_gpu_here"]), str(c["refused"]),
                      share, firsts if label != "all training scripts" else "(below)",
                      style="bold" if label == "all training scripts" else None)
    console.print(table)
    total = counts(every)
    share = (total["accepted"] + total["refused_no_gpu_here"]) / max(total["scripts"], 1)
    console.print(f"{100 * share:.1f}% of {total['scripts']} training scripts accepted or refused only for want of a "
                  f"GPU (goal: 85%); {len(others)} other scripts start no training command (data, servers, clusters)",
                  markup=False)
    refused = [row for row in every if not row["accepted"] and not machine_only(row["reason"])]
    reasons = first_refusals(every)
    why = Table(title="refused (not for want of a GPU): what the first refusal names")
    for column in ("key", "scripts"):
        why.add_column(column)
    for key, count in reasons.most_common():
        why.add_row(key, str(count))
    console.print(why)
    placeheld = [row for row in every if row["placeholders"]]
    if placeheld:
        console.print(f"{len(placeheld)} scripts require a variable set (given a placeholder here): "
                      + ", ".join(sorted({v for row in placeheld for v in row["placeholders"]})), markup=False)
    result = {"corpus": str(args.checkout),
              "entry_points": {name: {**counts(rows), "first_refusals": dict(first_refusals(rows).most_common())}
                               for name, rows in by_entry.items()},
              "all": total, "accepted_or_gpu_only_share": round(share, 4),
              "refusals": [{"key": key, "scripts": count} for key, count in reasons.most_common()],
              "refused_scripts": [{"script": row["script"], "reason": row["reason"]} for row in refused],
              "other_scripts": others}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {target}")
    for row in refused[: args.show]:
        console.print(f"refused {row['script']}: {row['reason']}", markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

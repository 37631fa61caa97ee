"""A mutation smoke test of the suite: each mutation below is a deliberate bug of a real class
(offload that drops state, bf16 ignored, a weight update never loaded, a packer ignoring its seed,
stop ids ignored, a recipe key dropped three ways). The script applies one at a time to the source, runs the
tests that claim to guard against it, puts the source back and reports whether they caught it.

    .venv/bin/python scripts/mutation_smoke.py            # every mutation, a table at the end
    .venv/bin/python scripts/mutation_smoke.py --list     # what it would do
    .venv/bin/python scripts/mutation_smoke.py packer-seed --json out.json

It edits the files of this checkout in place (the venv's corerl is an editable install of them),
so it refuses to start while one of those files has uncommitted changes, and restores each file
whatever happens. First it runs the guarding tests on the unmutated source: a mutation only
counts as caught when the same tests passed without it. Exit status: 0 when every mutation was
caught, 1 otherwise. Results as of the last run are in docs/testing.md ("Mutation smoke").

Written here rather than with a mutation-testing tool (mutmut, cosmic-ray): those generate many
small operator mutations and run the whole suite per mutant; this checks a few named bug classes
against the tests that claim them, in minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: ``old`` (found exactly once in ``path``) becomes ``new``."""

    name: str
    bug: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        name="offload-drops-state",
        bug="offload that drops state: reload gives the parked storages back zeroed, not with their bytes",
        path="core/src/corerl/training/parking.py",
        old="storage.copy_(host.untyped_storage())",
        new="storage.copy_(host.zero_().untyped_storage())",
        tests=("tests/test_offload.py",),
    ),
    Mutation(
        name="bf16-ignored",
        bug="bf16 ignored: dtensor computes in float32 whatever policy.precision says",
        path="plugins/dtensor/src/corerl_dtensor/worker.py",
        old="self.param_dtype = DTYPES[self.config.core.policy.precision]",
        new="self.param_dtype = DTYPES['float32']",
        tests=("plugins/dtensor/tests/test_dtensor_conformance.py::TestWorld1::test_bfloat16_logprobs_are_close_to_float32",),
    ),
    Mutation(
        name="weights-never-loaded",
        bug="a weight update never loaded: hf generation checks the names and keeps its old weights",
        path="core/src/corerl/generation/hf.py",
        old="missing, unexpected = self.model.load_state_dict(state, strict=False)",
        new="missing, unexpected = [k for k in self.model.state_dict() if k not in state], [k for k in state "
            "if k not in self.model.state_dict()]",
        tests=("tests/test_hf_generation.py::TestHFGenerationConformance::test_outputs_follow_refitted_weights",),
    ),
    Mutation(
        name="packer-seed",
        bug="a packer ignoring its seed: FirstFitShuffle shuffles with a fixed one",
        path="core/src/corerl/packing/algorithms.py",
        old="self.rng = random.Random(seed)",
        new="self.rng = random.Random(0)",
        tests=("tests/test_packing.py::test_first_fit_shuffle_is_reproducible_and_follows_its_seed",),
    ),
    Mutation(
        name="stop-ids-ignored",
        bug="stop ids ignored: hf generation ends completions at the end of sequence only",
        path="core/src/corerl/generation/hf.py",
        old="return list(dict.fromkeys([*sampling.stop_token_ids, *eos_ids]))",
        new="return list(dict.fromkeys([*eos_ids]))",
        tests=("tests/test_hf_generation.py::TestHFGenerationConformance::"
               "test_a_stop_id_ends_a_completion_where_it_is_sampled",),
    ),
    Mutation(
        name="lora-dropout-dropped",
        bug="a recipe key dropped: policy.lora.dropout never reaches PEFT's LoraConfig",
        path="core/src/corerl/lora/adapter.py",
        old="lora_dropout=settings.dropout,",
        new="lora_dropout=0.0,",
        tests=("tests/test_lora.py",),
    ),
    Mutation(
        name="recipe-key-dropped",
        bug="a recipe key dropped: a command-line key=value loses to the value the recipe file sets",
        path="core/src/corerl/config/overrides.py",
        old="node[leaf] = override.value",
        new="node.setdefault(leaf, override.value)",
        tests=("tests/test_config.py",),
    ),
    Mutation(
        name="dialect-key-dropped",
        bug="a recipe key dropped: NeMo RL's grpo.num_generations_per_prompt is said to act but sets nothing",
        path="core/src/corerl/config/dialects/nemo_rl.py",
        old="        set_at(self.tree, target, value)\n        self.new_origins[target]",
        new="        if source != 'grpo.num_generations_per_prompt':\n            set_at(self.tree, target, value)\n"
            "        self.new_origins[target]",
        tests=("tests/test_nemo_rl_dialect.py", "tests/test_nemo_rl_keys_act.py"),
    ),
)


def check_applicable(mutation: Mutation) -> str:
    """The file's text, after checking ``old`` occurs in it exactly once (the source moved on
    otherwise: the mutation must be rewritten, not skipped)."""
    text = (REPO / mutation.path).read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise SystemExit(f"mutation {mutation.name}: {mutation.old!r} occurs {count} times in {mutation.path}, "
                         "not once: rewrite the mutation for the current source (scripts/mutation_smoke.py)")
    return text


def run_tests(tests: tuple[str, ...], timeout_s: int) -> tuple[int, float, str]:
    """pytest on ``tests`` in one process: (exit status, seconds, last lines of its output)."""
    start = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-x", "-q", "-p", "no:cacheprovider",
                               *tests], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, time.monotonic() - start, f"timed out after {timeout_s} s"
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return done.returncode, time.monotonic() - start, tail


def smoke(mutation: Mutation, timeout_s: int) -> dict[str, object]:
    """Run ``mutation``'s tests without it, then with it; the source is restored either way."""
    original = check_applicable(mutation)
    dirty = subprocess.run(["git", "diff", "--quiet", "--", mutation.path], cwd=REPO).returncode
    if dirty:
        raise SystemExit(f"mutation {mutation.name}: {mutation.path} has uncommitted changes; commit or stash them first")
    baseline, _, baseline_tail = run_tests(mutation.tests, timeout_s)
    path = REPO / mutation.path
    try:
        path.write_text(original.replace(mutation.old, mutation.new))
        status, seconds, tail = run_tests(mutation.tests, timeout_s)
    finally:
        path.write_text(original)
    if baseline != 0:
        verdict = "baseline failed"
    elif status == 1:
        verdict = "caught"
    elif status == 0:
        verdict = "MISSED"
    else:
        verdict = f"error (pytest exit {status})"
    return {"name": mutation.name, "bug": mutation.bug, "tests": list(mutation.tests), "verdict": verdict,
            "seconds": round(seconds, 1), "output": tail,
            "baseline_output": baseline_tail if baseline else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per pytest run (default 900)")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"mutation_smoke: no mutation {unknown[0]!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] if args.names else list(MUTATIONS)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.bug}\n  {m.path}\n  guarded by: {' '.join(m.tests)}")
        return 0
    for m in chosen:
        check_applicable(m)
    results = []
    for m in chosen:
        result = smoke(m, args.timeout)
        results.append(result)
        print(f"{m.name:<22} {result['verdict']:<16} {result['seconds']:>6} s", flush=True)
    print()
    print("| mutation | bug class | guarding tests | verdict |\n|---|---|---|---|")
    for r in results:
        tests = "<br>".join(f"`{t}`" for t in r["tests"])
        print(f"| {r['name']} | {r['bug']} | {tests} | {r['verdict']} |")
    caught = sum(r["verdict"] == "caught" for r in results)
    print(f"\n{caught} of {len(results)} mutations caught")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

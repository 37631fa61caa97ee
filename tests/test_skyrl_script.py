"""SkyRL launch scripts read as they are (issue 75): shell defaults the environment overrides, the
entry point a script starts, its ``key=value`` overrides each with its line, the command line's
overrides last, and every malformed script refused in one line naming its line. In process: the
reader runs no shell, and ``corerl validate`` is called as a function."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corerl.cli import main
from corerl.config.dialects.skyrl import entry_points, script
from corerl.config.dialects.skyrl.values import parse_override
from corerl.errors import ConfigError
from tests.conftest import REPO
from tests.refusals import refused_in_one_line

#: SkyRL's corpus (its examples' launch scripts): CORERL_SKYRL_CORPUS, else the copy beside this checkout
CORPUS = Path(os.environ.get("CORERL_SKYRL_CORPUS") or REPO.parent / "shared" / "skyrl")
needs_corpus = pytest.mark.skipif(not (CORPUS / "examples").is_dir(),
                                  reason=f"SkyRL's corpus is not at {CORPUS} (set CORERL_SKYRL_CORPUS)")
ENV = {"HOME": "/home/someone", "PATH": "/usr/bin"}
GSM8K = "examples/train/gsm8k/run_gsm8k.sh"


def _script(tmp_path: Path, body: str, name: str = "run.sh") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def _values(launch: script.LaunchScript) -> dict[str, object]:
    return {o.key: o.value for o in launch.overrides}


def _line_of(path: Path, origin: str) -> str:
    return path.read_text().splitlines()[int(origin.rsplit(":", 1)[1]) - 1]


@needs_corpus
def test_a_corpus_script_is_read_with_its_shell_defaults_and_each_override_keeps_its_line(monkeypatch):
    monkeypatch.chdir(CORPUS)
    launch = script.read(GSM8K, [], ENV)
    values = _values(launch)
    assert launch.entry_point.id == "main_base" and launch.line == f"{GSM8K}:19"
    assert values["trainer.placement.policy_num_gpus_per_node"] == 4  # : "${NUM_GPUS:=4}"
    assert values["data.train_data"] == ["/home/someone/data/gsm8k/train.parquet"]  # "$HOME" inside a default
    assert values["trainer.resume_mode"] is None and values["trainer.policy.optimizer_config.lr"] == 1.0e-6
    tree, origins = launch.tree()
    assert tree["trainer"]["epochs"] == 20
    assert "trainer.epochs=20" in _line_of(CORPUS / GSM8K, origins["trainer.epochs"])


@needs_corpus
def test_the_environment_overrides_a_scripts_shell_defaults_as_in_skyrl(monkeypatch):
    monkeypatch.chdir(CORPUS)
    launch = script.read(GSM8K, [], {**ENV, "NUM_GPUS": "1", "DATA_DIR": "/data/g"})
    values = _values(launch)
    assert values["trainer.placement.policy_num_gpus_per_node"] == 1
    assert values["generator.inference_engine.num_engines"] == 1
    assert values["data.val_data"] == ["/data/g/validation.parquet"]


@needs_corpus
def test_the_command_lines_overrides_are_the_scripts_dollar_at_and_win(monkeypatch):
    monkeypatch.chdir(CORPUS)
    launch = script.read(GSM8K, ["trainer.epochs=1", "trainer.run_name=mine"], ENV)
    tree, origins = launch.tree()
    assert tree["trainer"]["epochs"] == 1 and tree["trainer"]["run_name"] == "mine"
    assert origins["trainer.epochs"] == script.COMMAND_LINE


def test_the_command_line_wins_over_overrides_after_dollar_at_and_where_a_script_forgets_it(tmp_path):
    middle = _script(tmp_path, 'python -m skyrl.train.entrypoints.main_base trainer.epochs=3 "$@" trainer.seed=5\n')
    tree, origins = script.read(middle, ["trainer.seed=7"], ENV).tree()
    assert tree["trainer"] == {"epochs": 3, "seed": 7} and origins["trainer.seed"] == script.COMMAND_LINE
    forgot = _script(tmp_path, "python -m skyrl.train.entrypoints.main_base trainer.epochs=3\n", "forgot.sh")
    assert script.read(forgot, ["trainer.epochs=1"], ENV).tree()[0]["trainer"]["epochs"] == 1
    assert script.read(forgot, [], ENV).tree()[0]["trainer"]["epochs"] == 3
    cut = _script(tmp_path, "python -m skyrl.train.entrypoints.main_base \\\n  trainer.epochs=3\n  $@\n", "cut.sh")
    launch = script.read(cut, ["trainer.epochs=1"], ENV)  # $@ on a line of its own: a continuation forgotten
    assert launch.tree()[0]["trainer"]["epochs"] == 1 and launch.warnings == ()


@pytest.mark.parametrize(("command", "entry"), [
    ("uv run --isolated --extra fsdp -m skyrl.train.entrypoints.main_base", "main_base"),
    ("uv run --isolated --frozen --extra megatron --with blobfile -m skyrl.train.entrypoints.main_base", "main_base"),
    ("uv run --isolated --extra fsdp \\\n    python -m skyrl.train.main_sft", "sft"),
    ("python -m skyrl.train.main_sft", "sft"),
    ("uv run --isolated --extra megatron -m examples.train.algorithms.dapo.main_dapo", "dapo"),
    ('uv run --with "transformers==5.4.0" --extra fsdp examples/train/algorithms/dapo/main_dapo.py', "dapo"),
    ("python3 ./examples/train/fully_async/main_fully_async.py", "fully_async"),
    ("SKYRL_RAY_PG_TIMEOUT_IN_S=300 uv run --isolated --extra fsdp -m examples.train.async.main_async", "async"),
    ('"$PY" -u -m examples.train.on_policy_distillation.main_on_policy_distill', "on_policy_distillation"),
    ("uv run --isolated --extra fsdp -m skyrl.train.entrypoints.main_generate", "generate"),
])
def test_each_form_of_the_training_command_names_its_entry_point(tmp_path, command, entry):
    path = _script(tmp_path, f'set -x\nPY=/usr/bin/python3.12\n{command} \\\n  trainer.epochs=2 \\\n  "$@"\n')
    launch = script.read(path, [], ENV)
    assert launch.entry_point.id == entry
    assert [(o.key, o.value) for o in launch.overrides] == [("trainer.epochs", 2)]
    assert entry_points.by_id(entry).module == entry_points.module_of(launch.entry_point.module)


def test_the_shell_a_launch_script_uses_is_followed(tmp_path):
    path = _script(tmp_path, """#!/usr/bin/env bash
set -euxo pipefail
# a comment with $HOME and 'quotes'
: "${N:=4}"
: "${OUT:="$HOME/out"}"
export MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
TWO="generator.batched=true generator.max_turns=3"
LOGS=~/logs
if [ "$MULTI" = "true" ]; then
  MODE=multi
elif [ -z "${OTHER:-}" ]; then
  MODE=single
else
  MODE=other
fi
mkdir -p "$OUT" && echo "starting" | tee /dev/null
uv run --isolated --extra fsdp -m skyrl.train.entrypoints.main_base \\
  trainer.policy.model.path="$MODEL" \\
  trainer.ckpt_path=~/ckpts \\
  trainer.log_path=$LOGS \\
  trainer.export_path='$OUT/not/expanded' \\
  trainer.run_name="run-${MODE}-${N}" \\
  trainer.algorithm.max_seq_len=$(( N * (512 + 512) )) \\
  trainer.project_name="p${UNSET:+x}" \\
  data.train_data="['$OUT/train.parquet']" \\
  generator.sampling_params.stop='["</answer>"]' \\
  $TWO \\
  $@
""")
    values = _values(script.read(path, [], ENV))
    assert values == {
        "trainer.policy.model.path": "Qwen/Qwen2.5-0.5B-Instruct", "trainer.ckpt_path": "~/ckpts",  # not a shell name: bash leaves it
        "trainer.log_path": "/home/someone/logs",
        "trainer.export_path": "$OUT/not/expanded", "trainer.run_name": "run-single-4",
        "trainer.algorithm.max_seq_len": 4096, "trainer.project_name": "p",
        "data.train_data": ["/home/someone/out/train.parquet"], "generator.sampling_params.stop": ["</answer>"],
        "generator.batched": True, "generator.max_turns": 3}
    assert _values(script.read(path, [], {**ENV, "MULTI": "true", "N": "1"}))["trainer.run_name"] == "run-multi-1"


def test_a_script_starting_another_passes_its_overrides_and_the_command_lines_through(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    base = _script(tmp_path / "examples", ': "${N:=4}"\npython -m skyrl.train.entrypoints.main_base \\\n'
                                          "  trainer.epochs=$N \\\n  trainer.seed=1 \\\n  $@\n", "base.sh")
    wrapper = _script(tmp_path, "# runs the base with one more key\nN=2 bash examples/base.sh \\\n"
                                "  trainer.seed=2 \\\n  \"$@\"\n", "wrapper.sh")
    launch = script.read(wrapper, ["trainer.epochs=9"], ENV)
    tree, origins = launch.tree()
    assert tree["trainer"] == {"epochs": 9, "seed": 2}
    assert origins["trainer.seed"] == f"{wrapper}:3" and origins["trainer.epochs"] == script.COMMAND_LINE
    assert script.read(wrapper, [], ENV).tree()[0]["trainer"]["epochs"] == 2  # N=2 reaches the script it starts
    assert launch.line == f"{os.path.relpath(base)}:2"


def test_commands_besides_the_training_command_are_not_run_and_are_named(tmp_path):
    marker = tmp_path / "ran"
    path = _script(tmp_path, f"touch {marker}\nuv run examples/gsm8k_dataset.py --output_dir /tmp/x\n"
                             f"X=$(touch {marker}; echo 1)\n"
                             "python -m skyrl.train.entrypoints.main_base trainer.epochs=1\n")
    launch = script.read(path, [], ENV)
    assert not marker.exists()
    assert [w.split(": ")[0] for w in launch.warnings] == [f"{path}:1", f"{path}:2"]
    assert "gsm8k_dataset.py" in launch.warnings[1] and "run it yourself" in launch.warnings[1]


@pytest.mark.parametrize(("text", "value"), [
    ("a.b=null", None), ("a.b=True", True), ("a.b=1.0e-6", 1.0e-6), ("a.b=1e-6", 1.0e-6), ("a.b=12", 12),
    ("a.b=['x','y']", ["x", "y"]), ('a.b=["</s>", "</a>"]', ["</s>", "</a>"]), ("a.b={k: 1}", {"k": 1}),
    ("a.b=train[:200]", "train[:200]"), ("a.b=", None), ("a.b='1'", "1"), ("a.b=Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B"),
])
def test_override_values_are_read_as_skyrl_reads_them(text, value):
    assert parse_override(text, "x.sh:1").value == value


def _refused(capsys, tmp_path: Path, body: str, *extra: str, env: dict[str, str] | None = None) -> str:
    path = _script(tmp_path, body)
    saved = dict(os.environ)
    try:
        os.environ.update(env or {})
        code = main(["validate", "--recipe-only", str(path), *extra])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return refused_in_one_line((code, capsys.readouterr().err), f"{path}:")


@pytest.mark.parametrize(("body", "extra", "says"), [
    ("set -x\nuv run --isolated -m my.own.main_x \\\n  trainer.epochs=2\n", (),
     ["unknown SkyRL entry point 'my.own.main_x'", "skyrl.train.entrypoints.main_base", "main_dapo", "run.sh:2)"]),
    ("python -m skyrl.train.entrypoints.main_base \\\n  trainer.epochs=2 \\\n  --epochs 3\n", (),
     ["'--epochs' is not a key=value override", "run.sh:3)"]),
    ("python -m skyrl.train.entrypoints.main_base \\\n  trainer.x=[a\n", (), ["trainer.x: cannot read the value", "run.sh:2)"]),
    ("python -m skyrl.train.entrypoints.main_base \\\n  +trainer.new_key=1\n", (), ["adds a key", "run.sh:2)"]),
    ("python -m skyrl.train.entrypoints.main_base \\\n  9bad=1\n", (), ["'9bad=1' is not a key=value override"]),
    (': "${SYNC_DIR:?Set SYNC_DIR to a shared path}"\npython -m skyrl.train.entrypoints.main_base trainer.epochs=1\n',
     (), ["SYNC_DIR is not set: Set SYNC_DIR to a shared path", "SYNC_DIR=... corerl run", "run.sh:1)"]),
    ("python -m skyrl.train.entrypoints.main_base trainer.epochs=1\npython -m skyrl.train.main_sft num_steps=1\n", (),
     ["two training commands", "run.sh:1 and", "run.sh:2)"]),
    ("uv run examples/gsm8k/gsm8k_dataset.py --output_dir /tmp/g\n", (),
     ["no training command", "gsm8k_dataset.py", "run.sh:1)"]),
    ("uv run -m skyrl.train.entrypoints.serve trainer.policy.model.path=m\n", (),
     ["no training command", "corerl serve-generation", "run.sh --port N", "run_engines_locally=false"]),
    ("for n in 1 2; do\n  echo $n\ndone\n", (), ["a `for` loop", "runs no shell code", "run.sh:1)"]),
    ("start() {\n  echo\n}\n", (), ["a function", "run.sh:1)"]),
    ("R=$(git rev-parse HEAD)\npython -m skyrl.train.entrypoints.main_base \\\n  trainer.run_name=$R\n", (),
     ["'trainer.run_name' takes its value from `$(git rev-parse HEAD)`", "run.sh:1)", "run.sh:3)"]),
    ("if [ -q x ]; then\n  A=1\nfi\n", (), ["the test `[ -q x ]`", "run.sh:1)"]),
    ("python -m skyrl.train.entrypoints.main_base \\\n  trainer.epochs=2 \\\n  trainer.epoch=3\n", (),
     ["trainer.epoch", "did you mean trainer.epochs", "run.sh:3)"]),
])
def test_a_malformed_script_is_refused_in_one_line_naming_its_line(tmp_path, capsys, body, extra, says):
    line = _refused(capsys, tmp_path, body, *extra)
    for text in says:
        assert text in line, (text, line)


def test_a_malformed_override_on_the_command_line_says_so(tmp_path, capsys):
    path = _script(tmp_path, "python -m skyrl.train.entrypoints.main_base trainer.epochs=2 $@\n")
    code = main(["validate", "--recipe-only", str(path), "trainer.x=[a"])
    refused_in_one_line((code, capsys.readouterr().err), "trainer.x: cannot read the value", "(command line)")


def test_a_command_substitution_corerl_can_work_out_is_not_refused(tmp_path):
    path = _script(tmp_path, 'HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"\n'
                             ': "${RUN:=r-$(date +%Y)}"\npython -m skyrl.train.entrypoints.main_base '
                             'trainer.ckpt_path="$HERE/ckpt" trainer.run_name=$RUN\n')
    values = _values(script.read(path, [], ENV))
    assert values["trainer.ckpt_path"] == f"{tmp_path}/ckpt" and str(values["trainer.run_name"]).startswith("r-20")


def test_overrides_given_by_hand_name_the_entry_points_module(tmp_path, capsys):
    launch = script.by_hand("skyrl.train.entrypoints.main_base", ["trainer.epochs=2"])
    assert launch.entry_point.id == "main_base" and launch.tree() == ({"trainer": {"epochs": 2}},
                                                                      {"trainer.epochs": script.COMMAND_LINE})
    assert script.is_launch_target("skyrl.train.main_sft") and script.is_launch_target("x/run.sh")
    assert not script.is_launch_target("recipe.yaml")
    code = main(["validate", "--recipe-only", "--dialect", "skyrl", "trainer.epoch=2"])
    refused_in_one_line((code, capsys.readouterr().err), "did you mean trainer.epochs", "(command line)")


@needs_corpus
def test_every_corpus_script_is_read_or_refused_in_one_line_for_a_stated_reason(monkeypatch):
    monkeypatch.chdir(CORPUS)
    scripts = sorted(Path("examples").rglob("*.sh"))
    assert len(scripts) == 129
    read, refused = [], {}
    for path in scripts:
        try:
            read.append(script.read(path, [], ENV))
        except ConfigError as exc:
            line = exc.one_line()
            assert "\n" not in line and exc.source and str(path) in exc.source, line
            refused[str(path)] = line
    # the rest: data-preparation, server and cluster-orchestration scripts, ones needing a variable set
    # (SYNC_DIR, EXTERNAL_PROXY_URL) and visgym's own --env_variant flag
    assert len(read) >= 111, sorted(refused.items())
    for path, line in refused.items():
        assert any(reason in line for reason in ("no training command", "is not set", "runs no shell code",
                                                 "is not a key=value override")), (path, line)
    assert {launch.entry_point.id for launch in read} >= {"main_base", "dapo", "sft", "fully_async",
                                                           "on_policy_distillation", "dapo_fully_async", "generate"}


def test_validate_explains_what_each_key_of_a_script_does(tmp_path, capsys):
    path = _script(tmp_path, ': "${BATCH:=512}"\nuv run --isolated --extra fsdp -m skyrl.train.entrypoints.main_base \\\n'
                             "  trainer.policy.model.path=Qwen/Qwen2.5-0.5B-Instruct \\\n"
                             "  trainer.train_batch_size=$BATCH \\\n  trainer.logger=console \\\n  $@\n", "launch")
    assert main(["validate", "--recipe-only", "--explain", "--dialect", "skyrl", str(path), "trainer.seed=3"]) == 0
    out = capsys.readouterr().out
    assert "(skyrl dialect)" in out and "trainer.train_batch_size -> algorithm.batch_size" in out
    assert "trainer.logger: " in out  # inert, with its reason
    code = main(["validate", "--recipe-only", "--dialect", "skyrl", "--preset", "quick", str(path)])
    refused_in_one_line((code, capsys.readouterr().err), "--preset lays a preset over a corerl recipe")


# --- arrays, here-documents and an entry point's own flags ------------------------------------------


def test_an_array_is_read_as_bash_reads_it_and_each_element_keeps_its_line(tmp_path):
    path = _script(tmp_path, """D="generator.batched=true generator.n_samples_per_prompt=4"
ARGS=(trainer.epochs=2 "trainer.run_name=a b"  # a comment between elements
      $D)
ARGS+=("trainer.seed=$(( 3 + 4 ))")
EMPTY=()
declare -a MORE=(generator.max_turns=3)
FIRST=$ARGS
JOINED="${ARGS[*]}"
N=${#ARGS[@]}
KEYS="${!ARGS[@]}"
CNT=0
CNT+=1
SET[2]=generator.max_turns=5
SET[0]=trainer.seed=1
python -m skyrl.train.entrypoints.main_base \\
  "${ARGS[0]}" "${EMPTY[@]}" "${ARGS[@]}" ${MORE[@]} ${SET[@]} \\
  trainer.project_name="$FIRST|${ARGS[-1]}|$N|$KEYS|$CNT|${#ARGS[1]}|${ARGS[$((N - 4))]}" \\
  trainer.export_path="${ARGS[9]:-none}" \\
  trainer.log_path="$JOINED"
""")
    launch = script.read(path, [], ENV)
    lines = [(o.key, o.value, int(o.origin.rsplit(":", 1)[1])) for o in launch.overrides]
    assert lines[:9] == [("trainer.epochs", 2, 16),  # ${ARGS[0]}: where it is used; "${EMPTY[@]}": no word
                         ("trainer.epochs", 2, 2), ("trainer.run_name", "a b", 2),  # "${ARGS[@]}": where written
                         ("generator.batched", True, 3), ("generator.n_samples_per_prompt", 4, 3),  # $D split
                         ("trainer.seed", 7, 4), ("generator.max_turns", 3, 6),
                         ("trainer.seed", 1, 14), ("generator.max_turns", 5, 13)]  # SET[1] is empty: no word
    values = _values(launch)
    assert values["trainer.project_name"] == "trainer.epochs=2|trainer.seed=7|5|0 1 2 3 4|01|20|trainer.run_name=a b"
    assert values["trainer.export_path"] == "none"
    assert values["trainer.log_path"] == ("trainer.epochs=2 trainer.run_name=a b generator.batched=true "
                                          "generator.n_samples_per_prompt=4 trainer.seed=7")


def test_an_array_in_an_untaken_branch_and_a_script_started_by_bash_which_inherits_no_array(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _script(tmp_path, 'python -m skyrl.train.entrypoints.main_base trainer.epochs=1 "${EXTRA[@]}" "$@"\n', "base.sh")
    path = _script(tmp_path, """EXTRA=()
if [ -n "${RESUME:-}" ]; then
  EXTRA+=("trainer.resume_path=$RESUME")
fi
export EXTRA
bash base.sh "${EXTRA[@]}"
""")
    assert _values(script.read(path, [], ENV)) == {"trainer.epochs": 1}
    launch = script.read(path, [], {**ENV, "RESUME": "/ckpt"})
    assert _values(launch)["trainer.resume_path"] == "/ckpt"  # passed as an argument, not inherited
    assert launch.overrides[-1].origin == f"{path}:3"


def test_a_here_document_is_kept_on_the_command_it_feeds_and_not_read_as_commands(tmp_path):
    path = _script(tmp_path, """N=2
cat > notes.txt <<EOF
for x in \\$(ls); do rm -rf "$N"; done
EOF
python - <<'PY' "$N"
import sys; print(sys.argv)
PY
\tcat <<-END
\t\tcase $N in *) ;; esac
\tEND
python -m skyrl.train.entrypoints.main_base trainer.epochs=$N
""")
    launch = script.read(path, [], ENV)
    assert _values(launch) == {"trainer.epochs": 2} and launch.line == f"{path}:11"
    assert [w.split(": ")[0] for w in launch.warnings] == [f"{path}:2", f"{path}:5", f"{path}:8"]
    assert "(fed the here-document of line 5)" in launch.warnings[1]


def test_a_here_document_fed_to_bash_is_the_script_it_follows(tmp_path):
    path = _script(tmp_path, """export N=3
M=4
bash -s -- trainer.seed=9 <<EOF
python -m skyrl.train.entrypoints.main_base \\\\
  trainer.epochs=\\$N \\\\
  trainer.max_prompt_length=$M \\\\
  "\\$@"
EOF
""")
    launch = script.read(path, [], ENV)
    assert _values(launch) == {"trainer.epochs": 3, "trainer.max_prompt_length": 4, "trainer.seed": 9}
    assert launch.line == f"{path}:4" and launch.overrides[0].origin == f"{path}:5"
    quoted = _script(tmp_path, "bash <<'EOF'\npython -m skyrl.train.entrypoints.main_base trainer.epochs=${N:-5}\n"
                               "EOF\n", "quoted.sh")
    assert _values(script.read(quoted, [], {**ENV, "N": "6"})) == {"trainer.epochs": 6}  # expanded by the child


@needs_corpus
def test_visgyms_env_variant_is_its_entry_points_own_flag_and_is_kept_apart_from_the_keys(monkeypatch):
    monkeypatch.chdir(CORPUS)
    launch = script.read("examples/train/visgym/run_visgym_from_instruct.sh", [], ENV)
    assert launch.entry_point.id == "visgym"
    assert launch.flags == (("--env_variant", "instruct", "examples/train/visgym/run_visgym_from_instruct.sh:50"),)
    assert not any(o.key.startswith("-") for o in launch.overrides)
    assert _values(launch)["environment.env_class"] == "visgym"


def test_an_entry_points_own_flag_may_come_with_an_equals_sign_or_from_the_command_line(tmp_path):
    path = _script(tmp_path, "python examples/train/visgym/entrypoint.py --env_variant=sft trainer.epochs=1 \"$@\"\n")
    launch = script.read(path, [], ENV)
    assert launch.flags == (("--env_variant", "sft", f"{path}:1"),) and _values(launch) == {"trainer.epochs": 1}
    bare = _script(tmp_path, "python examples/train/visgym/entrypoint.py trainer.epochs=1 \"$@\"\n", "bare.sh")
    assert script.read(bare, ["--env_variant", "instruct"], ENV).flags == (
        ("--env_variant", "instruct", script.COMMAND_LINE),)


@pytest.mark.parametrize(("body", "says"), [
    ("N=1\ncat <<EOF\nno end line\n", ["a here-document with no end line (EOF)", "run.sh:2)"]),
    ("cat <<$END\nx\n$END\n", ["a here-document whose end word corerl does not read", "run.sh:1)"]),
    ("A=(trainer.epochs=1\n  trainer.seed=2\n", ["an array with no closing `)`", "run.sh:1)"]),
    ("A=(a\n  b | c)\n", ["`|` inside an array", "run.sh:2)"]),
    ("A=(1 2)\npython -m skyrl.train.entrypoints.main_base trainer.epochs=${A[$(nproc)]}\n",
     ["'trainer.epochs' takes its value from `$(nproc)`", "run.sh:2)"]),
    ("python examples/train/visgym/entrypoint.py \\\n  --env_variant chat \\\n  trainer.epochs=1\n",
     ["--env_variant 'chat' is not one of examples.train.visgym.entrypoint's choices (sft, instruct)", "run.sh:2)"]),
    ("python examples/train/visgym/entrypoint.py trainer.epochs=1 \\\n  --env_variant\n",
     ["--env_variant of examples.train.visgym.entrypoint has no value", "run.sh:2)"]),
    ("python examples/train/visgym/entrypoint.py \\\n  trainer.epochs=1\n",
     ["examples.train.visgym.entrypoint needs --env_variant (sft or instruct)", "run.sh:1)"]),
    ("declare -A SIZES=([a]=1)\n", ["an associative array", "run.sh:1)"]),
    ("A=(x)\nA[-3]=y\n", ["A[-3]: the index is before the array's first element", "run.sh:2)"]),
    ("python -m skyrl.train.entrypoints.main_base \\\n  --env_variant sft \\\n  trainer.epochs=1\n",
     ["'--env_variant' is not a key=value override of skyrl.train.entrypoints.main_base", "run.sh:2)"]),
])
def test_a_malformed_array_here_document_or_entry_point_flag_is_refused_in_one_line_naming_its_line(
        tmp_path, capsys, body, says):
    line = _refused(capsys, tmp_path, body)
    for text in says:
        assert text in line, (text, line)

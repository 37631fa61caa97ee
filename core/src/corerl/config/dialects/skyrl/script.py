"""Reading a SkyRL launch script as it is, without running it (issue 75).

A SkyRL launch script (``examples/train/gsm8k/run_gsm8k.sh``) sets shell variables and starts one
entry point with ``key=value`` overrides. :func:`read` follows it the way bash would, for the part
of the shell such scripts use, and runs nothing (a recipe must not run code):

- comments, ``set -x``, backslash line continuations, ``;``, ``&&``/``||`` lists and pipes;
- ``NAME=value`` and ``export NAME=value`` assignments, ``unset``, and ``: "${NAME:=default}"``
  defaults: the environment corerl runs in is the script's, so ``NUM_GPUS=1 corerl run
  run_gsm8k.sh`` overrides ``: "${NUM_GPUS:=4}"`` as it does in SkyRL;
- expansion of ``$NAME``, ``${NAME}``, ``${NAME:-word}``, ``${NAME:=word}``, ``${NAME:?message}``
  (unset: refused with the message), ``${NAME:+word}``, ``$HOME``, ``~``, ``$0``, ``$1``...,
  ``$@`` in bare words and double quotes (single quotes stay literal; unquoted expansions split
  into words, as bash splits them); ``$(dirname ...)``, ``$(cd DIR && pwd)``, ``$(pwd)`` and
  ``$(date +FORMAT)`` are worked out; any other command substitution is left unrun, and the
  script is refused only where such a value reaches the training command;
- arrays, as bash has them: ``A=(a "b c" $D)``, ``A+=(...)``, ``A[i]=x``, ``declare -a``, and
  ``"${A[@]}"`` (one word per element, each keeping the line it was written on), ``${A[*]}``,
  ``${A[i]}``, ``$A``, ``${#A[@]}`` and ``${!A[@]}``; a script started with ``bash`` inherits none;
- here-documents (:mod:`~corerl.config.dialects.skyrl.shell_syntax`): the body is the input of the
  command it feeds, not commands; one fed to ``bash``/``sh`` is the script that shell follows;
- ``if``/``elif``/``else`` over ``[ ... ]``/``[[ ... ]]`` tests (``=``, ``!=``, ``-z``, ``-n``, file
  tests, numeric comparisons), so a knob such as ``USE_CONVERSATION_MULTI_TURN=true`` picks its branch;
- ``bash OTHER.sh key=value "$@"`` (a script that starts another with more overrides) and
  ``source``: the other script is read in turn (found beside the script, or from the SkyRL
  checkout's root the script sits in, as SkyRL runs its scripts from there);
- the **training command**: a Python launch (``uv run [options] -m MODULE``, ``uv run [options]
  python -m MODULE``, ``python -m MODULE``, ``python path/main_x.py``, ``uv run path/main_x.py``)
  whose module is a SkyRL entry point or that is given ``key=value`` overrides. Its module is its
  entry point (:mod:`~corerl.config.dialects.skyrl.entry_points`) and each override keeps its line.
  The flags an example's own module reads before SkyRL's config (visgym's ``--env_variant``) are
  checked against their choices and kept apart (:attr:`LaunchScript.flags`).

Other commands (``echo``, ``mkdir``, a dataset script the script runs first, a server it starts)
are not run; the ones that would have made something are listed as warnings. A script must start
exactly one training command: one starting none (a data-preparation or server script) or several
is refused in one line naming them. Loops, ``case``, functions and associative arrays are refused
in one line naming their line: corerl follows a launch script, it does not run one.

The overrides given after the script (``corerl run run_gsm8k.sh trainer.epochs=1``) are the
script's ``$@``: they are applied after the script's own overrides, so they always win (as they do
in SkyRL's scripts, which end with ``$@``), even in a script that forgets its ``$@``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from corerl.config.dialects.skyrl import entry_points
from corerl.config.dialects.skyrl.entry_points import EntryPoint
from corerl.config.dialects.skyrl.shell_syntax import (
    Heredoc,
    If,
    Lexer,
    Parser,
    Simple,
    Word,
    assignment,
)
from corerl.config.dialects.skyrl.values import Override, parse_override, tree_of
from corerl.errors import ConfigError

__all__ = ["COMMAND_LINE", "LaunchScript", "by_hand", "is_launch_target", "read"]

#: where an override given on corerl's command line (a script's ``$@``) comes from
COMMAND_LINE = "command line"
_MARK = "\x00"  # brackets the index of an unrun command substitution inside an expanded word
_QUIET = {"set", "echo", "printf", "mkdir", "true", "cd", "sleep", "ulimit", "shift", "local", "ls", "nvidia-smi",
          "export", "unset", ":", "wait", "trap", "return"}
_UV_VALUED = {"--extra", "--with", "--env-file", "--python", "-p", "--project", "--directory", "--group", "--package",
              "--with-requirements", "--with-editable", "--index", "--index-url", "--extra-index-url", "--only-group",
              "--no-extra", "--config-file", "--cache-dir"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_PY_VALUED = {"-X", "-W", "-c"}
#: the flags an example's own main module reads (argparse's parse_known_args) before SkyRL's config
#: reads the rest: entry point -> flag -> its choices (each required). visgym's --env_variant picks the
#: environment registered as ``visgym``: sft (env_sft: tuple actions) or instruct (env_instruct: keywords)
_ENTRY_FLAGS = {"visgym": {"--env_variant": ("sft", "instruct")}}


@attrs.frozen
class LaunchScript:
    """What a launch script starts: its entry point, its overrides (in order, the command
    line's last) and the commands it does not run."""

    source: str  #: the script, as given
    entry_point: EntryPoint
    line: str  #: where the training command starts (``script:line``)
    overrides: tuple[Override, ...]
    warnings: tuple[str, ...] = ()
    #: the flags the entry point's own module reads (``--env_variant instruct``): (flag, value, where)
    flags: tuple[tuple[str, str, str], ...] = ()

    def tree(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The overrides as SkyRL's nested tree, and each dotted key's origin."""
        return tree_of(self.overrides)


def is_launch_target(target: str) -> bool:
    """Whether ``corerl run TARGET`` names SkyRL's dialect: a ``.sh`` launch script, or the
    module of a SkyRL entry point (``skyrl.train.entrypoints.main_base``) that is not a file."""
    return target.endswith(".sh") or (not os.path.exists(target) and entry_points.by_module(target) is not None)


def by_hand(module: str, overrides: Sequence[str]) -> LaunchScript:
    """What ``python -m MODULE key=value ...`` would start, given by hand (``corerl run
    MODULE key=value ...``): the overrides come from the command line."""
    entry = entry_points.resolve(module, COMMAND_LINE)
    parsed = tuple(parse_override(text, COMMAND_LINE) for text in overrides)
    return LaunchScript(module, entry, COMMAND_LINE, parsed)


def read(path: str | Path, extra: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> LaunchScript:
    """Follow the launch script at ``path`` (see the module's docstring) with ``extra`` as its
    ``$@`` and ``environ`` (default: this process's) as its environment."""
    source = str(path)
    if not Path(source).is_file():
        raise ConfigError(f"no such launch script: {source}", hint="give the path of a SkyRL run_*.sh script")
    shell = _Shell(dict(os.environ if environ is None else environ))
    shell.run_file(Path(source), source, [(text, COMMAND_LINE) for text in extra])
    if shell.training is None:
        ran = "; ".join(shell.helpers[:3]) or "nothing"
        hint = ("give the script that trains (a run_*.sh ending in an entry point with key=value overrides); run a "
                "data or server script yourself")
        if any("skyrl.train.entrypoints.serve" in command for command in shell.helpers):
            hint = (f"it starts SkyRL's inference server: corerl's is `corerl serve-generation {source} --port N`, "
                    "and a training script reaches it with generator.inference_engine.run_engines_locally=false and "
                    "external_server_urls")
        raise ConfigError(f"no training command: the script starts no SkyRL entry point (it runs {ran})",
                          source=source, hint=hint)
    entry, where, words, flags = shell.training
    mine = [(t, o) for t, o in words if o != COMMAND_LINE]
    given = [(t, o) for t, o in words if o == COMMAND_LINE]
    if extra and not given and all(o != COMMAND_LINE for *_, o in flags):  # it forgot its $@: the command line wins
        given = [(t, COMMAND_LINE) for t in extra]
    overrides = tuple(parse_override(text, origin) for text, origin in [*mine, *given])
    return LaunchScript(source, entry, where, overrides, tuple(shell.warnings), tuple(flags))


# --- following: variables, expansion, commands ---------------------------------------------------


class _Stop(Exception):
    """``exit`` in a script: nothing after it is followed."""


class _Shell:
    def __init__(self, environ: dict[str, str]) -> None:
        self.vars = dict(environ)
        self.arrays: dict[str, list[tuple[str, str]]] = {}  # NAME=(...): each element with where it was written
        self.exported = set(environ)
        self.training: tuple[EntryPoint, str, list[tuple[str, str]], list[tuple[str, str, str]]] | None = None
        self.helpers: list[str] = []
        self.warnings: list[str] = []
        self.unrun: list[tuple[str, str]] = []  # (command substitution, where): what a marked word holds
        self.depth = 0

    # files

    def run_file(self, path: Path, shown: str, args: list[tuple[str, str]], text: str | None = None,
                 first_line: int = 1) -> None:
        """Follow a script (``text``, or the file at ``path``) as ``shown`` with ``args`` as its ``$@``."""
        self.depth += 1
        if self.depth > 8:
            raise ConfigError("launch scripts start each other more than 8 deep", source=shown)
        lexer = Lexer(path.read_text(errors="replace") if text is None else text, shown, first_line)
        statements = Parser(lexer.tokens(), lexer).statements()
        saved = (self.path, self.shown, self.args) if self.depth > 1 else None
        self.path, self.shown, self.args = path, shown, args
        try:
            self.block(statements)
        except _Stop:
            pass
        finally:
            if saved is not None:
                self.path, self.shown, self.args = saved
            self.depth -= 1

    def at(self, line: int) -> str:
        return f"{self.shown}:{line}"

    def block(self, statements: list[Any]) -> bool:
        status = True
        for chain in statements:
            status = self.chain(chain)
        return status

    def chain(self, chain: list[tuple[str, Any]]) -> bool:
        status = True
        for op, command in chain:
            if (op == "&&" and not status) or (op == "||" and status):
                continue
            status = self.command(command)
        return status

    def command(self, command: Any) -> bool:
        if isinstance(command, If):
            for condition, body in command.branches:
                if not condition or self.block(condition):
                    return self.block(body)
            return True
        return self.simple(command)

    # expansion

    def expand(self, word: Word, split: bool = True) -> list[tuple[str, str]]:
        """The fields a word expands to, each with its origin (``$@``'s keep theirs)."""
        fields: list[list[Any]] = []  # [text, origin, started]
        current: list[Any] = ["", self.at(word.line), False]

        def add(text: str, splittable: bool) -> None:
            nonlocal current
            if not (splittable and split):
                current[0] += text
                current[2] = True
                return
            pieces = re.split(r"[ \t\n]+", text)
            for n, piece in enumerate(pieces):
                if n:
                    if current[2] or current[0]:
                        fields.append(current)
                    current = ["", self.at(word.line), False]
                current[0] += piece
                if piece:
                    current[2] = True

        def walk(parts: list[tuple[Any, ...]], quoted: bool) -> None:
            nonlocal current
            for part in parts:
                kind = part[0]
                if kind == "lit":
                    add(part[1], False)
                elif kind == "sq":
                    add(part[1], False)
                    current[2] = True
                elif kind == "tilde":
                    add(self.vars.get("HOME", "~"), False)
                elif kind == "dq":
                    if not (len(part[1]) == 1 and (part[1][0][:3] in (("param", "@", ""), ("param", "*", ""))
                                                   or self.elements(part[1][0], word.line) is not None)):
                        current[2] = True  # "" is a word; "$@" with no arguments is none, as is "${X[@]}"
                    walk(part[1], True)
                elif kind == "array":  # declare's argument A=(...) as a word: its text (declare assigns it)
                    add("(" + " ".join(t for element in part[1] for t, _ in self.expand(element)) + ")", False)
                elif kind == "cmd":
                    add(self.substitute(part[1], word.line), not quoted)
                elif kind == "arith":
                    add(self.arithmetic(part[1], word.line), not quoted)
                elif kind == "param" and part[1] in ("@", "*") and not part[2]:
                    for n, (text, origin) in enumerate(self.args):  # one word each, with its origin
                        if n:
                            fields.append(current)
                            current = ["", origin, False]
                        current[0], current[1], current[2] = current[0] + text, origin, True
                elif kind == "param" and (elements := self.elements(part, word.line)) is not None:
                    if not split:  # X="${A[@]}": the elements joined by blanks
                        add(" ".join(text for text, _ in elements), False)
                        continue
                    for n, (text, origin) in enumerate(elements):  # one word each ("${A[@]}"), or split
                        for k, piece in enumerate([text] if quoted else [p for p in re.split(r"[ \t\n]+", text) if p]):
                            if (n or k) and (current[2] or current[0]):
                                fields.append(current)
                                current = ["", origin, False]
                            current[0], current[1], current[2] = current[0] + piece, origin, True
                else:
                    add(self.parameter(part, word.line), not quoted)

        walk(word.parts, False)
        if current[2] or current[0]:
            fields.append(current)
        return [(text, origin) for text, origin, _ in fields]

    def text(self, word: Word) -> str:
        """A word expanded as an assignment's value is (no splitting)."""
        return "".join(text for text, _ in self.expand(word, split=False))

    def parameter(self, part: tuple[Any, ...], line: int) -> str:
        _, name, op, parts = part
        if name.startswith("#") and name.endswith(("[@]", "[*]")):  # ${#A[@]}: how many elements
            return str(len(self.array(name[1:-3], line)))
        if name.startswith("#") and len(name) > 1:
            return str(len(self.lookup(name[1:], line) or ""))
        value = self.lookup(name, line)
        unset = value is None or (op.startswith(":") and value == "")
        if op in ("", None):
            return value or ""
        word = Word(parts, line)
        if op in (":-", "-"):
            return self.text(word) if unset else value or ""
        if op in (":=", "="):
            if unset:
                self.vars[name] = self.text(word)
            return self.vars[name]
        if op in (":+", "+"):
            return "" if unset else self.text(word)
        if unset:  # :? and ?
            message = self.text(word) or "parameter null or not set"
            raise ConfigError(f"{name} is not set: {message}", source=self.at(line),
                              hint=f"set it in the environment: {name}=... corerl run {self.shown}")
        return value or ""

    def lookup(self, name: str, line: int = 0) -> str | None:
        if name in ("0", "BASH_SOURCE", "BASH_SOURCE[0]"):
            return str(self.path)
        if name.endswith("]"):  # ${A[i]}, ${A[@]}
            base, index = name[:-1].split("[", 1)
            values = [text for text, _ in self.array(base, line)]
            if index in ("@", "*"):
                return " ".join(values) if values else None
            n = self.arithmetic(index, line)
            if _MARK in n:
                return n
            return values[int(n)] if -len(values) <= int(n) < len(values) else None
        if name in self.arrays:  # $A is ${A[0]}
            return self.arrays[name][0][0] if self.arrays[name] else None
        if name.isdigit():
            n = int(name)
            return self.args[n - 1][0] if 0 < n <= len(self.args) else None
        if name == "#":
            return str(len(self.args))
        if name in ("@", "*"):
            return " ".join(text for text, _ in self.args)
        if name == "?":
            return "0"
        return self.vars.get(name)

    def array(self, name: str, line: int) -> list[tuple[str, str]]:
        """An array's elements, each with where it was written (a plain variable is an array of one)."""
        if name in self.arrays:
            return self.arrays[name]
        return [(self.vars[name], self.at(line))] if name in self.vars else []

    def elements(self, part: tuple[Any, ...], line: int) -> list[tuple[str, str]] | None:
        """What ``${A[@]}`` (or ``${!A[@]}``, the indices) expands to, one field each; None for
        another parameter."""
        if part[0] != "param" or part[2] or not (m := re.fullmatch(r"(!?)([A-Za-z_]\w*)\[@\]", part[1])):
            return None
        values = self.array(m.group(2), line)
        return [(str(n), self.at(line)) for n in range(len(values))] if m.group(1) else values

    def assign(self, name: str, value: Word, append: bool) -> None:
        """``NAME=value``, ``NAME+=value``, ``NAME=(a b ...)`` and ``NAME+=(...)``."""
        if value.parts and value.parts[0][0] == "array":
            elements = [field for word in value.parts[0][1] for field in self.expand(word)]
            self.arrays[name] = (self.array(name, value.line) if append else []) + elements
            self.vars.pop(name, None)
            return
        text = (self.lookup(name, value.line) or "") + self.text(value) if append else self.text(value)
        if element := re.fullmatch(r"(\w+)\[(.+)\]", name):  # A[i]=x
            index = self.arithmetic(element.group(2), value.line)
            if _MARK in index:
                raise self._unrun_error(index, self.at(value.line), f"the index of {element.group(1)}")
            values = list(self.array(element.group(1), value.line))
            n = int(index) + (len(values) if int(index) < 0 else 0)
            if n < 0:
                raise ConfigError(f"{name}: the index is before the array's first element", source=self.at(value.line),
                                  hint="index the array from 0")
            values += [("", self.at(value.line))] * (n + 1 - len(values))
            values[n] = (text, self.at(value.line))
            self.arrays[element.group(1)] = values
            self.vars.pop(element.group(1), None)
        elif self.arrays.get(name):  # A=x sets ${A[0]}
            self.arrays[name][0] = (text, self.at(value.line))
        else:
            self.vars[name] = text

    def substitute(self, command: str, line: int) -> str:
        """A command substitution's output where corerl can work it out without running anything
        (``dirname``, ``basename``, ``cd DIR && pwd``, ``pwd``, ``date +FORMAT``); otherwise a
        mark that refuses the script if it reaches the training command."""
        words = self._words_of(command, line)
        if words is not None:
            if words[:1] == ["dirname"] and len(words) >= 2:
                return os.path.dirname(words[-1]) or "."
            if words[:1] == ["basename"] and len(words) >= 2:
                return os.path.basename(words[-1])
            if words == ["pwd"]:
                return os.getcwd()
            if words[:1] == ["cd"] and words[-2:] == ["&&", "pwd"] and len(words) >= 4:
                target = Path(words[-3])
                return str(target if target.is_absolute() else (Path.cwd() / target).resolve())
            if words[:1] == ["date"] and len(words) == 2 and words[1].startswith("+"):
                return time.strftime(words[1][1:])
        self.unrun.append((command.strip(), self.at(line)))
        return f"{_MARK}{len(self.unrun) - 1}{_MARK}"

    def arithmetic(self, expression: str, line: int) -> str:
        """``$((...))``: integer arithmetic over numbers and variables (+ - * / % and brackets)."""
        import ast

        text = "".join(t for t, _ in self.expand(Word(Lexer(expression, self.shown).word(stop="\x01"), line),
                                                  split=False))
        if _MARK in text:  # $(( $(nproc) * 2 )): the command substitution it needs is what is unrun
            return f"{_MARK}{text.split(_MARK)[1]}{_MARK}"

        def value(node: ast.AST) -> int:
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            if isinstance(node, ast.Name):
                raw = self.vars.get(node.id, "0") or "0"
                return value(ast.parse(raw, mode="eval").body)
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
                return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
            if isinstance(node, ast.BinOp):
                left, right = value(node.left), value(node.right)
                if isinstance(node.op, ast.Add):
                    return left + right
                if isinstance(node.op, ast.Sub):
                    return left - right
                if isinstance(node.op, ast.Mult):
                    return left * right
                if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right:
                    quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
                    return quotient if not isinstance(node.op, ast.Mod) else left - right * quotient
            raise ValueError(ast.dump(node))

        try:
            return str(value(ast.parse(text.strip(), mode="eval").body))
        except (SyntaxError, ValueError, RecursionError):
            self.unrun.append((f"$(({expression}))", self.at(line)))
            return f"{_MARK}{len(self.unrun) - 1}{_MARK}"

    def _words_of(self, command: str, line: int) -> list[str] | None:
        try:
            lexer = Lexer(command, self.shown)
            tokens = lexer.tokens()
        except ConfigError:
            return None
        out = []
        for kind, value, _ in tokens:
            if kind == "word":
                out += [text for text, _ in self.expand(Word(value.parts, line))]
            elif value == "&&":
                out.append("&&")
            elif value != "\n":
                return None
        return [w for w in out if w != "--"]

    # commands

    def simple(self, command: Simple) -> bool:
        words = list(command.words)
        assignments = []
        while words and (m := assignment(words[0])):
            assignments.append(m)
            words.pop(0)
        if not words:
            for name, value, append in assignments:
                self.assign(name, value, append)
            return True
        prefix = {name: self.text(value) for name, value, _ in assignments}  # the command's environment only
        fields = [f for word in words for f in self.expand(word)]
        if not fields or all(origin == COMMAND_LINE for _, origin in fields):
            return True  # nothing, or a lone $@ (a line continuation forgotten before it): applied last anyway
        name = fields[0][0]
        args = [text for text, _ in fields[1:]]
        if name in ("export", "local", "declare", "readonly", "typeset"):
            if any(arg.startswith("-") and "A" in arg for arg in args):
                raise Lexer("", self.shown).fail("an associative array", command.line)
            for word in words[1:]:
                if m := assignment(word):
                    self.assign(*m)
                    self.exported.add(m[0])
                else:
                    self.exported.update(t for t, _ in self.expand(word) if not t.startswith("-"))
            return True
        if name == "unset":
            for arg in args:
                self.vars.pop(arg, None)
                self.arrays.pop(arg, None)
            return True
        if name == "exit":
            raise _Stop
        if name in ("[", "[[", "test"):
            return self.test(args[:-1] if name != "test" else args, command.line)
        if name == "false":
            return False
        if name in ("bash", "sh", "source", ".") and args and args[0].endswith(".sh"):
            return self.nested(name, fields[1:], prefix, command.line)
        if name in ("bash", "sh") and command.heredocs and "-c" not in args and all(a.startswith("-") for a in args[:1]):
            return self.fed(command.heredocs[-1], fields[1:], prefix)
        if name in _QUIET:
            return True
        launch = self.launch(fields, command.line)
        if launch is None:
            fed = f" (fed the here-document of line {command.heredocs[-1].line})" if command.heredocs else ""
            self.helpers.append(f"`{' '.join(t for t, _ in fields)[:80]}` ({self.at(command.line)})")
            self.warnings.append(f"{self.at(command.line)}: `{' '.join(t for t, _ in fields)[:80]}`{fed} is not run "
                                 "(corerl runs a launch script's training command only): run it yourself first")
        return True

    def fed(self, heredoc: Heredoc, fields: list[tuple[str, str]], prefix: dict[str, str]) -> bool:
        """``bash [-s] [-- args] <<EOF``: the here-document is the script a child shell follows
        (expanded first unless its end word is quoted), its lines the parent's."""
        body = heredoc.body or ""
        if not heredoc.quoted:
            lexer = Lexer(body, self.shown, heredoc.line + 1)
            body = self.text(Word([("dq", lexer.double_quoted(heredoc=True))], heredoc.line + 1))
        options = 0
        while options < len(fields) and fields[options][0].startswith("-") and fields[options][0] != "--":
            options += 1
        args = fields[options + (options < len(fields) and fields[options][0] == "--"):]
        self.child(prefix, lambda: self.run_file(self.path, self.shown, args, body, heredoc.line + 1))
        return True

    def nested(self, how: str, fields: list[tuple[str, str]], prefix: dict[str, str], line: int) -> bool:
        target = fields[0][0]
        if _MARK in target:
            raise self._unrun_error(target, self.at(line), "the script it starts")
        found = _find_script(target, self.path)
        if found is None:
            raise ConfigError(f"the script it starts, {target}, is not found", source=self.at(line),
                              hint="run corerl from the SkyRL checkout the script belongs to")
        args = list(fields[1:])
        if how in ("source", "."):
            self.run_file(found, _shown(found), args or self.args)
            return True
        self.child(prefix, lambda: self.run_file(found, _shown(found), args))
        return True

    def child(self, prefix: dict[str, str], follow: Callable[[], None]) -> None:
        """Follow a child shell's script: it has the exported variables only (and ``prefix``), no arrays."""
        saved = self.vars, self.exported, self.arrays
        self.vars = {k: v for k, v in self.vars.items() if k in self.exported} | prefix
        self.exported, self.arrays = set(self.vars), {}
        try:
            follow()
        finally:
            self.vars, self.exported, self.arrays = saved

    def launch(self, fields: list[tuple[str, str]], line: int) -> bool | None:
        """The training command, recorded, if ``fields`` is one; None for a command that is not
        (a helper: not run)."""
        words = [text for text, _ in fields]
        i = 0
        if words[:2] == ["uv", "run"]:
            i = 2
            while i < len(words) and words[i].startswith("-") and words[i] != "-m":
                i += 2 if words[i] in _UV_VALUED else 1
        if i < len(words) and _PYTHON.fullmatch(os.path.basename(words[i])):
            i += 1
            while i < len(words) and words[i].startswith("-") and words[i] != "-m":
                i += 2 if words[i] in _PY_VALUED else 1
        elif i == 0:
            return None
        if i + 1 < len(words) and words[i] == "-m":
            target, rest = words[i + 1], fields[i + 2:]
        elif i < len(words) and words[i].endswith(".py"):
            target, rest = words[i], fields[i + 1:]
        else:
            return None
        if _MARK in target:
            raise self._unrun_error(target, self.at(line), "the module it starts")
        module = entry_points.module_of(target)
        overrides = [(t, o) for t, o in rest if "=" in t and not t.startswith("-")]
        if entry_points.by_module(module) is None and (module in entry_points.NOT_TRAINING or not overrides):
            return None
        entry = entry_points.resolve(module, self.at(line))
        rest, flags = self.entry_flags(entry, module, list(rest), line)
        if self.training is not None:
            raise ConfigError(f"two training commands ({self.training[1]} and {self.at(line)}): corerl runs one",
                              source=self.shown, hint="keep one training command in the script")
        for text, origin in rest:
            if _MARK in text:
                raise self._unrun_error(text, origin, f"the override {text.split('=')[0]!r}")
            if "=" not in text or text.startswith("-"):
                where = origin if origin != COMMAND_LINE else COMMAND_LINE
                raise ConfigError(f"{text!r} is not a key=value override of {module}", source=where,
                                  hint="SkyRL's entry points take dotted.key=value overrides only")
        self.training = (entry, self.at(line), rest, flags)
        return True

    def entry_flags(self, entry: EntryPoint, module: str, rest: list[tuple[str, str]],
                    line: int) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
        """The flags ``module`` reads itself (``--env_variant instruct``, or ``--env_variant=instruct``)
        taken out of its arguments, each checked against its choices as its argparse checks them."""
        known = _ENTRY_FLAGS.get(entry.id, {})
        kept: list[tuple[str, str]] = []
        flags: list[tuple[str, str, str]] = []
        k = 0
        while k < len(rest):
            text, origin = rest[k]
            flag, eq, value = text.partition("=")
            if flag not in known:
                kept.append(rest[k])
            elif not eq and k + 1 == len(rest):
                raise ConfigError(f"{flag} of {module} has no value", source=origin,
                                  hint=f"give it one of {', '.join(known[flag])}")
            else:
                if not eq:
                    k += 1
                    value = rest[k][0]
                if value not in known[flag]:
                    raise ConfigError(f"{flag} {value!r} is not one of {module}'s choices ({', '.join(known[flag])})",
                                      source=origin, hint=f"give {flag} one of {', '.join(known[flag])}")
                flags.append((flag, value, origin))
            k += 1
        for flag, choices in known.items():
            if flag not in {given for given, _, _ in flags}:
                raise ConfigError(f"{module} needs {flag} ({' or '.join(choices)}), which the training command does "
                                  "not give: SkyRL's entry point stops without it", source=self.at(line),
                                  hint=f"add {flag} {choices[0]} (or another of its choices) after the module")
        return kept, flags

    def test(self, args: list[str], line: int) -> bool:
        """A ``[ ... ]`` test."""
        if any(_MARK in a for a in args):
            raise self._unrun_error(next(a for a in args if _MARK in a), self.at(line), "an `if` test")
        if args[:1] == ["!"]:
            return not self.test(args[1:], line)
        if len(args) == 0:
            return False
        if len(args) == 1:
            return args[0] != ""
        if len(args) == 2:
            op, value = args
            files = {"-f": os.path.isfile, "-d": os.path.isdir, "-e": os.path.exists, "-s": os.path.exists,
                     "-x": lambda p: os.access(p, os.X_OK), "-r": os.path.exists}
            if op == "-z":
                return value == ""
            if op == "-n":
                return value != ""
            if op in files:
                return bool(files[op](value))
        if len(args) == 3:
            left, op, right = args
            if op in ("=", "=="):
                return left == right
            if op == "!=":
                return left != right
            numeric = {"-eq": int.__eq__, "-ne": int.__ne__, "-gt": int.__gt__, "-ge": int.__ge__, "-lt": int.__lt__,
                       "-le": int.__le__}
            if op in numeric:
                try:
                    return bool(numeric[op](int(left), int(right)))
                except ValueError:
                    pass
        raise ConfigError(f"the test `[ {' '.join(args)} ]` is not one corerl reads", source=self.at(line),
                          hint="use = != -z -n -f -d -e or a numeric comparison, or drop the `if`")

    def _unrun_error(self, text: str, at: str, what: str) -> ConfigError:
        index = int(text.split(_MARK)[1])
        command, where = self.unrun[index]
        shown = command if command.startswith("$((") else f"$({command})"
        return ConfigError(f"{what} takes its value from `{shown}` ({where}), which corerl does not run",
                           source=at, hint="set the variable in the environment, or write the value")


def _find_script(target: str, beside: Path) -> Path | None:
    """A script another starts: as given, from the current folder, beside it, or from each folder
    above it (SkyRL runs its scripts from its checkout's root)."""
    candidate = Path(target)
    if candidate.is_absolute():
        return candidate if candidate.is_file() else None
    for root in (Path.cwd(), beside.parent, *beside.resolve().parents):
        if (root / candidate).is_file():
            return root / candidate
    return None



def _shown(path: Path) -> str:
    """A script's path as an error names it: relative to the current folder where it is inside it."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative

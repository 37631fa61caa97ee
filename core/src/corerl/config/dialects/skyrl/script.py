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
- ``if``/``elif``/``else`` over ``[ ... ]``/``[[ ... ]]`` tests (``=``, ``!=``, ``-z``, ``-n``, file
  tests, numeric comparisons), so a knob such as ``USE_CONVERSATION_MULTI_TURN=true`` picks its branch;
- ``bash OTHER.sh key=value "$@"`` (a script that starts another with more overrides) and
  ``source``: the other script is read in turn (found beside the script, or from the SkyRL
  checkout's root the script sits in, as SkyRL runs its scripts from there);
- the **training command**: a Python launch (``uv run [options] -m MODULE``, ``uv run [options]
  python -m MODULE``, ``python -m MODULE``, ``python path/main_x.py``, ``uv run path/main_x.py``)
  whose module is a SkyRL entry point or that is given ``key=value`` overrides. Its module is its
  entry point (:mod:`~corerl.config.dialects.skyrl.entry_points`) and each override keeps its line.

Other commands (``echo``, ``mkdir``, a dataset script the script runs first, a server it starts)
are not run; the ones that would have made something are listed as warnings. A script must start
exactly one training command: one starting none (a data-preparation or server script) or several
is refused in one line naming them. Loops, ``case``, functions, arrays and here-documents are
refused in one line naming their line: corerl follows a launch script, it does not run one.

The overrides given after the script (``corerl run run_gsm8k.sh trainer.epochs=1``) are the
script's ``$@``: they are applied after the script's own overrides, so they always win (as they do
in SkyRL's scripts, which end with ``$@``), even in a script that forgets its ``$@``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from corerl.config.dialects.skyrl import entry_points
from corerl.config.dialects.skyrl.entry_points import EntryPoint
from corerl.config.dialects.skyrl.values import Override, parse_override, tree_of
from corerl.errors import ConfigError

__all__ = ["COMMAND_LINE", "LaunchScript", "by_hand", "is_launch_target", "read"]

#: where an override given on corerl's command line (a script's ``$@``) comes from
COMMAND_LINE = "command line"
_MARK = "\x00"  # brackets the index of an unrun command substitution inside an expanded word
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_UNSUPPORTED = {"case": "a `case` statement", "for": "a `for` loop", "while": "a `while` loop",
                "until": "an `until` loop", "function": "a function", "select": "a `select` loop",
                "{": "a `{ ... }` group", "(": "a subshell"}
_QUIET = {"set", "echo", "printf", "mkdir", "true", "cd", "sleep", "ulimit", "shift", "local", "ls", "nvidia-smi",
          "export", "unset", ":", "wait", "trap", "return"}
_UV_VALUED = {"--extra", "--with", "--env-file", "--python", "-p", "--project", "--directory", "--group", "--package",
              "--with-requirements", "--with-editable", "--index", "--index-url", "--extra-index-url", "--only-group",
              "--no-extra", "--config-file", "--cache-dir"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_PY_VALUED = {"-X", "-W", "-c"}


@attrs.frozen
class LaunchScript:
    """What a launch script starts: its entry point, its overrides (in order, the command
    line's last) and the commands it does not run."""

    source: str  #: the script, as given
    entry_point: EntryPoint
    line: str  #: where the training command starts (``script:line``)
    overrides: tuple[Override, ...]
    warnings: tuple[str, ...] = ()

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
        raise ConfigError(f"no training command: the script starts no SkyRL entry point (it runs {ran})",
                          source=source, hint="give the script that trains (a run_*.sh ending in an entry point "
                                              "with key=value overrides); run a data or server script yourself")
    entry, where, words = shell.training
    mine = [(t, o) for t, o in words if o != COMMAND_LINE]
    given = [(t, o) for t, o in words if o == COMMAND_LINE]
    if extra and not given:  # the script forgot its $@: the command line still wins
        given = [(t, COMMAND_LINE) for t in extra]
    overrides = tuple(parse_override(text, origin) for text, origin in [*mine, *given])
    return LaunchScript(source, entry, where, overrides, tuple(shell.warnings))


# --- reading: words and commands -------------------------------------------------------------


@attrs.define
class _Word:
    parts: list[tuple[Any, ...]]
    line: int


@attrs.define
class _Simple:
    words: list[_Word]
    line: int


@attrs.define
class _If:
    branches: list[tuple[list[Any], list[Any]]]  # (condition, body); an else branch has condition []
    line: int


class _Lexer:
    """Splits a script into words (each with its quoting, for expansion) and operators."""

    def __init__(self, text: str, where: str) -> None:
        self.s, self.i, self.line, self.where = text, 0, 1, where

    def fail(self, what: str, line: int | None = None) -> ConfigError:
        return ConfigError(f"{what}: corerl follows a launch script's assignments, defaults, `if` tests and one "
                           "training command, and runs no shell code", source=f"{self.where}:{line or self.line}",
                           hint="write the values it computes into the script, or set them in the environment")

    def peek(self, k: int = 0) -> str:
        return self.s[self.i + k] if self.i + k < len(self.s) else ""

    def take(self, n: int = 1) -> str:
        text = self.s[self.i:self.i + n]
        self.line += text.count("\n")
        self.i += n
        return text

    def tokens(self) -> list[Any]:
        out: list[Any] = []
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t\r":
                self.take()
            elif c == "\\" and self.peek(1) == "\n":
                self.take(2)
            elif c == "#":
                while self.peek() not in ("", "\n"):
                    self.take()
            elif c == "\n":
                out.append(("op", "\n", self.line))
                self.take()
            elif self.s.startswith(("&&", "||", ";;"), self.i):
                out.append(("op", self.take(2), self.line))
            elif c in ";&|()":
                out.append(("op", self.take(), self.line))
            elif m := re.match(r"\d*(>>|>&|<<<|<<|>|<)(&\d|-)?", self.s[self.i:]):
                if m.group(1) == "<<":
                    raise self.fail("a here-document")
                line = self.line
                self.take(len(m.group(0)))
                while self.peek() in " \t":
                    self.take()
                if not m.group(2):
                    self.word()  # the redirection's target: not a word of the command
                out.append(("op", "redirect", line))
            else:
                line = self.line
                out.append(("word", _Word(self.word(), line), line))
        out.append(("op", "\n", self.line))
        return out

    def word(self, stop: str = "") -> list[tuple[Any, ...]]:
        """The parts of one word: ``("lit", text)``, ``("sq", text)``, ``("dq", parts)``,
        ``("param", name, op, parts)``, ``("cmd", text)``, ``("tilde",)``; ``stop``: the
        characters ending a word inside ``${...}`` (where blanks are part of it)."""
        parts: list[tuple[Any, ...]] = []
        while self.i < len(self.s):
            c = self.peek()
            if stop and c in stop:
                break
            if not stop and (c in " \t\r\n;&|()<>"):
                if c == "(" and parts and parts[-1][0] == "lit" and parts[-1][1].endswith("="):
                    raise self.fail("an array")
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    self.take(2)
                    continue
                self.take()
                parts.append(("sq", self.take()))
            elif c == "'":
                self.take()
                start = self.i
                while self.peek() not in ("'", ""):
                    self.take()
                parts.append(("sq", self.s[start:self.i]))
                self.take()
            elif c == '"':
                self.take()
                parts.append(("dq", self.double_quoted()))
            elif c == "$":
                parts.append(self.dollar())
            elif c == "`":
                parts.append(self.backticked())
            elif c == "~" and not parts and not stop:
                self.take()
                parts.append(("tilde",))
            else:
                _push(parts, "lit", self.take())
        return parts

    def backticked(self) -> tuple[str, str]:
        """A `...` command substitution, read up to its closing backtick (never run)."""
        self.take()
        start = self.i
        while self.peek() not in ("`", ""):
            self.take()
        command = self.s[start:self.i]
        self.take()
        return ("cmd", command)

    def double_quoted(self) -> list[tuple[Any, ...]]:
        parts: list[tuple[Any, ...]] = []
        while self.i < len(self.s) and self.peek() != '"':
            c = self.peek()
            if c == "\\" and self.peek(1) in '$`"\\\n':
                self.take()
                escaped = self.take()
                if escaped != "\n":
                    parts.append(("sq", escaped))
            elif c == "$":
                parts.append(self.dollar())
            elif c == "`":
                parts.append(self.backticked())
            else:
                _push(parts, "sq", self.take())
        self.take()
        return parts

    def dollar(self) -> tuple[Any, ...]:
        self.take()  # $
        c = self.peek()
        if self.s.startswith("((", self.i):
            return ("arith", self.balanced("(", ")")[2:-2])
        if c == "(":
            return ("cmd", self.balanced("(", ")")[1:-1])
        if c == "{":
            self.take()
            m = re.match(r"#?([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!])(\[[^]]*\])?", self.s[self.i:])
            if not m:
                raise self.fail("a `${...}` expansion corerl does not read")
            self.take(len(m.group(0)))
            name = m.group(0)
            op_match = re.match(r":?[-=?+]", self.s[self.i:])
            if self.peek() == "}":
                self.take()
                return ("param", name, "", [])
            if not op_match:
                raise self.fail(f"the expansion `${{{name}{self.peek()}...}}` (only :- := :? :+ are read)")
            op = self.take(len(op_match.group(0)))
            parts = self.word(stop="}")
            self.take()
            return ("param", name, op, parts)
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!]", self.s[self.i:])
        if not m:
            return ("lit", "$")
        self.take(len(m.group(0)))
        return ("param", m.group(0), "", [])

    def balanced(self, open_: str, close: str) -> str:
        start, depth = self.i, 0
        while self.i < len(self.s):
            c = self.take()
            if c == "'":
                while self.peek() not in ("'", ""):
                    self.take()
                self.take()
            elif c == "\\":
                self.take()
            elif c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    break
        return self.s[start:self.i]


class _Parser:
    """Groups the lexer's tokens into simple commands and ``if`` statements."""

    def __init__(self, tokens: list[Any], lexer: _Lexer) -> None:
        self.t, self.k, self.lexer = tokens, 0, lexer

    def keyword(self) -> str | None:
        kind, value, _ = self.t[self.k]
        if kind == "word" and all(p[0] == "lit" for p in value.parts):
            return "".join(p[1] for p in value.parts)
        return value if kind == "op" else None

    def statements(self, until: tuple[str, ...] = ()) -> list[Any]:
        out: list[Any] = []
        while self.k < len(self.t):
            kind, value, line = self.t[self.k]
            if kind == "op" and value in ("\n", ";", "&"):
                self.k += 1
                continue
            word = self.keyword()
            if word in until:
                return out
            out.append(self.and_or())
        if until:
            raise self.lexer.fail(f"an unfinished `if` (no {'/'.join(until)})")
        return out

    def and_or(self) -> list[tuple[str, Any]]:
        chain = [("", self.command())]
        while self.k < len(self.t) and self.t[self.k][0] == "op" and self.t[self.k][1] in ("&&", "||", "|"):
            op = self.t[self.k][1]
            self.k += 1
            while self.t[self.k][0] == "op" and self.t[self.k][1] == "\n":
                self.k += 1
            chain.append((op, self.command()))
        return chain

    def command(self) -> Any:
        kind, value, line = self.t[self.k]
        word = self.keyword()
        if kind == "op" and value == "(":
            raise self.lexer.fail(_UNSUPPORTED["("], line)
        if word in _UNSUPPORTED or (word is not None and word.startswith(("{", "}"))):
            raise self.lexer.fail(_UNSUPPORTED.get(word, "a `{ ... }` group"), line)
        if word == "if":
            return self.if_clause(line)
        words: list[_Word] = []
        while self.k < len(self.t):
            kind, value, _ = self.t[self.k]
            if kind == "op" and value == "redirect":
                self.k += 1
                continue
            if kind == "op":
                if value == "(" and words:
                    raise self.lexer.fail(_UNSUPPORTED["function"], line)
                break
            words.append(value)
            self.k += 1
        return _Simple(words, line)

    def if_clause(self, line: int) -> _If:
        branches = []
        self.k += 1
        condition = self.statements(("then",))
        self.k += 1
        while True:
            body = self.statements(("elif", "else", "fi"))
            branches.append((condition, body))
            word = self.keyword()
            self.k += 1
            if word == "fi":
                return _If(branches, line)
            if word == "else":
                branches.append(([], self.statements(("fi",))))
                self.k += 1
                return _If(branches, line)
            condition = self.statements(("then",))
            self.k += 1


# --- following: variables, expansion, commands ---------------------------------------------------


class _Stop(Exception):
    """``exit`` in a script: nothing after it is followed."""


class _Shell:
    def __init__(self, environ: dict[str, str]) -> None:
        self.vars = dict(environ)
        self.exported = set(environ)
        self.training: tuple[EntryPoint, str, list[tuple[str, str]]] | None = None
        self.helpers: list[str] = []
        self.warnings: list[str] = []
        self.unrun: list[tuple[str, str]] = []  # (command substitution, where): what a marked word holds
        self.depth = 0

    # files

    def run_file(self, path: Path, shown: str, args: list[tuple[str, str]]) -> None:
        self.depth += 1
        if self.depth > 8:
            raise ConfigError("launch scripts start each other more than 8 deep", source=shown)
        lexer = _Lexer(path.read_text(errors="replace"), shown)
        statements = _Parser(lexer.tokens(), lexer).statements()
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
        if isinstance(command, _If):
            for condition, body in command.branches:
                if not condition or self.block(condition):
                    return self.block(body)
            return True
        return self.simple(command)

    # expansion

    def expand(self, word: _Word, split: bool = True) -> list[tuple[str, str]]:
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
                    if [p[:3] for p in part[1]] not in ([("param", "@", "")], [("param", "*", "")]):
                        current[2] = True  # "" is a word; "$@" with no arguments is none
                    walk(part[1], True)
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
                else:
                    add(self.parameter(part, word.line), not quoted)

        walk(word.parts, False)
        if current[2] or current[0]:
            fields.append(current)
        return [(text, origin) for text, origin, _ in fields]

    def text(self, word: _Word) -> str:
        """A word expanded as an assignment's value is (no splitting)."""
        return "".join(text for text, _ in self.expand(word, split=False))

    def parameter(self, part: tuple[Any, ...], line: int) -> str:
        _, name, op, parts = part
        if name.startswith("#") and len(name) > 1:
            return str(len(self.lookup(name[1:]) or ""))
        value = self.lookup(name)
        unset = value is None or (op.startswith(":") and value == "")
        if op in ("", None):
            return value or ""
        word = _Word(parts, line)
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

    def lookup(self, name: str) -> str | None:
        if name in ("0", "BASH_SOURCE", "BASH_SOURCE[0]"):
            return str(self.path)
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

        text = "".join(t for t, _ in self.expand(_Word(_Lexer(expression, self.shown).word(stop="\x01"), line),
                                                  split=False))

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
            lexer = _Lexer(command, self.shown)
            tokens = lexer.tokens()
        except ConfigError:
            return None
        out = []
        for kind, value, _ in tokens:
            if kind == "word":
                out += [text for text, _ in self.expand(_Word(value.parts, line))]
            elif value == "&&":
                out.append("&&")
            elif value != "\n":
                return None
        return [w for w in out if w != "--"]

    # commands

    def simple(self, command: _Simple) -> bool:
        words = list(command.words)
        prefix: dict[str, str] = {}
        while words and (m := _assignment(words[0])):
            name, value = m
            prefix[name] = self.text(value)
            words.pop(0)
        if not words:
            self.vars.update(prefix)
            return True
        fields = [f for word in words for f in self.expand(word)]
        if not fields or all(origin == COMMAND_LINE for _, origin in fields):
            return True  # nothing, or a lone $@ (a line continuation forgotten before it): applied last anyway
        name = fields[0][0]
        args = [text for text, _ in fields[1:]]
        if name in ("export", "local", "declare", "readonly"):
            for word in words[1:]:
                if m := _assignment(word):
                    self.vars[m[0]] = self.text(m[1])
                    self.exported.add(m[0])
                else:
                    self.exported.update(t for t, _ in self.expand(word) if not t.startswith("-"))
            return True
        if name == "unset":
            for arg in args:
                self.vars.pop(arg, None)
            return True
        if name == "exit":
            raise _Stop
        if name in ("[", "[[", "test"):
            return self.test(args[:-1] if name != "test" else args, command.line)
        if name == "false":
            return False
        if name in ("bash", "sh", "source", ".") and args and args[0].endswith(".sh"):
            return self.nested(name, fields[1:], prefix, command.line)
        if name in _QUIET:
            return True
        launch = self.launch(fields, command.line)
        if launch is None:
            self.helpers.append(f"`{' '.join(t for t, _ in fields)[:80]}` ({self.at(command.line)})")
            self.warnings.append(f"{self.at(command.line)}: `{' '.join(t for t, _ in fields)[:80]}` is not run "
                                 "(corerl runs a launch script's training command only): run it yourself first")
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
        saved_vars, saved_exported = self.vars, self.exported  # a child shell: the exported variables only
        self.vars = {k: v for k, v in self.vars.items() if k in self.exported} | prefix
        self.exported = set(self.vars)
        try:
            self.run_file(found, _shown(found), args)
        finally:
            self.vars, self.exported = saved_vars, saved_exported
        return True

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
        self.training = (entry, self.at(line), list(rest))
        return True

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


def _assignment(word: _Word) -> tuple[str, _Word] | None:
    if not word.parts or word.parts[0][0] != "lit":
        return None
    literal = ""
    for n, part in enumerate(word.parts):
        if part[0] != "lit":
            break
        literal += part[1]
        if m := _ASSIGN.match(literal):
            value = literal[m.end():]
            rest = [("tilde",), *([("lit", value[1:])] if value[1:] else [])] if value.startswith("~") else (
                [("lit", value)] if value else [])  # NAME=~/x: the tilde is expanded (after the =)
            return m.group(1), _Word(rest + list(word.parts[n + 1:]), word.line)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?", literal):
            return None
    return None


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


def _push(parts: list[tuple[Any, ...]], kind: str, text: str) -> None:
    """Append a literal character, joined to the literal before it."""
    if parts and parts[-1][0] == kind:
        parts[-1] = (kind, parts[-1][1] + text)
    else:
        parts.append((kind, text))


def _shown(path: Path) -> str:
    """A script's path as an error names it: relative to the current folder where it is inside it."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative

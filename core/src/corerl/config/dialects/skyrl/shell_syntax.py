"""The syntax of a SkyRL launch script: words, operators, here-documents and arrays (issue 75).

:class:`Lexer` splits a script into words (each with its quoting, for expansion) and operators;
:class:`Parser` groups them into simple commands and ``if`` statements. What the words mean (their
expansion, the commands they make) is :mod:`corerl.config.dialects.skyrl.script`'s business: this
module runs nothing. Besides the words, operators and redirections bash has, it reads:

- **here-documents** (``cmd <<EOF`` ... ``EOF``, ``<<-EOF`` with its tabs stripped, ``<<'EOF'``
  left unexpanded): the body is kept on the command it feeds (:class:`Heredoc`), whose line it
  names; a body with no end line is refused naming the line that opens it;
- **arrays**: ``NAME=(a "b c" $D)`` and ``NAME+=(...)`` make an ``("array", [Word, ...])`` part
  (each element a word with its own line), and ``${NAME[@]}``, ``${NAME[*]}``, ``${NAME[i]}``,
  ``${#NAME[@]}`` and ``${!NAME[@]}`` are parameters the shell expands.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from corerl.errors import ConfigError

__all__ = ["ASSIGN", "UNSUPPORTED", "Heredoc", "If", "Lexer", "Parser", "Simple", "Word", "assignment", "push"]

ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\[[^]=$`]+\])?)(\+?)=")  # NAME=, NAME+=, NAME[i]=
UNSUPPORTED = {"case": "a `case` statement", "for": "a `for` loop", "while": "a `while` loop",
               "until": "an `until` loop", "function": "a function", "select": "a `select` loop",
               "{": "a `{ ... }` group", "(": "a subshell"}


@attrs.define
class Word:
    parts: list[tuple[Any, ...]]
    line: int


@attrs.define
class Heredoc:
    """A here-document: its end word, whether it was quoted (the body is then left unexpanded), and
    its body (read once the line that opens it ends)."""

    end: str
    quoted: bool
    line: int  #: the line that opens it
    body: str | None = None


@attrs.define
class Simple:
    words: list[Word]
    line: int
    heredocs: list[Heredoc] = attrs.Factory(list)  #: what it is fed on its standard input


@attrs.define
class If:
    branches: list[tuple[list[Any], list[Any]]]  # (condition, body); an else branch has condition []
    line: int


class Lexer:
    """Splits a script into words (each with its quoting, for expansion) and operators."""

    def __init__(self, text: str, where: str, line: int = 1) -> None:
        self.s, self.i, self.line, self.where = text, 0, line, where
        self.pending: list[tuple[Heredoc, bool]] = []  # here-documents whose bodies start on the next line

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

    def blank(self, newlines: bool) -> bool:
        """Skip one blank at the cursor (a space or tab, a line continuation, a comment up to its
        line's end; a newline too where ``newlines``), and say whether there was one."""
        c = self.peek()
        if c in " \t\r" or (newlines and c == "\n"):
            self.take()
        elif c == "\\" and self.peek(1) == "\n":
            self.take(2)
        elif c == "#":
            while self.peek() not in ("", "\n"):
                self.take()
        else:
            return False
        return True

    def tokens(self) -> list[Any]:
        out: list[Any] = []
        while self.i < len(self.s):
            c = self.peek()
            if self.blank(newlines=False):
                continue
            if c == "\n":
                out.append(("op", "\n", self.line))
                self.take()
                self.heredoc_bodies()
            elif self.s.startswith(("&&", "||", ";;"), self.i):
                out.append(("op", self.take(2), self.line))
            elif c in ";&|()":
                out.append(("op", self.take(), self.line))
            elif m := re.match(r"\d*<<(-?)(?!<)", self.s[self.i:]):
                out.append(("heredoc", self.heredoc(len(m.group(0)), bool(m.group(1))), self.line))
            elif m := re.match(r"\d*(>>|>&|<<<|>|<)(&\d|-)?", self.s[self.i:]):
                line = self.line
                self.take(len(m.group(0)))
                while self.peek() in " \t":
                    self.take()
                if not m.group(2):
                    self.word()  # the redirection's target: not a word of the command
                out.append(("op", "redirect", line))
            else:
                line = self.line
                out.append(("word", Word(self.word(), line), line))
        out.append(("op", "\n", self.line))
        if self.pending:
            heredoc = self.pending[0][0]
            raise self.fail(f"a here-document with no end line ({heredoc.end})", heredoc.line)
        return out

    def heredoc(self, length: int, strip: bool) -> Heredoc:
        """``<<END`` (``length`` characters) and its end word; the body is read at the line's end."""
        line = self.line
        self.take(length)
        while self.peek() in " \t":
            self.take()
        parts = self.word()
        if not parts or any(p[0] not in ("lit", "sq", "dq") or (p[0] == "dq" and any(q[0] != "sq" for q in p[1]))
                            for p in parts):
            raise self.fail("a here-document whose end word corerl does not read", line)
        end = "".join(p[1] if p[0] != "dq" else "".join(q[1] for q in p[1]) for p in parts)
        heredoc = Heredoc(end, any(p[0] != "lit" for p in parts), line)
        self.pending.append((heredoc, strip))
        return heredoc

    def heredoc_bodies(self) -> None:
        """The bodies of the here-documents opened on the line that just ended, each up to its end line."""
        for heredoc, strip in self.pending:
            lines = []
            while True:
                if self.i >= len(self.s):
                    raise self.fail(f"a here-document with no end line ({heredoc.end})", heredoc.line)
                end = self.s.find("\n", self.i)
                text = self.take((end if end >= 0 else len(self.s)) - self.i + 1)
                text = text.lstrip("\t") if strip else text
                if text.rstrip("\n") == heredoc.end:
                    break
                lines.append(text)
            heredoc.body = "".join(lines)
        self.pending = []

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
                if c == "(" and len(parts) == 1 and parts[0][0] == "lit" and re.fullmatch(r"[A-Za-z_]\w*\+?=",
                                                                                          parts[0][1]):
                    parts.append(("array", self.array()))
                    continue
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
                push(parts, "lit", self.take())
        return parts

    def array(self) -> list[Word]:
        """The elements of ``NAME=( ... )``, each a word with its line (blanks, newlines and
        comments between them)."""
        line = self.line
        self.take()  # (
        elements: list[Word] = []
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("an array with no closing `)`", line)
            if self.blank(newlines=True):
                continue
            if c == ")":
                self.take()
                return elements
            elif c in ";&|(<>":
                raise self.fail(f"`{c}` inside an array", self.line)
            else:
                here = self.line
                elements.append(Word(self.word(), here))

    def backticked(self) -> tuple[str, str]:
        """A `...` command substitution, read up to its closing backtick (never run)."""
        self.take()
        start = self.i
        while self.peek() not in ("`", ""):
            self.take()
        command = self.s[start:self.i]
        self.take()
        return ("cmd", command)

    def double_quoted(self, heredoc: bool = False) -> list[tuple[Any, ...]]:
        """A double-quoted string's parts, up to its closing quote; ``heredoc``: an unquoted
        here-document's body, to its end (where ``"`` is a character like any other)."""
        parts: list[tuple[Any, ...]] = []
        while self.i < len(self.s) and (heredoc or self.peek() != '"'):
            c = self.peek()
            if c == "\\" and self.peek(1) in ('$`\\\n' if heredoc else '$`"\\\n'):
                self.take()
                escaped = self.take()
                if escaped != "\n":
                    parts.append(("sq", escaped))
            elif c == "$":
                parts.append(self.dollar())
            elif c == "`":
                parts.append(self.backticked())
            else:
                push(parts, "sq", self.take())
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
            m = re.match(r"![A-Za-z_]\w*\[[@*]\](?=})|#?([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!])(\[[^]]*\])?",
                         self.s[self.i:])  # ${!NAME[@]}: an array's indices
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


class Parser:
    """Groups the lexer's tokens into simple commands and ``if`` statements."""

    def __init__(self, tokens: list[Any], lexer: Lexer) -> None:
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
            raise self.lexer.fail(UNSUPPORTED["("], line)
        if word in UNSUPPORTED or (word is not None and word.startswith(("{", "}"))):
            raise self.lexer.fail(UNSUPPORTED.get(word, "a `{ ... }` group"), line)
        if word == "if":
            return self.if_clause(line)
        words: list[Word] = []
        heredocs: list[Heredoc] = []
        while self.k < len(self.t):
            kind, value, _ = self.t[self.k]
            if kind == "heredoc":
                heredocs.append(value)
            if (kind == "op" and value == "redirect") or kind == "heredoc":
                self.k += 1
                continue
            if kind == "op":
                if value == "(" and words:
                    raise self.lexer.fail(UNSUPPORTED["function"], line)
                break
            words.append(value)
            self.k += 1
        return Simple(words, line, heredocs)

    def if_clause(self, line: int) -> If:
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
                return If(branches, line)
            if word == "else":
                branches.append(([], self.statements(("fi",))))
                self.k += 1
                return If(branches, line)
            condition = self.statements(("then",))
            self.k += 1



def assignment(word: Word) -> tuple[str, Word, bool] | None:
    """``NAME=value``, ``NAME+=value`` (appending) or ``NAME[i]=value`` (an element, ``i`` written
    out): the name (``NAME[i]`` for an element), the value's word, whether it appends."""
    if not word.parts or word.parts[0][0] != "lit":
        return None
    literal = ""
    for n, part in enumerate(word.parts):
        if part[0] != "lit":
            break
        literal += part[1]
        if m := ASSIGN.match(literal):
            value = literal[m.end():]
            rest = [("tilde",), *([("lit", value[1:])] if value[1:] else [])] if value.startswith("~") else (
                [("lit", value)] if value else [])  # NAME=~/x: the tilde is expanded (after the =)
            return m.group(1), Word(rest + list(word.parts[n + 1:]), word.line), m.group(2) == "+"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?", literal):
            return None
    return None


def push(parts: list[tuple[Any, ...]], kind: str, text: str) -> None:
    """Append a literal character, joined to the literal before it."""
    if parts and parts[-1][0] == kind:
        parts[-1] = (kind, parts[-1][1] + text)
    else:
        parts.append((kind, text))

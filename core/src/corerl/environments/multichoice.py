"""Multiple-choice answers: the letter after an answer marker, compared with the gold letter.

NeMo RL's ``env.math.verifier_type`` takes ``english_multichoice`` and ``multilingual_multichoice``
for its GPQA and MMLU evaluations, both read as OpenAI's simple-evals reads an answer: the response
stripped of Markdown bold and LaTeX wrappers, then the first ``Answer: X`` (any case; the marker in
one of several languages for the multilingual one), the letter normalised (full-width, Arabic and
Bengali option letters read as A to D), equal to the gold letter. The marker words are a list of
our own of the common ways the major languages write it; the rule is theirs.
"""

from __future__ import annotations

import re

#: what wraps an answer letter in a model's text and is dropped before the marker is looked for
_WRAPPERS = ("**", "$\\boxed{", "}$", "\\boxed{", "\\textbf{", "\\text{", "\\mathrm{", "\\mathbf{", "\\(", "\\)",
             "$", "{", "}")
_ENGLISH = re.compile(r"(?i)answer\s*:[ \t]*([A-Z])")
#: "answer" followed by a colon (ASCII or full-width) in the languages multilingual benchmarks ask in
_MARKERS = ("answer", "antwort", "respuesta", "risposta", "réponse", "resposta", "jawaban", "jibu", "ìdáhùn",
            "idahun", "cevap", "ответ", "відповідь", "odpowiedź", "antwoord", "svar", "vastaus", "απάντηση",
            "答案", "答", "回答", "解答", "答え", "답변", "정답", "답", "उत्तर", "উত্তর", "الإجابة",
            "الجواب", "إجابة", "คำตอบ", "đáp án", "trả lời")
_OPTION = r"([A-Z]|[أ-د]|[অবডঢ]|[Ａ-Ｚ])"
_MULTILINGUAL = re.compile(r"(?i)(?:(?:" + "|".join(re.escape(m) for m in _MARKERS) + r")\s*[:：]|উত্তরঃ)[ \t]*" + _OPTION)
#: option letters written in other scripts, as the letter they stand for
_LETTERS = {"أ": "A", "ب": "B", "ج": "C", "د": "D", "অ": "A", "ব": "B", "ড": "C", "ঢ": "D",
            **{chr(0xFF21 + i): chr(ord("A") + i) for i in range(26)}}

VERIFIERS = ("english_multichoice", "multilingual_multichoice")


def stripped(response: str) -> str:
    """``response`` without the Markdown bold and LaTeX wrappers that hide an ``Answer: X``."""
    for wrapper in _WRAPPERS:
        response = response.replace(wrapper, "")
    return response


def letter(text: str) -> str:
    """An option letter as A to Z (``Ｂ``, ``ب`` and ``ব`` are B), surrounding space dropped."""
    text = text.strip()
    return _LETTERS.get(text, text).upper()


def chosen(response: str, verifier: str) -> str | None:
    """The option ``response`` picks under ``verifier`` (see :data:`VERIFIERS`); None when it names none."""
    pattern = _ENGLISH if verifier == "english_multichoice" else _MULTILINGUAL
    found = pattern.search(stripped(response))
    return letter(found.group(1)) if found else None


def correct(response: str, gold: object, verifier: str) -> bool:
    """Whether ``response`` picks the ``gold`` option (a letter, maybe wrapped as the response may be)."""
    picked = chosen(response, verifier)
    return picked is not None and picked == letter(stripped(str(gold)))

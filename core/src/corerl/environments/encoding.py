"""Observations as tokens, appended after the model's own tokens without re-tokenizing them.

Text is tokenized on its own. Chat messages are rendered with the tokenizer's chat template as
a continuation: the template is applied to a short stand-in conversation with and without the
new messages (and the assistant prompt that follows them), and only the difference is tokenized,
together with what the template writes after an assistant turn's end token (Qwen's newline after
``<|im_end|>``). So the tokens are those the template would give the whole conversation, while
the model's sampled ids stay exactly as sampled.

Without a chat template, messages are written plainly: a tool result as
``<tool_response> ... </tool_response>``, anything else as its content.

A vision-language policy's observation may show images: messages whose content holds parts
``{"type": "image", "image": ...}`` beside ``{"type": "text", "text": ...}`` (an image as PIL,
bytes, base64 or a path). Each image part becomes the model's image placeholder, expanded per
merged patch, and the image joins the episode's (:meth:`ObservationEncoder.encode_with_images`).

Step-wise trajectories (``algorithm.step_wise_trajectories``) append nothing: each later turn's
prompt is the whole conversation rendered anew (:meth:`ObservationEncoder.conversation_ids`),
so a template that rewrites earlier turns (Qwen3 drops their ``<think>`` blocks) is rendered as
the model would see it in use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corerl.environments.contract import Message

if TYPE_CHECKING:
    from corerl.generation.contract import Images

_STAND_IN_USER = "corerl-stand-in-question"
_STAND_IN_ANSWER = "corerl-stand-in-answer"


def plain_text(messages: Sequence[Message]) -> str:
    """Messages written without a chat template (tool results wrapped as Hermes writes them)."""
    parts = []
    for message in messages:
        content = str(message.get("content", ""))
        parts.append(f"<tool_response> {content} </tool_response>" if message.get("role") == "tool" else content)
    return " ".join(parts)


class ObservationEncoder:
    """Token ids of an observation, to follow a model turn that ended with ``ended_with_stop``."""

    def __init__(self, tokenizer: Any, images: Any = None) -> None:
        self.tokenizer = tokenizer
        self.images = images  # the policy's ImageEncoder (a vision-language model's), else None
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self.after_stop = ""
        # the stand-in conversation an observation continues, rendered once
        self.conversation = [{"role": "user", "content": _STAND_IN_USER},
                             {"role": "assistant", "content": _STAND_IN_ANSWER}]
        self.base = ""
        if self.has_template:
            self.base = base = self._render(self.conversation, prompt=False)
            tail = base[base.rfind(_STAND_IN_ANSWER) + len(_STAND_IN_ANSWER):]
            eos = tokenizer.eos_token or ""
            # what the template writes after the assistant's end token (the model stops at that token)
            self.after_stop = tail[tail.find(eos) + len(eos):] if eos and eos in tail else ""
            self.end_of_turn = tail[: len(tail) - len(self.after_stop)]

    def _render(self, messages: list[Any], prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)

    def text_of(self, observation: str | Sequence[Message], ended_with_stop: bool = True) -> str:
        """The text appended for ``observation``."""
        if isinstance(observation, str):
            return observation
        if not self.has_template:
            return plain_text(observation)
        base = self.base
        full = self._render([*self.conversation, *[dict(m) for m in observation]], prompt=True)
        if not full.startswith(base):
            raise ValueError("the chat template does not render a conversation as an extension of its start, so an "
                             "observation cannot be appended to the model's tokens")
        closing = self.after_stop if ended_with_stop else self.end_of_turn + self.after_stop
        return closing + full[len(base):]

    def conversation_ids(self, prompt: Sequence[int], history: Sequence[Message]) -> tuple[list[int], str]:
        """Step-wise trajectories: the context of the model's next turn, the conversation as the
        chat template renders it now, and the text rendered after the prompt. ``prompt`` is the
        first turn's prompt (the task's tokens, kept as they are) and ``history`` everything after
        it (the model's turns as assistant messages, the observations' messages). The template
        renders the stand-in question followed by ``history`` with the generation prompt, and what
        follows the stand-in question's own rendering is encoded after ``prompt``. Earlier turns
        come out as the template writes them now (Qwen3 drops their ``<think>`` blocks): no
        extension property is needed. A generation prompt that earlier turns do not keep (Qwen3's
        empty ``<think></think>`` with thinking off) is taken off the end of ``prompt`` first."""
        first = self.conversation[:1]
        full = self._render([*first, *[dict(m) for m in history]], prompt=True)
        start = self._render(first, prompt=True)
        if full.startswith(start):
            text = full[len(start):]
            return [*prompt, *self.encode_text(text)], text
        bare = self._render(first, prompt=False)
        cue = self.encode_text(start[len(bare):]) if start.startswith(bare) and start != bare else []
        if cue and full.startswith(bare) and list(prompt[len(prompt) - len(cue):]) == cue:
            text = full[len(bare):]
            return [*prompt[: len(prompt) - len(cue)], *self.encode_text(text)], text
        raise ValueError("the chat template does not start a conversation with its first message as it renders that "
                         "message alone, so a later turn's prompt cannot follow the prompt's tokens")

    def encode(self, observation: str | Sequence[Message], ended_with_stop: bool = True) -> list[int]:
        """Token ids of :meth:`text_of` (no special tokens added)."""
        return self.encode_text(self.text_of(observation, ended_with_stop))

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text``, what :meth:`text_of` gave (no special tokens added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_with_images(self, observation: str | Sequence[Message], ended_with_stop: bool,
                           where: str) -> tuple[list[int], str, Images | None]:
        """Token ids of an observation, the text they encode and the images it shows (None: none).
        Image parts are refused (``ValueError``, the episode's ``env_malformed``) for a text-only
        policy."""
        from corerl.errors import ConfigError
        from corerl.tasks.prompt_images import decode_all, message_text

        shown: list[Any] = []
        if not isinstance(observation, str) and any(isinstance(m.get("content"), list) for m in observation):
            try:
                flat, shown = message_text(list(observation), where)
            except ConfigError as error:
                raise ValueError(str(error)) from None
            observation = flat
        text = self.text_of(observation, ended_with_stop)
        ids = self.encode_text(text)
        if not shown:
            return ids, text, None
        if self.images is None:
            raise ValueError(f"the observation shows {len(shown)} image(s) and the policy is a text-only model")
        try:
            images = self.images.encode(decode_all(shown, None, where), where)
            return self.images.expand(ids, images, where), self.images.expand_text(text, images), images
        except ConfigError as error:
            raise ValueError(str(error)) from None

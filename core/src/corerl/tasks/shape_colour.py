"""``shape_colour``: a visual task made in code for vision-language policies (the VL demo's).

Each prompt shows a 56 x 56 image with two squares of different colours on black, one at least
twice the other's side, and asks ``what colour is the largest shape ?``; the reward is 1 when the
completion's first word names the larger square's colour. Only the image tells: the text is the
same for every prompt.

SFT demonstrations answer with a random colour and stop (``yellow <eos>``): they teach the
answer's form, not which colour; GRPO learns that from the reward. Held out: 32 fixed images.
"""

from __future__ import annotations

import random
from typing import Any

from corerl.errors import ConfigError
from corerl.generation.contract import ImagePrompt, Sample
from corerl.tasks import TaskContext, decode_completion, restore_rng, rng_state, score

COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 80, 240), "yellow": (235, 220, 40)}
SIDE = 56
QUESTION = "what colour is the largest shape ?"
HELD_OUT = 32


def draw(rng: random.Random) -> tuple[Any, str]:
    """One image (PIL) and the colour of its larger square."""
    from PIL import Image, ImageDraw

    big, small = rng.sample(sorted(COLOURS), 2)
    image = Image.new("RGB", (SIDE, SIDE), (0, 0, 0))
    pen = ImageDraw.Draw(image)
    for name, side in ((big, rng.randint(22, 30)), (small, rng.randint(6, 11))):
        x, y = rng.randint(0, SIDE - side), rng.randint(0, SIDE - side)
        shade = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in COLOURS[name])
        pen.rectangle([x, y, x + side - 1, y + side - 1], fill=shade)
    return image, big


class ShapeColour:
    """Prompts ``<bos> <image> what colour is the largest shape ?`` over the tiny VL vocabulary."""

    def __init__(self, context: TaskContext) -> None:
        if context.images is None:
            raise ConfigError("the shape_colour task shows images, and the policy is a text-only model",
                              key="policy.model_name", hint="use policy.model_name=builtin:tiny-vl (or another "
                                                            "Qwen2.5-VL / Qwen3-VL model)")
        self.tokenizer, self.encoder = context.tokenizer, context.images
        from corerl.models.vision import IMAGE_PLACEHOLDER
        from corerl.tasks.prompts import encode_prompt

        self.text_ids, _ = encode_prompt(self.tokenizer, f"{IMAGE_PLACEHOLDER} {QUESTION}", False, None)
        self.words = {name: self.tokenizer.convert_tokens_to_ids(name) for name in COLOURS}
        self.custom_reward = context.reward
        self.rng = random.Random(context.seed)
        held = random.Random(10_007)
        self.held = [draw(held) for _ in range(HELD_OUT)]

    def state(self) -> Any:
        return rng_state(self.rng)

    def set_state(self, state: Any) -> None:
        restore_rng(self.rng, state)

    def prompt(self, image: Any) -> ImagePrompt:
        images = self.encoder.encode([image], "shape_colour")
        return ImagePrompt(self.encoder.expand(self.text_ids, images, "shape_colour"), images)

    def sample(self, count: int) -> tuple[list[list[int]], list[str]]:
        """``count`` training prompts and the colour each one's answer is."""
        drawn = [draw(self.rng) for _ in range(count)]
        return [self.prompt(image) for image, _ in drawn], [colour for _, colour in drawn]

    def held_out(self) -> tuple[list[list[int]], list[str]]:
        return [self.prompt(image) for image, _ in self.held], [colour for _, colour in self.held]

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        pairs = []
        for _ in range(count):
            image, _ = draw(self.rng)
            pairs.append((self.prompt(image), [self.words[self.rng.choice(sorted(COLOURS))], self.tokenizer.eos_token_id]))
        return pairs

    def reward(self, sample: Sample, colour: str) -> float:
        text = decode_completion(self.tokenizer, sample)
        if self.custom_reward is not None:
            return score(self.custom_reward, text, {"prompt": QUESTION, "answer": colour}, "data.reward",
                         "a shape_colour prompt")
        words = text.split()
        return 1.0 if words and words[0] == colour else 0.0

import attrs

from corerl.sdk import Environment, EnvironmentSettings, Turn, hookimpl, setting

corerl_contract = "2.18"


@attrs.define(kw_only=True)
class GuessSettings(EnvironmentSettings):
    hints: bool = setting(True, help="say 'higher' or 'lower' after a wrong guess")


class GuessTheNumber:
    """The row holds a number; the model guesses until it is right (reward 1) or runs out of turns."""

    def __init__(self, context):
        self.hints = context.settings.hints

    def step(self, episode):                      # may also be `async def step`
        target = int(episode.row["answer"])
        try:
            guess = int(episode.response.strip().split()[-1])
        except (ValueError, IndexError):
            return Turn(observation="say a number", reward=0.0)
        if guess == target:
            return Turn(reward=1.0, done=True)
        hint = ("higher" if guess < target else "lower") if self.hints else "no"
        # chat messages work too: [{"role": "user", "content": hint}] is rendered with the chat template
        return Turn(observation=f" {hint}", state={"guesses": (episode.state or {}).get("guesses", 0) + 1})


@hookimpl
def corerl_register_environments(register):
    register(Environment(id="guess", factory=GuessTheNumber, config_schema=GuessSettings,
                         description="guess the row's number, with hints"))

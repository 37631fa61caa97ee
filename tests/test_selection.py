"""The selection rules of the design, each with its reason and warnings."""

from __future__ import annotations

import pytest

from corerl import TrainingBackend
from corerl.errors import ConfigErrors
from corerl.plugin_manager import PluginHost
from corerl.testing import plugin_from, select_for
from tests.conftest import EXAMPLES

BASE = EXAMPLES / "base.yaml"


def pick(overrides, env=None, host=None):
    host = host or PluginHost(env=env or {})
    return select_for(host, BASE, overrides)[1]


def errors_of(overrides, env=None, host=None):
    with pytest.raises(ConfigErrors) as caught:
        pick(overrides, env, host)
    return caught.value.errors


def test_no_section_enabled_selects_dtensor_by_default():
    choice = pick([]).training_backend
    assert choice.id == "dtensor"
    assert "no training backend section is enabled" in choice.reason


def test_megatron_outranks_dtensor_and_the_reason_and_warning_name_dtensor():
    selection = pick(["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=true"])
    assert selection.training_backend.id == "megatron"
    assert "'dtensor' (100, also enabled)" in selection.training_backend.reason
    assert selection.warnings == [
        "training backend 'dtensor' passed over: policy.dtensor_cfg.enabled is true but 'megatron' has a "
        "higher priority (300 > 100); set policy.training_backend to choose"
    ]


def test_full_priority_order_megatron_deepspeed_dtensor():
    all_three = ["policy.megatron_cfg.enabled=true", "policy.deepspeed_cfg.enabled=true", "policy.dtensor_cfg.enabled=true"]
    assert pick(all_three).training_backend.id == "megatron"
    assert pick(all_three[1:]).training_backend.id == "deepspeed"
    assert len(pick(all_three).warnings) == 2


def test_explicit_backend_wins_over_enabled_sections_with_a_warning():
    selection = pick(["policy.training_backend=deepspeed", "policy.megatron_cfg.enabled=true"])
    assert selection.training_backend.id == "deepspeed"
    assert selection.training_backend.reason.startswith("policy.training_backend names 'deepspeed'")
    assert any("'megatron' is not used" in w for w in selection.warnings)


def test_third_party_priority_400_wins_when_enabled_and_not_otherwise():
    host = PluginHost(env={})
    host.register(
        plugin_from(training_backends=[TrainingBackend(id="rocket", priority=400, factory="os:getcwd", config_section="policy.rocket_cfg")]),
        name="rocket",
    )
    assert pick(["policy.rocket_cfg.enabled=true", "policy.megatron_cfg.enabled=true"], host=host).training_backend.id == "rocket"
    assert pick(["policy.rocket_cfg.enabled=false"], host=host).training_backend.id == "dtensor"


def test_equal_priorities_are_refused_as_ambiguous():
    host = PluginHost(env={})
    host.register(
        plugin_from(training_backends=[TrainingBackend(id="twin", priority=300, factory="os:getcwd", config_section="policy.twin_cfg")]),
        name="twin",
    )
    (error,) = errors_of(["policy.twin_cfg.enabled=true", "policy.megatron_cfg.enabled=true"], host=host)
    assert "priority 300" in error.message and error.key == "policy.training_backend"


def test_explicit_backend_that_is_not_installed_lists_installed_ids_and_the_install_line():
    (error,) = errors_of(["policy.training_backend=megatron"], env={"CORERL_LOAD_PLUGINS": "dtensor"})
    line = error.one_line()
    assert error.key == "policy.training_backend"
    assert "installed: dtensor" in line
    assert "pip install ./plugins/megatron" not in line  # it is installed, only disabled
    assert "CORERL_DISABLE_PLUGINS" in line


def test_enabled_section_of_an_absent_plugin_is_an_error_with_its_install_line():
    host = PluginHost(env={"CORERL_LOAD_PLUGINS": "dtensor"})
    host._plugins.pop("deepspeed")  # as if corerl-deepspeed were not installed at all
    (error,) = errors_of(["policy.deepspeed_cfg.enabled=true"], host=host)
    assert error.key == "policy.deepspeed_cfg.enabled"
    assert "install it with: pip install ./plugins/deepspeed" in error.one_line()


def test_unknown_backend_id_suggests_the_closest():
    (error,) = errors_of(["policy.training_backend=dtensr"])
    assert "did you mean 'dtensor'?" in error.one_line()


def test_generation_defaults_to_vllm_and_falls_back_to_hf_without_it():
    assert pick(["policy.generation.backend=null"]).generation_backend.id == "vllm"
    selection = pick(["policy.generation.backend=null"], env={"CORERL_DISABLE_PLUGINS": "vllm"})
    assert selection.generation_backend.id == "hf"
    assert "falling back to 'hf'" in selection.generation_backend.reason
    assert any("vllm is not available" in w for w in selection.warnings)


def test_generation_backend_named_explicitly():
    assert pick(["policy.generation.backend=megatron"]).generation_backend.id == "megatron"
    (error,) = errors_of(["policy.generation.backend=vllm"], env={"CORERL_DISABLE_PLUGINS": "vllm"})
    assert error.key == "policy.generation.backend"


def test_sequence_packer_is_off_unless_enabled_and_then_the_default_algorithm():
    assert pick([]).sequence_packer.id is None
    assert pick(["policy.sequence_packing.enabled=true"]).sequence_packer.id == "modified_first_fit_decreasing"
    (error,) = errors_of(["policy.sequence_packing.enabled=true", "policy.sequence_packing.algorithm=best_fit"])
    assert error.key == "policy.sequence_packing.algorithm"


def test_offload_policy_defaults_to_none():
    assert pick([]).offload_policy.id == "none"
    assert pick(["policy.offload.policy=optimizer"]).offload_policy.id == "optimizer"


def test_a_clashing_id_cannot_be_selected_and_both_plugins_are_named():
    host = PluginHost(env={})
    for name in ("one", "two"):
        host.register(plugin_from(training_backends=[TrainingBackend(id="dup", factory="os:getcwd")]), name=name)
    (error,) = errors_of(["policy.training_backend=dup"], host=host)
    assert "('one' and 'two')" in error.message


def test_a_clashing_id_is_not_selected_by_priority_either():
    host = PluginHost(env={})
    for name in ("one", "two"):
        backend = TrainingBackend(id="dup", priority=500, factory="os:getcwd", config_section="policy.dup_cfg")
        host.register(plugin_from(training_backends=[backend]), name=name)
    (error,) = errors_of(["policy.dup_cfg.enabled=true"], host=host)
    assert error.key == "policy.dup_cfg.enabled" and "('one' and 'two')" in error.message


def test_a_training_backend_that_breaks_the_contract_is_named_at_start(tmp_path):
    from corerl.errors import RegistrationError
    from corerl.recipes import DEMO_RECIPE
    from corerl.run.loop import execute

    class Hollow:  # builds, but offers none of TrainingEngine's methods
        def __init__(self, config):
            self.config = config

        def shutdown(self):
            pass

    host = PluginHost(env={})
    host.register(plugin_from(training_backends=[TrainingBackend(id="hollow", factory=Hollow)]), name="hollowed")
    config, selection = select_for(host, DEMO_RECIPE, ["policy.training_backend=hollow", f"run.output_dir={tmp_path}",
                                                       "policy.generation.backend=hf"])
    with pytest.raises(RegistrationError, match=r"training backend 'hollow' \(plugin 'hollowed'\) built a Hollow without "
                                                r"load_hf, logprobs, train_step"):
        execute(config, selection, host)

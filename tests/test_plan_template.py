"""``corerl plan`` ranks a third-party training backend's layouts with the first-party ones: the
template backend (templates/plugin), installed as an outside package is (an entry point), registers
its memory model, and the plan lists its layout, assessed and ranked, with the generation
engine's share added by the engine's own memory model."""

from __future__ import annotations

import json
import tomllib

from tests.conftest import REPO, clean_env, run_corerl
from tests.test_plan import _qwen

TEMPLATE = REPO / "templates" / "plugin"


def _install_template(fake_site) -> None:
    project = tomllib.loads((TEMPLATE / "pyproject.toml").read_text())["project"]
    source = TEMPLATE / "src"
    fake_site.add_distribution(project["name"], project["version"],
                               entry_points={"corerl.plugins": project["entry-points"]["corerl.plugins"]},
                               files={str(p.relative_to(source)): p.read_text() for p in source.rglob("*.py")})


def test_corerl_plan_lists_and_ranks_the_template_backends_layouts(fake_site, tmp_path):
    _install_template(fake_site)
    _qwen("1.5B", tmp_path / "qwen")
    env = fake_site.env(clean_env(shared_ray=False))
    result = run_corerl("plan", str(tmp_path / "qwen"), "--gpus", "1", "--json", env=env)
    assert result.code == 0, result
    plan = json.loads(result.out)
    ranked = [(c["backend"], c["layout"]) for c in plan["candidates"]]
    assert ("example", "one process") in ranked and {"dtensor", "deepspeed", "megatron"} <= {b for b, _ in ranked}
    (example,) = [c for c in plan["candidates"] if c["backend"] == "example"]
    assert example["fits"] and "policy.training_backend=example" in example["overrides"]
    assert example["generation"].startswith("vLLM") and example["bytes_per_gpu"]["generation"] > 0
    p = 1.54e9  # float32 weights and gradients, AdamW's two moments
    assert abs(example["bytes_per_gpu"]["parameters"] + example["bytes_per_gpu"]["optimizer"] - 12 * p) < 0.01 * 12 * p
    fitting = [c["fits"] for c in plan["candidates"]]
    assert fitting == sorted(fitting, reverse=True)  # ranked: every fitting layout before any that does not
    assert plan["recommended"]["backend"] == "dtensor"  # the backend that prefers a model under 10B
    table = run_corerl("plan", str(tmp_path / "qwen"), "--gpus", "1", "--top", "40", env=env)
    assert table.code == 0 and "example one process" in table.out, table

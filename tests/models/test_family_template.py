"""docs/family_template.py stays in step with the FlowModel interface: it defines exactly the hooks a family may
override (no stale name, none missing), each is a hook of the base class, and it builds and samples on a tiny
random-weight SD3 folder as SD3FlowModel does."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import torch
from family_helpers import make_noise
from omegaconf import OmegaConf

from rlrunner.models import TRAINED_ADAPTER
from rlrunner.models.base import FlowModel
from rlrunner.models.build import BUILD_HOOKS, FAMILY_HOOKS
from rlrunner.models.sd3 import SD3FlowModel
from rlrunner.models.settings import FamilyConfig

TEMPLATE = Path(__file__).resolve().parents[2] / "docs" / "family_template.py"


def _template_class() -> type[FlowModel]:
    spec = importlib.util.spec_from_file_location("family_template", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: its dataclass (the settings section) looks itself up there
    spec.loader.exec_module(module)
    return module.TemplateFlowModel


def _defined_methods(cls: type) -> set[str]:
    """The functions (methods, classmethods, properties) defined in ``cls``'s own body."""
    return {name for name, value in vars(cls).items() if not name.startswith("__")
            and (inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod, property)))}


def test_the_template_defines_exactly_the_family_hooks():
    assert _defined_methods(_template_class()) == set(FAMILY_HOOKS)


def test_every_hook_is_declared_by_the_base_class():
    missing = [name for name in FAMILY_HOOKS if not callable(getattr(FlowModel, name, None))]
    assert missing == []
    # the abstract methods are hooks too: a family that forgets one cannot be instantiated
    assert FlowModel.__abstractmethods__ <= set(FAMILY_HOOKS)


def test_the_template_lists_build_hooks_in_call_order():
    """Its build hooks appear in the file in the order build_family calls them (the docstring's table)."""
    source = TEMPLATE.read_text()
    positions = [source.index(f"def {name}(") for name in BUILD_HOOKS]
    assert positions == sorted(positions)


def test_the_template_builds_and_samples_as_the_sd3_family(tiny_dirs):
    """The template is a working family: on the tiny SD3 folder it holds the adapters SD3FlowModel holds, encodes
    the same conditioning and samples the same latents with classifier-free guidance."""
    cfg = OmegaConf.structured(FamilyConfig(resolution=16, max_sequence_length=8, lora_rank=4, lora_alpha=8,
                                            num_steps=2, eval_num_steps=2, guidance_scale=3.0))
    template, sd3 = (family.load(str(tiny_dirs("sd3")), cfg, device=torch.device("cpu"), dtype=torch.float32)
                     for family in (_template_class(), SD3FlowModel))
    assert template.latent_shape == sd3.latent_shape and template.resolved_guidance == sd3.resolved_guidance
    shapes = [[p.shape for p in model.adapter_parameters(TRAINED_ADAPTER)] for model in (template, sd3)]
    assert shapes[0] == shapes[1] and shapes[0]
    cond = template.encode_prompts(["a cat", 'a sign that says "hi"'])
    torch.testing.assert_close(cond, sd3.encode_prompts(["a cat", 'a sign that says "hi"']))
    noise = make_noise(template, 2, torch.Generator().manual_seed(0))
    ours = template.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=3.0)
    torch.testing.assert_close(ours, sd3.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=3.0))
    assert template.decode(ours).shape == (2, 16, 16, 3)

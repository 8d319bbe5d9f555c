"""Every family trains NFT, FlowGRPO and AWM through the launcher's runner, writes checkpoints, and resumes
bitwise; and resumes on a real Ray cluster with split placement.

For each family and algorithm: two steps with the in-process backend, saving at each step, then the same recipe
resumed from the step-1 checkpoint. For NFT the resumed run is on a real Ray cluster with the actor, rollout and env
on three different devices: results must not depend on the placement (seeds follow sample indices, never ranks or
devices), so the resumed step 2 must give the uninterrupted run's adapters bit for bit. (Ray worker start-up costs
about 15 s a run on 2 cores; one Ray run per family keeps the suite within its time. The Ray path past model
loading is the same for every algorithm: tests/workers/test_data_parallel.py runs FlowGRPO and AWM on Ray with the tiny
model.) The tiny folders come from tests/helpers/tiny_pipelines.py; the reward (JPEG compressibility) varies on any
image, so random-weight models train.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from runner_helpers import train_metrics
from tiny_pipelines import TINY_FAMILY_SETTINGS

from rlrunner.run.runner import run

FAMILIES = ["sd3", "wan22_ti2v_5b", "wan21_t2v", "wan22_t2v_a14b", "qwen_image", "zimage", "flux2_klein", "flux1"]
ALGORITHMS = ["nft", "flow_grpo", "awm"]
SPLIT = ("cluster.backend=ray", "cluster.num_devices_per_node=3",
         "cluster.component_placement={actor: 0, rollout: 1, env: 2}")


def _adapters(log_dir: Path, step: int) -> dict[str, dict[str, torch.Tensor]]:
    """Both adapters of checkpoint ``step`` as the checkpoint's diffusers LoRA files hold them (every file)."""
    from safetensors.torch import load_file

    folder = log_dir / f"checkpoints/global_step_{step}"
    return {adapter: {f"{path.name}:{key}": value for path in sorted((folder / sub).glob("*.safetensors"))
                      for key, value in load_file(path).items()}
            for adapter, sub in (("default", "adapter"), ("ema", "adapter_ema"))}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_trains_checkpoints_and_resumes_bitwise(model_type, algorithm, tiny_dirs, family_recipe, request,
                                                       tmp_path):
    if algorithm == "nft":
        request.getfixturevalue("ray_session")
    folder = tiny_dirs(model_type)
    start = time.monotonic()
    whole = tmp_path / "20260101-000000-whole"
    whole.mkdir(parents=True)
    run(family_recipe(model_type, "cluster.backend=local", algorithm=algorithm), whole)
    local_s = time.monotonic() - start
    resumed = tmp_path / "20260101-000001-resumed"
    resumed.mkdir()
    placement = SPLIT if algorithm == "nft" else ("cluster.backend=local",)
    run(family_recipe(model_type, *placement, f"runner.resume_dir={whole / 'checkpoints' / 'global_step_1'}",
                      algorithm=algorithm), resumed)
    print(f"{model_type} {algorithm}: 2 steps {local_s:.1f} s, resumed ({placement[0]}) "
          f"{time.monotonic() - start - local_s:.1f} s")
    assert [m["step"] for m in train_metrics(resumed)] == [2]
    moved = _adapters(whole, 2)
    before = _adapters(whole, 1)
    assert any(not torch.equal(moved["default"][k], before["default"][k]) for k in moved["default"]), "no training"
    ours = _adapters(resumed, 2)
    for adapter in ("default", "ema"):
        assert ours[adapter].keys() == moved[adapter].keys()
        unequal = [k for k in moved[adapter] if not torch.equal(ours[adapter][k], moved[adapter][k])]
        assert not unequal, f"{model_type} {algorithm} {adapter}: {unequal[:3]} differ after the resumed step"
    ours_metrics, theirs = train_metrics(resumed)[0], train_metrics(whole)[1]
    for key in ("env/avg", "train/actor/grad_norm"):
        assert ours_metrics[key] == theirs[key], key
    if algorithm == "nft":
        _export_loads_into_the_pipeline(model_type, folder, whole, tmp_path / "export")


def _export_loads_into_the_pipeline(model_type: str, folder: Path, log_dir: Path, out: Path) -> None:
    """``bin/rlrunner export`` of the run loads into ``DiffusionPipeline.from_pretrained(folder)`` with the
    pipeline's own ``load_lora_weights``, without a warning about unexpected or missing keys, and changes what the
    pipeline generates."""
    import logging
    import warnings

    import diffusers
    from diffusers import DiffusionPipeline

    from rlrunner.commands.export import main as export_main

    assert export_main([str(log_dir), "--out", str(out)]) == 0
    pipe = DiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    settings = TINY_FAMILY_SETTINGS[model_type]
    height, width = (settings["resolution"],) * 2
    call = {"prompt": 'a sign that says "ab"', "num_inference_steps": 2, "height": height, "width": width,
            "output_type": "latent", "max_sequence_length": settings["max_sequence_length"],
            **({"num_frames": settings["num_frames"]} if "num_frames" in settings else {})}
    before = pipe(**call, generator=torch.Generator().manual_seed(0))[0]
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    diffusers.utils.logging.get_logger("diffusers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipe.load_lora_weights(str(out))
    finally:
        diffusers.utils.logging.get_logger("diffusers").removeHandler(handler)
    messages = records + [str(w.message) for w in caught]
    # peft's and diffusers' words for keys that found no module, or modules left without their keys
    assert not [m for m in messages if re.search(r"unexpected keys|missing (adapter )?keys|inconsistency", m)], messages
    after = pipe(**call, generator=torch.Generator().manual_seed(0))[0]
    assert not torch.allclose(before, after), "the exported adapter did not change the pipeline's output"

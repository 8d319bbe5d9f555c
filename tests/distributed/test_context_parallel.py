"""Context parallelism (Ulysses, through diffusers' ``_cp_plan`` hooks) on CPU gloo ranks: the same loss, LoRA
gradients, adapters and rollouts as one device, per family; dp × cp with DDP and with FSDP2; and the recipe checks
that stop a CP run before launch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cp_helpers import PROMPTS, assert_same_training, both_ranks, engines_ranks, rank_results, reference_run, spawn
from runner_helpers import small_recipe

from rlrunner.config.errors import RecipeError

# per family: settings whose token sequence splits over 2 ranks (Wan 2 latent frames x 2 x 2 patches = 8 tokens,
# trained with gradient checkpointing, which recomputes each block's all-to-alls in backward; Qwen-Image 2 x 2
# patches, its text padded to whole slices; FLUX.1 below)
FAMILIES = {
    "wan22_ti2v_5b": ["resolution=64", "num_frames=5", "max_sequence_length=8", "shift=5.0",
                      "gradient_checkpointing=true"],
    "qwen_image": ["resolution=32", "max_sequence_length=64", "shift=3.0"],
    # 16 px: 4 x 4 packed image tokens and 8 T5 tokens, both split; embedded guidance 3.5 (FLUX.1-dev)
    "flux1": ["resolution=16", "max_sequence_length=8", "guidance_scale=3.5", "eval_guidance_scale=3.5"],
}
VIDEO = ["algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video"]


def cp_recipe(root: Path, tiny_dirs, family: str, *overrides: str):
    """The small runner recipe on the family's tiny folder, fp32: 2 prompts x 4 samples, 2 optimizer steps of 4, at
    the data-parallel tests' learning rate (Adam turns float noise in near-zero gradients into steps of up to lr)."""
    settings = [f"actor.model.{family}.{s}" for s in [*FAMILIES[family], "num_steps=2", "eval_num_steps=2",
                                                      "lora_rank=4", "lora_alpha=8"]]
    return small_recipe(root, f"actor.model.model_type={family}", f"actor.model.model_path={tiny_dirs(family)}",
                        "actor.model.precision=fp32", "actor.model.device=cpu", "actor.optim.lr=1e-3", *settings,
                        *(VIDEO if family.startswith("wan") else []), *overrides)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cp2_on_two_ranks_trains_and_samples_as_one_device(tmp_path, tiny_dirs, family):
    """Ulysses CP = 2 on 2 gloo ranks vs one device, same samples: the NFT loss and the reduced LoRA gradients of a
    micro-batch, the adapters after 2 optimizer steps (atol 1e-5, fp32), and the rollout (x0 and pixels)."""
    cfg = cp_recipe(tmp_path, tiny_dirs, family)
    recipe, data, rollout, single = reference_run(cfg, tmp_path)
    spawn(both_ranks, 2, str(recipe), str(data), PROMPTS, str(tmp_path))
    assert_same_training(rank_results(tmp_path, "actor", 2), single)
    grads = [torch.load(tmp_path / f"actor_rank{r}.pt", weights_only=False)["micro"]["grads"] for r in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))  # the group's ranks hold one gradient
    leader, follower = (torch.load(tmp_path / f"rollout_rank{r}.pt", weights_only=False) for r in (0, 1))
    assert follower is None  # the group's first rank returns its shard
    torch.testing.assert_close(leader.train.tensors["x0"], rollout.train.tensors["x0"], rtol=0, atol=1e-5)
    assert (leader.scored.tensors["images"].int() - rollout.scored.tensors["images"].int()).abs().max() <= 1


@pytest.mark.slow
def test_dp2_cp2_on_four_ranks_with_ddp_and_fsdp2_train_as_one_device(tmp_path, tiny_dirs):
    """dp × cp = 2 × 2 on 4 CPU ranks trains the adapters of one device (which the data-parallel tests show dp = 2
    trains too), with DDP and with FSDP2 sharding over the same mesh."""
    cfg = cp_recipe(tmp_path, tiny_dirs, "wan22_ti2v_5b")
    recipe, data, _, single = reference_run(cfg, tmp_path)
    spawn(engines_ranks, 4, str(recipe), str(data), str(tmp_path))
    ddp, fsdp2 = (rank_results(tmp_path, name, 4) for name in ("ddp", "fsdp2"))
    assert_same_training(ddp, single)
    assert_same_training(fsdp2, ddp)


def _error(root: Path, tiny_dirs, family: str, *overrides: str) -> str:
    with pytest.raises(RecipeError) as err:  # loading a recipe validates it
        cp_recipe(root, tiny_dirs, family, *overrides)
    return str(err.value)


def test_recipe_checks_say_what_cannot_be_split(tmp_path, tiny_dirs, monkeypatch):
    placement = ["cluster.num_devices_per_node=2", "cluster.component_placement={'actor,env,rollout': all}"]
    # each recipe is otherwise valid: these settings split as asked
    cp_recipe(tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2", *placement)
    no_plan = _error(tmp_path, tiny_dirs, "qwen_image", "actor.model.model_type=sd3",
                     f"actor.model.model_path={tiny_dirs('sd3')}", "actor.context_parallel_size=2")
    assert "the sd3 denoiser (SD3Transformer2DModel) has no diffusers _cp_plan; families with one: " in no_plan
    with_plan = no_plan.split("families with one: ")[1].split(", ")
    assert {"wan22_ti2v_5b", "qwen_image"} <= set(with_plan) and not {"sd3", "tiny"} & set(with_plan)
    four = ["cluster.num_devices_per_node=4", "cluster.component_placement={'actor,env,rollout': all}"]
    assert "Ulysses splits the 2 attention heads over the CP group, and 2 is not divisible by 4" in _error(
        tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=4", *four)
    # 32 x 32 at 9 frames: 3 latent frames of 1 x 1 patch = 3 tokens; 5 frames give 2
    assert "rollout.context_parallel_size=2 with actor.model.wan22_ti2v_5b: the latent has 3 tokens, not divisible " \
           "by context parallel size 2; the nearest that are: 2 or 4 (at num_frames 5 they are)" in _error(
               tmp_path, tiny_dirs, "wan22_ti2v_5b", "rollout.context_parallel_size=2",
               "actor.model.wan22_ti2v_5b.num_frames=9", "actor.model.wan22_ti2v_5b.resolution=32", *placement)
    assert "actor.context_parallel_mode=ring needs an attention backend that returns the log-sum-exp" in _error(
        tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2", "actor.context_parallel_mode=ring",
        *placement)
    assert "actor.context_parallel_size=2 does not divide the 3 actor devices" in _error(
        tmp_path, tiny_dirs, "wan22_ti2v_5b", "actor.context_parallel_size=2", "cluster.num_devices_per_node=3",
        "cluster.component_placement={'actor,env,rollout': all}")


def test_vae_tiling_and_slicing_decode_the_same_frames(load_tiny):
    """The options reach Wan's VAE; at the tiny size (below one 256-pixel tile) they decode the same pixels, to the
    rounding of float32 (slicing decodes one video at a time)."""
    plain = load_tiny("wan22_ti2v_5b", resolution=64, num_frames=5)
    tiled = load_tiny("wan22_ti2v_5b", resolution=64, num_frames=5, vae_tiling=True, vae_slicing=True)
    assert tiled.vae.use_tiling and tiled.vae.use_slicing and not plain.vae.use_tiling
    latents = torch.randn((2, *plain.latent_shape), generator=torch.Generator().manual_seed(0))
    difference = plain.decode(latents).astype(int) - tiled.decode(latents).astype(int)
    assert abs(difference).max() <= 1 and (difference == 0).mean() > 0.99


@pytest.mark.ray
@pytest.mark.slow
def test_the_loop_trains_and_resumes_bitwise_with_cp_on_ray(tmp_path, tiny_dirs):
    """Actor cp 2 and rollout cp 2 on 2 devices (env on a third), Ray actors in gloo groups: 2 steps, then the same run resumed from
    its step-1 checkpoint ends with the same adapters and optimizer state, bit for bit."""
    ray = pytest.importorskip("ray")
    from rlrunner.run.runner import run

    cfg_overrides = ["cluster.backend=ray", "cluster.num_devices_per_node=3", "cluster.worker_timeout_s=300",
                     "cluster.component_placement={'actor,rollout': 0-1, env: 2}",
                     "actor.context_parallel_size=2", "rollout.context_parallel_size=2", "runner.max_steps=2",
                     "runner.save_interval=1", "runner.val_before_train=false", "runner.val_check_interval=0",
                     "runner.sample_log_interval=0"]
    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    try:
        runs = []
        for name, extra in (("full", []), ("resumed", ["runner.resume_dir=LOGS/full/checkpoints/global_step_1"])):
            log_dir = tmp_path / "logs" / name
            log_dir.mkdir(parents=True)
            extra = [e.replace("LOGS", str(tmp_path / "logs")) for e in extra]
            run(cp_recipe(tmp_path, tiny_dirs, "wan22_ti2v_5b", *cfg_overrides, *extra), log_dir)
            runs.append(log_dir)
    finally:
        ray.shutdown()
    full, resumed = (torch.load(d / "checkpoints/global_step_2/actor.pt", weights_only=False) for d in runs)
    assert full["world_size"] == 2
    for name, state in full["adapters"].items():
        assert all(torch.equal(tensor, resumed["adapters"][name][key]) for key, tensor in state.items()), name
    for key, moments in full["optimizer"]["state"].items():
        assert all(torch.equal(v, resumed["optimizer"]["state"][key][k]) for k, v in moments.items()
                   if isinstance(v, torch.Tensor)), key
    initial = torch.load(runs[0] / "checkpoints/global_step_1/actor.pt", weights_only=False)
    assert any(not torch.equal(t, initial["adapters"]["default"][k]) for k, t in full["adapters"]["default"].items())

"""``bin/rlrunner plan --simulate`` (:mod:`rlrunner.sizing.simulate`): fake tensors hold what real ones do.

The same tiny families, the same phases, once on fake CPU tensors and once on real CPU tensors of zeros, counted
by the same tracker: every phase's peak and its categories must agree to the byte. A torch, peft or diffusers
release that changes what fake tensors allocate (or breaks building on them) fails here, not on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from shell_helpers import clean_env, run_handed_in_process

from rlrunner.sizing.memory import StepGeometry
from rlrunner.sizing.simulate import simulate_actor, simulate_rollout

REPO = Path(__file__).resolve().parents[2]
#: one rollout call of 4 samples (2 prompts x 2), the actor trains them in 2 micro-batches of 2 on one rank
GEOMETRY = StepGeometry(samples=4, group_size=2, rollout_epochs=1, rollout_workers=1, rollout_cp=1, actor_ranks=1,
                        actor_cp=1, global_batch_size=4,
                        micro_batch_size=2, cfg_factor=1, num_logged_samples=0)


def _phase_bytes(run) -> dict[str, tuple[int, dict[str, int]]]:
    return {phase: (peak.peak, peak.by_category) for phase, peak in run.phases.items()}


@pytest.mark.parametrize("model_type", ["flux1", "wan22_ti2v_5b"])
def test_fake_tensors_count_the_bytes_real_tensors_do(family_recipe, model_type):
    cfg = family_recipe(model_type, "actor.model.precision=bf16", "actor.micro_batch_size=2",
                        "actor.global_batch_size=4", f"actor.model.{model_type}.gradient_checkpointing=true")
    measured = {}
    for fake in (True, False):
        rollout, train = simulate_rollout(cfg, GEOMETRY, fake=fake)
        actor = simulate_actor(cfg, GEOMETRY, train, fake=fake)
        measured[fake] = (_phase_bytes(rollout), _phase_bytes(actor), rollout.resident, actor.resident)
    fake_rollout, fake_actor = measured[True][:2]
    assert set(fake_rollout) == {"rollout_load", "rollout", "decode"}
    assert set(fake_actor) == {"actor_load", "update", "ema", "weight_sync"}
    # the update holds the model, gradients and AdamW's state at its peak: the phases measured something
    assert fake_actor["update"][0] > fake_actor["actor_load"][0] > 0
    fake_run, real_run = measured[True], measured[False]
    assert fake_run[2:] == real_run[2:]  # what each component keeps between phases, to the byte
    for fake_phases, real_phases in zip(fake_run[:2], real_run[:2], strict=True):
        assert fake_phases.keys() == real_phases.keys()
        for phase, (peak, categories) in fake_phases.items():
            real_peak, real_categories = real_phases[phase]
            # model, gradients and AdamW state to the byte; the peak's temporaries to within 1 %: at tiny size a
            # few KiB of elementwise temporaries are counted at a different moment by the two runs (known)
            for category in ("parameters", "gradients", "optimizer state"):
                assert categories.get(category) == real_categories.get(category), (phase, category)
            if phase != "decode":  # the fake decode ends where its pixels go to numpy; the real one goes on
                assert peak == pytest.approx(real_peak, rel=0.01), phase


def _plan(*args: str) -> subprocess.CompletedProcess:
    """``bin/rlrunner plan *args`` from the checkout: the script runs, the Python command it hands over runs in this
    process (:func:`shell_helpers.run_handed_in_process`)."""
    return run_handed_in_process([str(REPO / "bin" / "rlrunner"), "plan", *args], clean_env())


def test_simulate_json_has_the_documented_schema(tiny_dirs):
    done = _plan("tiny_nft_ocr", "actor.model.model_type=flux1", f"actor.model.model_path={tiny_dirs('flux1')}",
                 "actor.model.flux1.resolution=16", "actor.model.flux1.max_sequence_length=8",
                 "actor.model.flux1.num_steps=2", "actor.model.precision=bf16", "--simulate", "--json",
                 "--device-memory", "1GiB")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert set(result) == {"fits", "devices", "not_simulated"}
    assert isinstance(result["fits"], bool) and result["not_simulated"]
    assert all(isinstance(item, str) for item in result["not_simulated"])
    for device in result["devices"]:
        assert set(device) == {"device", "components", "peak_gib", "peak_phase", "phases", "peak_by_category",
                               "categories"}
        assert abs(sum(device["peak_by_category"].values()) - device["peak_gib"]) < 0.01
        assert device["categories"].keys() == device["phases"].keys()
        assert device["categories"][device["peak_phase"]] == device["peak_by_category"]
        for phase, gib in device["phases"].items():
            assert abs(sum(device["categories"][phase].values()) - gib) < 0.01, phase
        assert "update" in device["phases"] and device["peak_phase"] in device["phases"]
        assert device["peak_gib"] == max(device["phases"].values())
        assert all(isinstance(c, str) for c in device["components"]) and isinstance(device["device"], str)
    assert result["fits"]  # a tiny model in 1 GiB


@pytest.mark.parametrize("args, named", [
    (["no_such_recipe", "--simulate"], "no_such_recipe"),
    (["tiny_nft_ocr", "actor.model.model_path=/nonexistent/folder", "--simulate"], "/nonexistent/folder"),
    (["tiny_nft_ocr", "--simulate", "--device-memory", "lots"], "--device-memory"),
    (["tiny_nft_ocr", "--simulate", "--gpu", "abacus"], "--gpu"),
])
def test_simulate_bad_input_is_one_line_and_exit_2(args, named):
    done = _plan(*args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("model_type", ["flux1", "wan22_t2v_a14b"])
def test_fsdp2_load_holds_this_ranks_shard_not_the_whole_denoiser(family_recipe, model_type):
    """The FSDP2 actor keeps its denoiser in host memory and shards it module by module (defect 4 of issue 41): over
    4 ranks the load holds this rank's shards plus one module's full weights at a time (in the tiny models the
    embedders and output layers, about half their weights), never the whole denoiser (both experts of A14B), and
    keeps about a quarter after it (FSDP2 pads each shard: at tiny sizes up to 0.6)."""
    cfg = family_recipe(model_type, "actor.model.precision=bf16", "actor.micro_batch_size=1", "actor.strategy=fsdp2",
                        "actor.global_batch_size=4", f"actor.model.{model_type}.gradient_checkpointing=true")
    loads, kept = {}, {}
    for ranks in (1, 4):
        geometry = dataclasses.replace(GEOMETRY, actor_ranks=ranks, micro_batch_size=1)
        _, train = simulate_rollout(cfg, geometry)
        actor = simulate_actor(cfg, geometry, train)
        loads[ranks] = actor.phases["actor_load"].by_category["parameters"]
        kept[ranks] = actor.phases["ema"].by_category["parameters"]
        assert not any("actor_load" in line for line in actor.not_simulated)
    assert loads[1] / 4 <= loads[4] < loads[1], loads
    assert kept[1] / 4 <= kept[4] < kept[1] * 0.6, kept


def test_rollout_context_parallel_splits_the_sequence(family_recipe):
    """``rollout.context_parallel_size`` 2 runs the model's own CP hooks on rank 0 of 2 fake ranks: the sampler's
    activations shrink, where a whole sequence on one device (the former upper bound) would keep them."""
    # 5 frames of 64 x 64: 512 tokens, enough for the blocks' activations to outweigh the latents at tiny width
    cfg = family_recipe("wan22_ti2v_5b", "actor.model.precision=bf16", "actor.model.wan22_ti2v_5b.resolution=64",
                        "actor.model.wan22_ti2v_5b.num_frames=5", "algorithm.adv_type=grpo_video",
                        "algorithm.advantage_mode=video")
    activations = {}
    for cp in (1, 2):
        geometry = dataclasses.replace(GEOMETRY, rollout_workers=cp, rollout_cp=cp)
        rollout, _ = simulate_rollout(cfg, geometry)
        activations[cp] = rollout.phases["rollout"].by_category["activations"]
        assert not any("context_parallel" in line for line in rollout.not_simulated)
    assert activations[2] < activations[1], activations


def test_env_reward_models_count_where_the_env_is_placed(family_recipe):
    """The env's reward models are not run but their weights count, at the plan's sizes: alone on a device they are
    its whole peak, and beside the actor and rollout they add to every phase."""
    from omegaconf import OmegaConf

    from rlrunner.cluster.placement import parse_placement
    from rlrunner.sizing.memory import env_plan, model_sizes, resolve_model_folder, step_geometry
    from rlrunner.sizing.sim_report import device_results
    from rlrunner.sizing.simulate import simulate_recipe

    clip = REPO / "examples/diffusion/models/tiny-clip"
    cfg = family_recipe("flux1", "actor.model.precision=bf16", "cluster.num_devices_per_node=2",
                        "env.train.reward={model: pickscore, model_path: " + str(clip) + "}",
                        "env.eval.reward={model: clipscore, model_path: " + str(clip) + "}")
    weights = env_plan(cfg.env).resident_bytes
    assert weights > 0  # the tiny CLIP scorers
    sizes = model_sizes(cfg.actor.model, resolve_model_folder(cfg.actor.model.model_path, REPO))
    OmegaConf.set_readonly(cfg, False)
    peaks = {}
    for layout in ({"actor,rollout,env": 0}, {"actor,rollout": 0, "env": 1}):  # the same actor and rollout
        OmegaConf.update(cfg, "cluster.component_placement", layout, merge=False)
        placement = parse_placement(cfg.cluster.component_placement, 1, 2)
        sim = simulate_recipe(cfg, step_geometry(cfg, placement, sizes.guidance))
        peaks[len(layout)] = {r.devices: r for r in device_results(sim, placement, swap=False)}
    split, shared = peaks[2], peaks[1]
    assert split["1"].phases == {"idle": weights}
    assert {phase: peak + weights for phase, peak in split["0"].phases.items()} == shared["0"].phases
    assert any("Reward.device_memory" in line for line in sim.not_simulated)


def test_a_tied_weight_stays_one_tensor_counted_once():
    """T5's encoder embeddings are one parameter in two modules, as ``from_pretrained`` loads them: materialized on
    fake tensors they stay one tensor, counted once (they counted twice, 0.25 GiB too much for SD3.5's T5-XXL)."""
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rlrunner.sizing.fake_build import materialize
    from rlrunner.sizing.tracker import MemoryTracker

    with torch.device("meta"):
        shared, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = shared.weight
    model = nn.ModuleDict({"shared": shared, "head": head})
    tracker = MemoryTracker()
    materialize(model, FakeTensorMode(allow_non_fake_inputs=True), tracker)
    assert model["head"].weight is model["shared"].weight and not model["shared"].weight.is_meta
    assert tracker.totals["parameters"] == 10 * 4 * 4


def test_ddp_over_a_one_rank_group_is_simulated_as_one_rank(family_recipe):
    """``actor.one_rank_group`` with DDP (bench/gpu_check.sh's ddp part): DDP's reducer cannot all-reduce fake tensors
    over the real group of one rank, so that rank is simulated as one rank without DDP, as DDP over several ranks is,
    and the simulation says so."""
    runs = {}
    for grouped in ("false", "true"):
        cfg = family_recipe("flux1", "actor.model.precision=bf16", "actor.micro_batch_size=2", "actor.strategy=ddp",
                            "actor.global_batch_size=4", f"actor.one_rank_group={grouped}")
        _, train = simulate_rollout(cfg, GEOMETRY)
        runs[grouped] = simulate_actor(cfg, GEOMETRY, train)
    assert _phase_bytes(runs["true"]) == _phase_bytes(runs["false"])
    assert any("ddp over a one-rank group" in line for line in runs["true"].not_simulated)
    assert not torch.distributed.is_initialized()  # no group was formed for the simulation

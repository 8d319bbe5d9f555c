"""StepSizes: every size of a training step, against hand-computed values; each refusal names the settings that do not
divide; and no module of the package derives a size of a step itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlrunner.config.errors import RecipeError
from rlrunner.step.sizes import StepSizes, rollout_rounds

PACKAGE = Path(__file__).resolve().parents[2] / "rlrunner"


def _cfg(**sizes: int) -> OmegaConf:
    values = {"total_num_envs": 48, "rollout_epoch": 2, "group_size": 8, "eval_total": 16, "global_batch_size": 32,
              "micro_batch_size": 2, "actor_cp": 2, "rollout_cp": 2, **sizes}
    return OmegaConf.create({
        "env": {"train": {"total_num_envs": values["total_num_envs"], "rollout_epoch": values["rollout_epoch"]},
                "eval": {"total_num_envs": values["eval_total"]}},
        "algorithm": {"group_size": values["group_size"]},
        "actor": {"global_batch_size": values["global_batch_size"], "micro_batch_size": values["micro_batch_size"],
                  "context_parallel_size": values["actor_cp"]},
        "rollout": {"context_parallel_size": values["rollout_cp"]},
        "runner": {"async_reward": True}})


def test_a_step_of_96_samples_on_8_actor_and_6_rollout_devices():
    sizes = StepSizes.from_counts(_cfg(), actor_ranks=8, rollout_workers=6)
    # 48 envs x 2 epochs = 96 samples of 12 prompts (6 per epoch) in groups of 8
    assert (sizes.samples, sizes.prompts, sizes.prompts_per_epoch) == (96, 12, 6)
    # rollout: 6 devices / cp 2 = 3 groups; 12 prompts split in 2 rounds of 6 (6 % 3 == 0): 16 samples a call
    assert (sizes.rollout_groups, sizes.rollout_rounds, sizes.samples_per_rollout_call) == (3, 2, 16)
    assert (sizes.samples_per_rollout_group, sizes.prompts_per_rollout_group, sizes.prompts_per_rollout_call) == (
        32, 4, 2)
    # actor: 8 ranks / cp 2 = 4 groups; 96 / 32 = 3 optimizer steps, each 32 / 4 = 8 samples on a group
    assert (sizes.actor_groups, sizes.optimizer_steps, sizes.local_batch, sizes.samples_per_group) == (4, 3, 8, 24)
    assert sizes.lr_schedule_steps(10) == 30
    assert sizes.steps_per_epoch(100) == 9  # ceil(100 prompts / 12 a step)


def test_rollout_rounds_overlap_reward_only_where_both_rounds_share_evenly():
    assert rollout_rounds(12, 3, async_reward=True) == 2
    assert rollout_rounds(12, 4, async_reward=True) == 1  # 6 prompts a round on 4 groups: uneven
    assert rollout_rounds(12, 3, async_reward=False) == 1


@pytest.mark.parametrize(("sizes", "counts", "message"), [
    ({"actor_cp": 3}, (8, 6), r"^actor.context_parallel_size=3 does not divide the 8 actor devices"),
    ({"global_batch_size": 36}, (8, 6), (r"^actor.global_batch_size=36 is not divisible by actor.micro_batch_size=2 x "
                                        r"4 actor worker group\(s\) = 8 \(the 8 actor devices / "
                                        r"actor.context_parallel_size=2\)$")),
    ({"global_batch_size": 64}, (8, 6), r"= 96 samples, not a multiple of actor.global_batch_size=64$"),
    ({"rollout_cp": 4}, (8, 6), r"^rollout.context_parallel_size=4 does not divide the 6 rollout devices"),
    ({}, (8, 8), (r"= 6 prompts per rollout epoch cannot be shared evenly by 4 rollout worker group\(s\) \(the 8 "
                 r"rollout devices / rollout.context_parallel_size=2\)$")),
    ({"eval_total": 2}, (8, 6), r"^env.eval.total_num_envs=2 is fewer than the 3 rollout worker group\(s\)"),
])
def test_sizes_that_do_not_divide_stop_the_recipe_naming_the_settings(sizes, counts, message):
    with pytest.raises(RecipeError, match=message):
        StepSizes.from_counts(_cfg(**sizes), *counts)


#: divisions and products that derive a step's sizes (from the recipe's sizes or the workers' counts)
SIZE_ARITHMETIC = re.compile(r"total_num_envs\s*(//|\*)|global_batch_size\s*//|\*\s*[\w.]*rollout_epoch|"
                             r"//\s*[\w.]*(context_parallel_size|_cp)\b|//\s*[\w.]*group_size\b|"
                             r"(world_size|ranks|workers|num_workers\([^)]*\))\s*//")
#: what matches and is no size of a step: an index, a device mesh's shape below step/, pure math on a given batch
NOT_A_STEP_SIZE = {
    "rlrunner/step/sample_order.py": "rank // self.context_parallel_size",  # a rank's group index
    "rlrunner/workers/rollout.py": "rank // context_parallel_size",  # a rollout rank's group index
    "rlrunner/distributed/context_parallel.py": "dp = world_size // context_parallel_size",  # a device mesh's shape
    "rlrunner/algorithms/watch.py": "torch.arange(n) // group_size",  # each sample's prompt index
    "rlrunner/algorithms/advantages.py": "rewards.shape[0] // group_size",  # a batch of rewards in its groups
    "rlrunner/sizing/simulate.py": "n // geometry.group_size",  # the prompts of a simulated batch of n samples
    "rlrunner/data/checks.py": "env.total_num_envs // group_size",  # a valid value to suggest in a message
}


def test_no_module_derives_a_size_of_a_step_outside_step_sizes():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE.parent))
        if name == "rlrunner/step/sizes.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SIZE_ARITHMETIC.search(line) and NOT_A_STEP_SIZE.get(name, "\0") not in line:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == [], "derive these from rlrunner.step.sizes.StepSizes:\n" + "\n".join(found)


def test_the_search_sees_a_size_derived_by_hand():
    line = "        local_batch = self.cfg.global_batch_size // self.data_parallel_size"
    assert SIZE_ARITHMETIC.search(line)
    assert SIZE_ARITHMETIC.search("    prompts = cfg.env.train.total_num_envs // cfg.algorithm.group_size")
    assert SIZE_ARITHMETIC.search("    shards = placement.num_workers('rollout') // 2")

"""The batch type: per-sample tensors and metadata, and per-prompt tensors reached through ``prompt_index``."""

from __future__ import annotations

import torch

from rlrunner.step.batch import Batch


def _groups() -> Batch:
    """3 prompts x 2 samples; prompt p's conditioning row is [p, p], sample i's x0 is i."""
    return Batch({"x0": torch.arange(6.0)}, {"prompts": ["a", "a", "b", "b", "c", "c"]},
                 {"cond": torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])}, torch.tensor([0, 0, 1, 1, 2, 2]))


def test_per_sample_expands_each_prompt_row_to_its_samples():
    batch = _groups()
    assert len(batch) == 6 and batch.num_prompts == 3
    expected = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]])
    assert torch.equal(batch.per_sample()["cond"], expected)


def test_select_keeps_only_the_rows_its_samples_use_and_remaps_the_index():
    picked = _groups().select([5, 0, 4])  # samples of prompts c, a, c
    assert picked.meta["prompts"] == ["c", "a", "c"]
    assert torch.equal(picked.tensors["x0"], torch.tensor([5.0, 0.0, 4.0]))
    assert torch.equal(picked.per_prompt["cond"], torch.tensor([[0.0, 0.0], [2.0, 2.0]]))  # a, c (sorted rows)
    assert torch.equal(picked.prompt_index, torch.tensor([1, 0, 1]))
    assert torch.equal(picked.per_sample()["cond"][:, 0], torch.tensor([2.0, 0.0, 2.0]))


def test_split_gives_pieces_that_carry_only_their_prompts():
    pieces = _groups().split(4)
    assert [len(p) for p in pieces] == [4, 2]
    assert torch.equal(pieces[0].per_prompt["cond"][:, 0], torch.tensor([0.0, 1.0]))
    assert torch.equal(pieces[1].per_prompt["cond"][:, 0], torch.tensor([2.0]))
    assert torch.equal(pieces[1].prompt_index, torch.tensor([0, 0]))
    halves = _groups().split(3)  # samples 0-2 (prompts a, a, b) and 3-5 (b, c, c)
    assert [h.num_prompts for h in halves] == [2, 2]
    for half, start in zip(halves, (0, 3)):
        assert torch.equal(half.per_sample()["cond"], _groups().per_sample()["cond"][start:start + 3])


def test_cat_offsets_the_index_by_the_prompts_before_each_batch():
    first, second = _groups().select(slice(0, 4)), _groups().select(slice(2, 6))
    joined = Batch.cat([first, second])
    assert joined.num_prompts == 4  # a, b | b, c: each batch keeps its own rows
    assert torch.equal(joined.prompt_index, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    assert torch.equal(joined.per_sample()["cond"][:, 0], torch.tensor([0.0, 0, 1, 1, 1, 1, 2, 2]))
    assert joined.meta["prompts"] == ["a", "a", "b", "b", "b", "b", "c", "c"]


def test_cat_pads_ragged_per_prompt_text_to_the_longest():
    """Qwen-Image shards encode to the longest prompt of each shard: embeddings [P, L, D] and mask [P, L]."""
    short = Batch({"x0": torch.zeros(2)}, {}, {"emb": torch.ones(1, 2, 3), "mask": torch.ones(1, 2, dtype=torch.long)},
                  torch.tensor([0, 0]))
    long = Batch({"x0": torch.zeros(1)}, {}, {"emb": torch.full((1, 4, 3), 2.0),
                                              "mask": torch.ones(1, 4, dtype=torch.long)}, torch.tensor([0]))
    joined = Batch.cat([short, long])
    assert joined.per_prompt["emb"].shape == (2, 4, 3) and torch.equal(joined.prompt_index, torch.tensor([0, 0, 1]))
    assert torch.equal(joined.per_prompt["mask"], torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
    assert torch.equal(joined.per_prompt["emb"][0, 2:], torch.zeros(2, 3))


def test_a_batch_without_per_prompt_tensors_behaves_as_before():
    batch = Batch({"x0": torch.arange(4.0)}, {"prompts": list("wxyz")})
    picked = batch.select(torch.tensor([3, 1]))
    assert picked.prompt_index is None and picked.per_sample() == {}
    assert Batch.cat([picked, batch.select(slice(0, 1))]).meta["prompts"] == ["z", "x", "w"]


"""The reward server serves the CLIP-family rewards: ``python -m rlrunner.commands.serve_reward --reward pickscore`` (a real
process on 127.0.0.1) scores images and video frames exactly as the local reward does, through ``model: remote``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from service_helpers import reward_server

from rlrunner.rewards import build_reward

TINY_CLIP = Path(__file__).resolve().parents[2] / "examples/diffusion/models/tiny-clip"


def test_the_server_scores_a_clip_reward_like_the_local_one():
    name = "pickscore"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 40, 32, 3), dtype=np.uint8)
    frames = rng.integers(0, 256, (1, 5, 40, 32, 3), dtype=np.uint8)
    prompts = ["a red cube", "a red cube", "two dogs"]
    local = build_reward({"model": name, "model_path": str(TINY_CLIP)})
    with reward_server("--reward", name, "--set", f"model_path={TINY_CLIP}") as (url, _):
        remote = build_reward({"model": "remote", "url": url})
        served = remote(images, prompts)
        served_video = remote(frames, ["two dogs"])
    np.testing.assert_allclose(served.avg, local(images, prompts).avg, rtol=1e-5, atol=1e-6)
    assert served_video.avg.shape == (1, 2)  # [frame 0, mean(frames 1-4)], chunked by the client
    np.testing.assert_allclose(served_video.avg, local(frames, ["two dogs"]).avg, rtol=1e-5, atol=1e-6)

"""GenEval scoring on synthetic detections with hand-computed expectations, and the geneval reward end to end
against a stub detector server on 127.0.0.1 (images plus each prompt's metadata in, partial credit and per-tag
accuracy out)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from service_helpers import StubServer

from rlrunner.rewards import build_reward
from rlrunner.rewards.geneval import Detection, correct, partial_score, relative_position, select_objects
from rlrunner.rewards.geneval.scoring import check_metadata


def det(label: str, box: list[float], score: float = 0.95, color: str | None = None) -> dict:
    return {"label": label, "box": box, "score": score, "color": color}


TWO_CATS = {"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}


def test_thresholds_order_and_cap():
    detections = [det("cat", [0, 0, 9, 9], 0.5), det("cat", [20, 0, 29, 9], 0.95), det("dog", [0, 0, 5, 5], 0.3)]
    # 0.3 is not above the 0.3 threshold; the most confident cat comes first
    objects = select_objects(detections, "single_object")
    assert list(objects) == ["cat"] and [o.score for o in objects["cat"]] == [0.95, 0.5]
    # counting keeps only detections above 0.9
    assert [o.score for o in select_objects(detections, "counting")["cat"]] == [0.95]
    many = [det("cat", [i, 0, i + 1, 1], 0.5 + i / 100) for i in range(20)]
    assert len(select_objects(many, "single_object")["cat"]) == 16


def test_relative_position_by_hand():
    a = Detection((0, 0, 10, 10), 1.0)     # centre (5, 5)
    b = Detection((30, 2, 40, 12), 1.0)    # centre (35, 7)
    # offset a-b = (-30, -2); shrink by 0.1 * (10 + 10) = 2 per axis -> (-28, 0); / |offset| (30.07): dx = -0.93
    assert relative_position(a, b) == {"left of"}
    assert relative_position(b, a) == {"right of"}
    below = Detection((0, 40, 10, 50), 1.0)
    assert relative_position(below, a) == {"below"} and relative_position(a, below) == {"above"}
    # diagonal (offset (20, 20), shrunk to (18, 18)): 18 / 28.28 = 0.64 > 0.5 on both axes
    assert relative_position(Detection((20, 20, 30, 30), 1.0), a) == {"right of", "below"}
    # overlapping boxes: the shrunk offset vanishes, no relation
    assert relative_position(Detection((1, 0, 11, 10), 1.0), a) == set()


def test_counting_strict_and_partial():
    two = select_objects([det("cat", [0, 0, 9, 9]), det("cat", [20, 0, 29, 9])], "counting")
    assert correct(two, TWO_CATS) == (True, [])
    assert partial_score(two, TWO_CATS) == (1.0, True)
    three = select_objects([det("cat", [0, 0, 9, 9]), det("cat", [20, 0, 29, 9]), det("cat", [40, 0, 49, 9])],
                           "counting")
    # GenEval's accuracy asks for at least two; the training reward for exactly two: 1 - |2 - 3| / 2 = 0.5
    assert correct(three, TWO_CATS)[0] is True
    assert partial_score(three, TWO_CATS) == (0.5, False)
    one = select_objects([det("cat", [0, 0, 9, 9])], "counting")
    ok, reasons = correct(one, TWO_CATS)
    assert not ok and reasons == ["expected cat>=2, found 1"]
    assert partial_score(one, TWO_CATS) == (0.5, False)
    assert partial_score({}, TWO_CATS) == (0.0, False)


def test_colors_partial_credit():
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    red = select_objects([det("car", [0, 0, 9, 9], color="red")], "colors")
    blue = select_objects([det("car", [0, 0, 9, 9], color="blue")], "colors")
    assert correct(red, meta)[0] and partial_score(red, meta) == (1.0, True)
    # count right (1), colour wrong (0): mean 0.5
    assert not correct(blue, meta)[0] and partial_score(blue, meta) == (0.5, False)
    # no car: count credit 0 and the colour check that cannot run scores 0
    assert partial_score({}, meta) == (0.0, False)


def test_color_attr_two_clauses():
    meta = {"tag": "color_attr", "include": [{"class": "bench", "count": 1, "color": "green"},
                                             {"class": "vase", "count": 1, "color": "purple"}]}
    objects = select_objects([det("bench", [0, 0, 9, 9], color="green"), det("vase", [20, 0, 29, 9], color="red"),
                              det("vase", [40, 0, 49, 9], 0.5, color="purple")], "color_attr")
    # official: the most confident vase is red -> wrong
    assert not correct(objects, meta)[0]
    # training: bench 1 + green 1; vase count 1 - |1 - 2| / 1 = 0, colour check cannot run: 0 -> 2 / 4
    assert partial_score(objects, meta) == (0.5, False)


def test_position():
    meta = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                           {"class": "cat", "count": 1, "position": ["left of", 0]}]}
    left = select_objects([det("dog", [30, 2, 40, 12]), det("cat", [0, 0, 10, 10])], "position")
    right = select_objects([det("dog", [0, 0, 10, 10]), det("cat", [30, 2, 40, 12])], "position")
    assert correct(left, meta) == (True, [])
    assert partial_score(left, meta) == (1.0, True)
    ok, reasons = correct(right, meta)
    assert not ok and reasons == ["expected cat left of the dog"]
    # dog 1, cat 1, position 0 -> 2 / 3 (the anchors' code would also append a 1 here: 3 / 4)
    assert partial_score(right, meta) == pytest.approx((2 / 3, False))
    no_dog = select_objects([det("cat", [0, 0, 10, 10])], "position")
    assert partial_score(no_dog, meta) == pytest.approx((1 / 3, False))  # dog 0, cat 1, no target 0


def test_exclude_fails_accuracy_only():
    meta = {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "exclude": [{"class": "cat",
                                                                                           "count": 2}]}
    two = select_objects([det("cat", [0, 0, 9, 9]), det("cat", [20, 0, 29, 9])], "single_object")
    ok, reasons = correct(two, meta)
    assert not ok and reasons == ["expected cat<2, found 2"]
    assert partial_score(two, meta) == (0.0, False)  # 1 - |1 - 2| / 1; exclude clauses are not scored


@pytest.mark.parametrize("meta, fragment", [
    ({}, "tag None"),
    ({"tag": "counting"}, "no 'include'"),
    ({"tag": "counting", "include": [{"class": "cat", "count": 0}]}, "'count' >= 1"),
    ({"tag": "position", "include": [{"class": "cat", "count": 1, "position": ["left of", 0]}]}, "earlier clause"),
])
def test_bad_metadata_is_named(meta, fragment):
    assert fragment in check_metadata(meta)


def test_geneval_reward_end_to_end():
    seen = []
    answers = {  # by the image's first pixel value, as the stub cannot see prompts
        0: [det("cat", [0, 0, 9, 9]), det("cat", [20, 0, 29, 9])],      # two cats: right
        1: [det("cat", [0, 0, 9, 9])],                                    # one cat: 0.5, wrong
        2: [det("car", [0, 0, 9, 9], color="red")],                       # red car: right
    }

    def answer(body: dict) -> tuple[int, bytes]:
        from rlrunner.rewards.serving.wire import decode_image

        seen.append(body)
        detections = [answers[int(decode_image(im, 10**6)[0, 0, 0])] for im in body["images"]]
        return 200, json.dumps({"detections": detections}).encode()

    images = np.stack([np.full((16, 16, 3), v, dtype=np.uint8) for v in (0, 1, 2, 3)])
    prompts = ["a photo of two cats", "a photo of two cats", "a photo of a red car", "no record"]
    colors = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    metadata = [TWO_CATS, TWO_CATS, colors, {}]
    with StubServer(answer) as stub:
        reward = build_reward({"model": "geneval", "url": stub.url, "max_retries": 0, "batch_size": 2})
        assert reward.uses_metadata
        out = reward(images, prompts, metadata=metadata)
    np.testing.assert_allclose(out.avg, [1.0, 0.5, 1.0, 0.0])
    assert out.errors == 1 and out.extra["error_reasons"] == {"no GenEval record": 1}
    assert sorted(len(b["images"]) for b in seen) == [1, 2]  # batch_size images per request; the bad one not sent
    metrics = out.metrics()
    assert metrics["geneval"] == pytest.approx(2.5 / 4)
    assert metrics["geneval/accuracy"] == pytest.approx(2 / 4)
    assert metrics["geneval/counting"] == pytest.approx(0.5) and metrics["geneval/colors"] == 1.0
    # GenEval's overall score is the mean over tags, not over images: (0.5 + 1) / 2 (the unrecorded sample has no tag)
    assert metrics["geneval/overall"] == pytest.approx(0.75)


def test_malformed_detector_answer_is_counted():
    with StubServer(lambda body: (200, b'{"detections": [[{"label": "cat"}]]}')) as stub:
        out = build_reward({"model": "geneval", "url": stub.url, "max_retries": 0})(
            np.zeros((1, 16, 16, 3), np.uint8), ["two cats"], metadata=[TWO_CATS])
    assert out.errors == 1 and "malformed detection" in out.failure


@pytest.mark.slow
def test_a_run_trains_and_evaluates_on_geneval_records(tmp_path):
    """One tiny step with .jsonl GenEval records: the stub detector always sees two cats, so the counting prompts
    are right and the colour prompts wrong; the eval logs that per tag."""
    from runner_helpers import read_metrics, small_recipe

    from rlrunner.run.runner import run

    red_car = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    records = [{**TWO_CATS, "prompt": f"a photo of two cats, take {i}"} for i in range(2)]
    records += [{**red_car, "prompt": f"a photo of a red car, take {i}"} for i in range(2)]
    prompts = tmp_path / "geneval.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    cats = json.dumps([det("cat", [0, 0, 9, 9]), det("cat", [20, 0, 29, 9])])

    def answer(body: dict) -> tuple[int, bytes]:
        return 200, f'{{"detections": [{", ".join([cats] * len(body["images"]))}]}}'.encode()

    with StubServer(answer) as stub:
        reward = [f"env.{split}.reward.{key}" for split in ("train", "eval") for key in
                  ("model=geneval", f"url={stub.url}")]
        cfg = small_recipe(tmp_path, f"env.train.dataset.path={prompts}", f"env.eval.dataset.path={prompts}",
                           *reward, "runner.max_steps=1", "runner.save_interval=0", "runner.val_before_train=false")
        log_dir = tmp_path / "run"
        log_dir.mkdir()
        run(cfg, log_dir)
    (evaluated,) = [m for m in read_metrics(log_dir) if "eval/avg" in m]
    assert evaluated["eval/avg"] == 0.5
    assert evaluated["eval/geneval/counting"] == 1.0 and evaluated["eval/geneval/colors"] == 0.0
    assert evaluated["eval/geneval/accuracy"] == 0.5 and evaluated["eval/geneval/overall"] == 0.5
    (trained,) = [m for m in read_metrics(log_dir) if "env/avg" in m]
    assert trained["env/geneval/counting"] == 1.0


def test_recipe_and_shipped_records(monkeypatch):
    """sd3_nft_geneval validates with DiffusionNFT's GenEval numbers, and every shipped test record is well-formed."""
    from pathlib import Path

    from rlrunner.recipe import load_recipe

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    test_file = root / "examples/diffusion/data/geneval/test.jsonl"
    cfg = load_recipe("sd3_nft_geneval", [f"env.train.dataset.path={test_file}"])  # train.jsonl is not shipped
    assert (cfg.env.train.reward.model, cfg.env.eval.reward.model) == ("geneval", "geneval")
    assert (cfg.algorithm.nft_beta, list(cfg.algorithm.nft_tau), cfg.algorithm.group_size) == (1.0, [1.0, 0.5, 0, 500],
                                                                                                24)
    assert cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch == cfg.actor.global_batch_size == 48 * 24
    records = [json.loads(line) for line in test_file.read_text().splitlines()]
    assert len(records) == cfg.env.eval.total_num_envs == 2212
    assert [check_metadata(r) for r in records] == [None] * len(records)
    # plain-text prompts carry no records: the recipe stops before any worker starts, naming the file and prompt
    from rlrunner.config.errors import RecipeError

    with pytest.raises(RecipeError, match=r"env.train.dataset.path=.*tiny_ocr.*GenEval tag None.*needs a .jsonl"):
        load_recipe("sd3_nft_geneval", ["env.train.dataset.path=examples/diffusion/data/tiny_ocr"])


def test_detector_server_http_side_feeds_the_reward(tmp_path):
    """The detector server's HTTP side (the standalone script, with a detector function in place of Mask2Former)
    answers the geneval reward, which scores what it detected; bad requests get 400, a missing token 401."""
    import threading

    import requests

    from rlrunner.rewards.geneval.detector_server import make_server

    def detect(images: list[np.ndarray]) -> list[list[dict]]:  # two cats in dark images, none in bright ones
        return [[det("cat", [0, 0, 9, 9]), det("cat", [20, 0, 29, 9])] if im.mean() < 128 else [] for im in images]

    server = make_server(detect, "127.0.0.1", 0, token="s3cret")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        (tmp_path / "token").write_text("s3cret\n")
        reward = build_reward({"model": "geneval", "url": url, "token_file": str(tmp_path / "token"), "max_retries": 0})
        images = np.stack([np.zeros((16, 16, 3), np.uint8), np.full((16, 16, 3), 255, np.uint8)])
        out = reward(images, ["two cats", "two cats"], metadata=[TWO_CATS, TWO_CATS])
        np.testing.assert_allclose(out.avg, [1.0, 0.0])
        assert out.errors == 0 and out.extra["accuracy"] == [1.0, 0.0]
        headers = {"Authorization": "Bearer s3cret"}
        assert requests.post(f"{url}/detect", json={"images": ["not base64!"]}, headers=headers).status_code == 400
        assert requests.post(f"{url}/detect", json={"images": []}).status_code == 401
        assert requests.get(f"{url}/score", headers=headers).status_code == 404
        with pytest.raises(ValueError, match="token"):
            make_server(detect, "0.0.0.0", 0)
    finally:
        server.shutdown()
        server.server_close()

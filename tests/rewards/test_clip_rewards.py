"""CLIP-family rewards on tiny random models of the real classes: each formula against values computed by hand from
the model's raw tensors, the HPS converter against plain torch ops on open_clip-layout tensors, video chunking,
text encoded once per prompt, and loading errors that name the missing file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlrunner.rewards import build_reward, chunk_frame_scores
from rlrunner.rewards.clip import aesthetic_mlp, open_clip_to_clip
from rlrunner.rewards.clip.loading import OPENAI_MEAN, OPENAI_STD
from rlrunner.rewards.clip.tiny import IMAGE_SIZE, TEXT_CONTEXT, byte_vocab, write_random_tiny_clip, write_tokenizer

PROMPTS = ["a red cube", "a red cube", "two dogs", "two dogs"]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> Path:
    return write_random_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


def images(n: int, seed: int = 0, size: int = IMAGE_SIZE) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, 256, (n, size, size, 3)).astype(np.uint8)


def reference_features(folder: Path, imgs: np.ndarray, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Normalised image and text features by hand: 28 px images need no resize, so preprocessing is
    ``(x / 255 − mean) / std``; text is tokenised with the saved tokenizer."""
    from transformers import AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(folder).eval()
    pixels = (imgs / 255.0 - np.array(OPENAI_MEAN)) / np.array(OPENAI_STD)
    pixels = torch.from_numpy(pixels.transpose(0, 3, 1, 2)).float()
    tokens = AutoTokenizer.from_pretrained(folder)(prompts, padding="max_length", max_length=TEXT_CONTEXT,
                                                   return_tensors="pt")
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixels).pooler_output
        text = model.get_text_features(**tokens).pooler_output
    return F.normalize(image, dim=-1), F.normalize(text, dim=-1), float(model.logit_scale.detach().exp())


def test_pickscore_and_clipscore_equal_their_formulas(tiny_clip):
    imgs = images(4)
    image, text, scale = reference_features(tiny_clip, imgs, PROMPTS)
    cos = (image * text).sum(-1).numpy()
    pick = build_reward({"model": "pickscore", "model_path": str(tiny_clip), "batch_size": 3})(imgs, PROMPTS)
    clip = build_reward({"model": "clipscore", "model_path": str(tiny_clip)})(imgs, PROMPTS)
    assert scale == pytest.approx(100.0, rel=1e-5)  # the tiny model's exp(logit_scale), as PickScore_v1's
    np.testing.assert_allclose(pick.avg, 100.0 * cos / 26.0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(clip.avg, cos, rtol=1e-4, atol=1e-6)
    assert pick.parts["pickscore"].shape == (4,) and pick.errors == 0
    assert np.ptp(clip.avg) > 1e-4  # the random model tells the images apart


def test_each_prompt_is_encoded_once_per_batch(tiny_clip):
    reward = build_reward({"model": "clipscore", "model_path": str(tiny_clip)})
    calls: list[list[str]] = []
    encode = reward.text_features
    reward.text_features = lambda prompts: calls.append(list(prompts)) or encode(prompts)
    reward(images(4), PROMPTS)
    assert calls == [["a red cube", "two dogs"]]


def test_resize_and_crop_match_the_pil_image_processor(tiny_clip):
    """Images larger than the model's input go through the on-device resize + centre crop; the result matches
    transformers' PIL image processor within resampling differences."""
    from transformers import CLIPImageProcessor

    from rlrunner.rewards.clip.loading import ImageTransform

    imgs = np.random.RandomState(3).randint(0, 256, (2, 40, 56, 3)).astype(np.uint8)
    imgs = np.repeat(np.repeat(imgs[:, ::4, ::4], 4, axis=1), 4, axis=2)[:, :40, :56]  # smooth enough to resample
    ours = ImageTransform.from_processor(str(tiny_clip), "reward.processor_path")(imgs, torch.device("cpu"),
                                                                                   torch.float32)
    pil = CLIPImageProcessor.from_pretrained(tiny_clip)(list(imgs), return_tensors="pt")["pixel_values"]
    assert ours.shape == pil.shape == (2, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert (ours - pil).abs().mean() < 0.05  # normalised units (std ~1.7 over [0, 255])


def test_aesthetic_is_the_mlp_of_the_normalised_image_embedding(tiny_clip, tmp_path):
    torch.manual_seed(1)
    head = aesthetic_mlp(16)
    torch.save({f"layers.{k}": v for k, v in head.state_dict().items()}, tmp_path / "head.pth")
    imgs = images(3, seed=2)
    image, _, _ = reference_features(tiny_clip, imgs, ["x"] * 3)
    x = image.numpy().astype(np.float64)
    for k in (0, 2, 4, 6, 7):  # the Linear layers; dropouts are identities at eval and there are no activations
        x = x @ head[k].weight.detach().numpy().T + head[k].bias.detach().numpy()
    out = build_reward({"model": "aesthetic", "model_path": str(tiny_clip), "head_path": str(tmp_path / "head.pth")})
    np.testing.assert_allclose(out(imgs, ["ignored"] * 3).avg, x[:, 0], rtol=1e-4, atol=1e-6)


def test_video_frames_are_scored_as_images_and_chunked_like_video_ocr(tiny_clip):
    frames = images(2 * 9, seed=4).reshape(2, 9, IMAGE_SIZE, IMAGE_SIZE, 3)
    reward = build_reward({"model": "pickscore", "model_path": str(tiny_clip), "frame_interval": 4})
    per_frame = reward(frames.reshape(-1, IMAGE_SIZE, IMAGE_SIZE, 3), ["p"] * 9 + ["q"] * 9).avg.reshape(2, 9)
    out = reward(frames, ["p", "q"])
    assert out.avg.shape == (2, 3)  # [frame 0, mean(1-4), mean(5-8)]
    np.testing.assert_allclose(out.avg, chunk_frame_scores(per_frame, 4), rtol=1e-5)
    np.testing.assert_allclose(out.parts["pickscore"], out.avg.mean(axis=1), rtol=1e-6)


def test_unscorable_images_score_zero_and_are_counted(tiny_clip):
    imgs = images(2).astype(np.float32) / 255
    imgs[1, 0, 0, 0] = np.nan
    out = build_reward({"model": "clipscore", "model_path": str(tiny_clip)})(imgs, ["a", "b"])
    assert out.errors == 1 and out.avg[1] == 0.0 and out.avg[0] != 0.0


# ------------------------------------------------------------------------------------------------ HPSv2.1

V_WIDTH, T_WIDTH, EMBED, PATCH = 160, 128, 16, 14  # 2 heads of open_clip ViT-H-14's widths 80 (vision), 64 (text)


def fake_open_clip_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A one-block-per-tower open_clip CLIP state dict (HPS_v2.1_compressed.pt's key layout), random values."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.05) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def block(prefix: str, w: int) -> dict[str, torch.Tensor]:
        return {f"{prefix}ln_1.weight": 1 + rand(w), f"{prefix}ln_1.bias": rand(w),
                f"{prefix}attn.in_proj_weight": rand(3 * w, w), f"{prefix}attn.in_proj_bias": rand(3 * w),
                f"{prefix}attn.out_proj.weight": rand(w, w), f"{prefix}attn.out_proj.bias": rand(w),
                f"{prefix}ln_2.weight": 1 + rand(w), f"{prefix}ln_2.bias": rand(w),
                f"{prefix}mlp.c_fc.weight": rand(4 * w, w), f"{prefix}mlp.c_fc.bias": rand(4 * w),
                f"{prefix}mlp.c_proj.weight": rand(w, 4 * w), f"{prefix}mlp.c_proj.bias": rand(w)}

    grid = IMAGE_SIZE // PATCH
    return {"visual.conv1.weight": rand(V_WIDTH, 3, PATCH, PATCH), "visual.class_embedding": rand(V_WIDTH),
            "visual.positional_embedding": rand(grid * grid + 1, V_WIDTH),
            "visual.ln_pre.weight": 1 + rand(V_WIDTH), "visual.ln_pre.bias": rand(V_WIDTH),
            **block("visual.transformer.resblocks.0.", V_WIDTH),
            "visual.ln_post.weight": 1 + rand(V_WIDTH), "visual.ln_post.bias": rand(V_WIDTH),
            "visual.proj": rand(V_WIDTH, EMBED, scale=0.1),
            "token_embedding.weight": rand(len(byte_vocab()), T_WIDTH), "positional_embedding": rand(TEXT_CONTEXT,
                                                                                                     T_WIDTH),
            **block("transformer.resblocks.0.", T_WIDTH),
            "ln_final.weight": 1 + rand(T_WIDTH), "ln_final.bias": rand(T_WIDTH),
            "text_projection": rand(T_WIDTH, EMBED, scale=0.1), "logit_scale": torch.tensor(math.log(100.0))}


def open_clip_block(s: dict[str, torch.Tensor], p: str, x: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    """open_clip's ResidualAttentionBlock with plain torch ops: x + attn(ln_1 x); x + mlp(ln_2 x) (GELU)."""
    w = x.shape[-1]
    h = F.layer_norm(x, (w,), s[f"{p}ln_1.weight"], s[f"{p}ln_1.bias"])
    q, k, v = (h @ s[f"{p}attn.in_proj_weight"].t() + s[f"{p}attn.in_proj_bias"]).chunk(3, dim=-1)
    q, k, v = (t.reshape(*t.shape[:2], heads, w // heads).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(w // heads)
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
    x = x + attn @ s[f"{p}attn.out_proj.weight"].t() + s[f"{p}attn.out_proj.bias"]
    h = F.layer_norm(x, (w,), s[f"{p}ln_2.weight"], s[f"{p}ln_2.bias"])
    return x + F.gelu(h @ s[f"{p}mlp.c_fc.weight"].t() + s[f"{p}mlp.c_fc.bias"]) @ s[f"{p}mlp.c_proj.weight"].t() \
        + s[f"{p}mlp.c_proj.bias"]


def open_clip_features(s: dict[str, torch.Tensor], pixels: torch.Tensor, ids: torch.Tensor) -> tuple:
    """open_clip's encode_image / encode_text (normalised) from the raw tensors."""
    x = F.conv2d(pixels, s["visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    x = torch.cat([s["visual.class_embedding"].expand(len(x), 1, -1), x], dim=1) + s["visual.positional_embedding"]
    x = F.layer_norm(x, (V_WIDTH,), s["visual.ln_pre.weight"], s["visual.ln_pre.bias"])
    x = open_clip_block(s, "visual.transformer.resblocks.0.", x, V_WIDTH // 80, causal=False)
    image = F.layer_norm(x[:, 0], (V_WIDTH,), s["visual.ln_post.weight"], s["visual.ln_post.bias"]) @ s["visual.proj"]
    t = s["token_embedding.weight"][ids] + s["positional_embedding"]
    t = open_clip_block(s, "transformer.resblocks.0.", t, T_WIDTH // 64, causal=True)
    t = F.layer_norm(t, (T_WIDTH,), s["ln_final.weight"], s["ln_final.bias"])
    text = t[torch.arange(len(ids)), ids.argmax(dim=-1)] @ s["text_projection"]  # pooled at the end-of-text token
    return F.normalize(image, dim=-1), F.normalize(text, dim=-1)


def test_hps_converter_and_score_equal_open_clip_computed_by_hand(tmp_path):
    state = fake_open_clip_state()
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "HPS_v2.1.pt")
    write_tokenizer(tmp_path / "tok")
    reward = build_reward({"model": "hpsv2", "model_path": str(tmp_path / "HPS_v2.1.pt"),
                           "processor_path": str(tmp_path / "tok")})
    imgs = images(3, seed=5)
    prompts = ["a cat", "a cat", "a dog on a hill"]
    pixels = torch.from_numpy(((imgs / 255.0 - np.array(OPENAI_MEAN)) / np.array(OPENAI_STD)).transpose(0, 3, 1, 2))
    ids = reward.tokenizer(prompts, padding="max_length", max_length=TEXT_CONTEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        image, text = open_clip_features(state, pixels.float(), ids)
        np.testing.assert_allclose(reward.image_features(imgs), image, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(reward.text_features(prompts), text, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(reward(imgs, prompts).avg, (image * text).sum(-1), rtol=1e-4, atol=1e-5)
    assert set(open_clip_to_clip(state)) == set(reward.model.state_dict()) - {"vision_model.embeddings.position_ids",
                                                                              "text_model.embeddings.position_ids"}


# -------------------------------------------------------------------------------------------- loading errors


def test_a_folder_saved_by_the_pinned_transformers_loads(tiny_clip, tmp_path):
    """transformers 5's CLIPProcessor.save_pretrained keeps the image settings in processor_config.json (no
    preprocessor_config.json): the same model and processor, saved so, score exactly as the 4.x layout."""
    from transformers import CLIPModel, CLIPProcessor

    saved = tmp_path / "saved-by-transformers"
    CLIPModel.from_pretrained(tiny_clip).save_pretrained(saved)
    CLIPProcessor.from_pretrained(tiny_clip).save_pretrained(saved)
    assert (saved / "processor_config.json").is_file() and not (saved / "preprocessor_config.json").exists()
    imgs = images(4, seed=5, size=2 * IMAGE_SIZE)  # resized and cropped by the saved processor's settings
    for name in ("pickscore", "clipscore"):
        ours = build_reward({"model": name, "model_path": str(saved)})(imgs, PROMPTS)
        reference = build_reward({"model": name, "model_path": str(tiny_clip)})(imgs, PROMPTS)
        assert ours.errors == 0
        np.testing.assert_array_equal(ours.avg, reference.avg)


def test_loading_errors_name_the_missing_file(tiny_clip, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"reward.model_path=.*no config.json"):
        build_reward({"model": "clipscore", "model_path": str(empty), "processor_path": str(tiny_clip)})
    with pytest.raises(FileNotFoundError, match=r"reward.processor_path=.*no tokenizer.json or vocab.json"):
        build_reward({"model": "pickscore", "model_path": str(tiny_clip), "processor_path": str(empty)})
    tokenizer_only = tmp_path / "tokenizer-only"
    write_tokenizer(tokenizer_only)
    (tokenizer_only / "preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"reward.processor_path=.*no processor_config.json or "
                                                r"preprocessor_config.json"):
        build_reward({"model": "pickscore", "model_path": str(tiny_clip), "processor_path": str(tokenizer_only)})
    with pytest.raises(FileNotFoundError, match=r"reward.head_path='.*missing.pth' does not exist"):
        build_reward({"model": "aesthetic", "model_path": str(tiny_clip), "head_path": str(tmp_path / "missing.pth")})
    with pytest.raises(ValueError, match="reward.model=aesthetic needs reward.head_path"):
        build_reward({"model": "aesthetic", "model_path": str(tiny_clip)})
    with pytest.raises(FileNotFoundError, match=r"reward.model_path=.*HPS_v2.1_compressed.pt does not exist"):
        build_reward({"model": "hpsv2", "model_path": str(empty), "processor_path": str(tiny_clip)})


def test_recipes_check_clip_rewards_before_any_worker_starts():
    """The Wan video recipe trains on PickScore per chunk as it does on OCR; aesthetic without its head is an error
    that names the key."""
    from rlrunner.config.errors import RecipeError
    from rlrunner.recipe import load_recipe

    video = ["env.train.reward.model=pickscore", "env.eval.reward.model=hpsv2"]
    cfg = load_recipe("wan22_ti2v_5b_nft_video_ocr", video, check_datasets=False)
    assert cfg.env.train.reward.frame_interval == 4
    with pytest.raises(RecipeError, match=r"env.train.reward.head_path is empty; reward.model=aesthetic needs it"):
        load_recipe("tiny_nft_ocr", ["env.train.reward.model=aesthetic"], check_datasets=False)

#!/usr/bin/env bash
# GPU smoke test of the SD3 model layer at full size, with nothing downloaded.
#
# Builds the SD3.5-Medium transformer (24 MMDiT-X blocks, 2.5B parameters) and the SD3 VAE from their configs
# with random weights, wraps them in rlrunner's SD3FlowModel (LoRA 32/64 `default` + `ema`, gradient
# checkpointing, bf16 base / fp32 LoRA), then times, with random prompt embeddings:
#   rollout  10-step DPM-Solver++ sampling at 512 px with the EMA adapter, no CFG
#   decode   fp32 VAE decode of the rolled-out latents
#   train    NFT steps: v_old (ema, no grad) + v_theta (default) + nft_loss + backward, micro-batches with
#            gradient accumulation, AdamW, grad-norm clip 1.0, then the EMA update of the `ema` adapter
# and prints samples/s for each and the peak accelerator memory.
#
#   bash bench/gpu_smoke.sh                   # full size on the GPU (cuda, or npu with torch-npu)
#   bash bench/gpu_smoke.sh --tiny            # tiny transformer/VAE, 16 px, on CPU: checks the script itself
#   bash bench/gpu_smoke.sh --rollout-batch 16 --micro-batch 9 --accum 4
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
cd "$ROOT"
exec "$PY" - "$@" <<'PYTHON'
import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from omegaconf import OmegaConf

from rlrunner.algorithms.ema import ema_update_
from rlrunner.algorithms.nft import nft_loss
from rlrunner.algorithms.samplers import sample_xt
from rlrunner.config.schema import FamilyConfig
from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER
from rlrunner.models.sd3 import SD3FlowModel
from rlrunner.utils.device import PRECISIONS, resolve_device

# stabilityai/stable-diffusion-3.5-medium transformer/config.json and vae/config.json
SD35M_TRANSFORMER = dict(
    sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
SD35M_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32,
    sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False,
)
TINY_TRANSFORMER = dict(
    sample_size=8, patch_size=1, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
    num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=32,
    dual_attention_layers=(0,), qk_norm="rms_norm",
)
TINY_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(4, 8), layers_per_block=1,
    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=1,
    sample_size=16, scaling_factor=1.5035, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False,
)
NUM_STEPS = 10


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SD3.5-Medium rollout + NFT training smoke test (random weights)")
    p.add_argument("--tiny", action="store_true", help="tiny configs at 16 px on CPU (checks the script)")
    p.add_argument("--device", default=None, help="auto | cuda | npu | cpu (default: auto, cpu with --tiny)")
    p.add_argument("--precision", default="bf16", choices=sorted(PRECISIONS))
    p.add_argument("--resolution", type=int, default=None, help="pixels (default 512, 16 with --tiny)")
    p.add_argument("--rollout-batch", type=int, default=None, help="images per sampling call (default 24 = a group)")
    p.add_argument("--micro-batch", type=int, default=9, help="samples per forward/backward (sd3_nft_ocr: 9)")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--repeats", type=int, default=3, help="timed rollouts / optimizer steps after one warm-up")
    p.add_argument("--text-tokens", type=int, default=None, help="prompt tokens (default 77 CLIP + 128 T5)")
    args = p.parse_args()
    args.device = args.device or ("cpu" if args.tiny else "auto")
    args.resolution = args.resolution or (16 if args.tiny else 512)
    args.rollout_batch = args.rollout_batch or (4 if args.tiny else 24)
    args.text_tokens = args.text_tokens or (8 if args.tiny else 77 + 128)
    if args.tiny:
        args.micro_batch, args.accum, args.repeats = min(args.micro_batch, 2), min(args.accum, 2), 1
    return args


def accel(device: torch.device):
    """torch.cuda / torch.npu for accelerator devices, None on CPU."""
    return getattr(torch, device.type, None) if device.type != "cpu" else None


def sync(device: torch.device) -> None:
    if accel(device) is not None:
        accel(device).synchronize()


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> SD3FlowModel:
    """The full SD3 pipeline minus text encoders, random weights created directly on the device."""
    with torch.device(device):
        torch.manual_seed(0)
        transformer = SD3Transformer2DModel(**(TINY_TRANSFORMER if args.tiny else SD35M_TRANSFORMER)).to(dtype)
        vae = AutoencoderKL(**(TINY_VAE if args.tiny else SD35M_VAE))
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None,
        tokenizer_3=None,
    )
    cfg = OmegaConf.structured(FamilyConfig(resolution=args.resolution, shift=3.0, lora_rank=32, lora_alpha=64,
                                            gradient_checkpointing=True, max_sequence_length=128))
    return SD3FlowModel(pipe, cfg, device=device, dtype=dtype)


def random_cond(model: SD3FlowModel, batch: int, tokens: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    config = model.transformer.config
    embeds = torch.randn(batch, tokens, config.joint_attention_dim, generator=gen, device=model.device)
    pooled = torch.randn(batch, config.pooled_projection_dim, generator=gen, device=model.device)
    return {"prompt_embeds": embeds.to(model.dtype), "pooled_prompt_embeds": pooled.to(model.dtype)}


def timed(fn, device: torch.device, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls after one warm-up call, and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def nft_micro_step(model, x0, cond, adv, gen) -> tuple[torch.Tensor, dict]:
    x_t, t, _ = sample_xt(x0, NUM_STEPS, generator=gen)
    with torch.no_grad():
        v_old = model.velocity(x_t, t, cond, adapter=EMA_ADAPTER)
    v_theta = model.velocity(x_t, t, cond, adapter=TRAINED_ADAPTER)
    return nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=0.1, adv_clip_max=5.0, weight_mode="adaptive")


def train_step(model, optimizer, batches, gen) -> float:
    """One optimizer step over ``batches`` of (x0, cond, advantages); returns the mean loss."""
    losses = []
    for x0, cond, adv in batches:
        loss, _ = nft_micro_step(model, x0, cond, adv, gen)
        (loss / len(batches)).backward()
        losses.append(loss.item())
    torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    ema_update_(model.adapter_parameters(EMA_ADAPTER), model.adapter_parameters(TRAINED_ADAPTER), tau=0.01)
    return statistics.mean(losses)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1 if args.tiny else torch.get_num_threads())
    device, dtype = resolve_device(args.device), PRECISIONS[args.precision]
    if accel(device) is not None:
        accel(device).reset_peak_memory_stats()
    start = time.perf_counter()
    model = build_model(args, device, dtype)
    n_base = sum(p.numel() for n, p in model.transformer.named_parameters() if "lora_" not in n)
    n_lora = sum(p.numel() for p in model.trainable_parameters())
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else device.type}), "
          f"base {dtype}, transformer {n_base / 1e9:.3f}B params + LoRA {n_lora / 1e6:.2f}M x 2 adapters, "
          f"latents {model.latent_shape}, built in {time.perf_counter() - start:.1f}s", flush=True)
    gen = torch.Generator(device).manual_seed(0)

    b = args.rollout_batch
    cond = random_cond(model, b, args.text_tokens, gen)
    noise = torch.randn((b, *model.latent_shape), generator=gen, device=device)
    sample = lambda: model.sample(cond, noise, sampler="dpm2", num_steps=NUM_STEPS, adapter=EMA_ADAPTER)  # noqa
    t_roll, x0 = timed(sample, device, args.repeats)
    assert x0.shape == (b, *model.latent_shape) and torch.isfinite(x0).all(), "rollout produced non-finite latents"
    print(f"rollout: {b} x {NUM_STEPS}-step dpm2 at {args.resolution} px in {t_roll:.2f}s = "
          f"{b / t_roll:.2f} samples/s", flush=True)
    decode_batch = x0[: min(b, model.decode_batch_size)]
    t_dec, pixels = timed(lambda: model.decode(decode_batch), device, args.repeats)
    print(f"decode:  {len(decode_batch)} images {pixels.shape[1:]} fp32 in {t_dec:.2f}s = "
          f"{len(decode_batch) / t_dec:.2f} images/s", flush=True)

    m = args.micro_batch
    x0_train = torch.randn(m, *model.latent_shape, generator=gen, device=device)
    batches = [(x0_train, random_cond(model, m, args.text_tokens, gen),
                torch.randn(m, generator=gen, device=device)) for _ in range(args.accum)]
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=3e-4, weight_decay=1e-4)
    t_train, loss = timed(lambda: train_step(model, optimizer, batches, gen), device, args.repeats)
    assert torch.isfinite(torch.tensor(loss)), f"non-finite NFT loss {loss}"
    n = m * args.accum
    print(f"train:   NFT step of {args.accum} x {m} samples in {t_train:.2f}s = {n / t_train:.2f} samples/s "
          f"(loss {loss:.4f})", flush=True)
    if accel(device) is not None:
        peak = accel(device).max_memory_allocated(device) / 2**30
        print(f"peak accelerator memory: {peak:.1f} GiB", flush=True)
    else:
        import resource
        print(f"peak host memory (max RSS): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    print("gpu_smoke: OK")
    return 0


sys.exit(main())
PYTHON

"""What does an NFT training step cost over a plain flow-matching LoRA step?

On one tiny SD3 transformer (diffusers ``SD3Transformer2DModel`` from a config) with two peft LoRA adapters,
``default`` (trained) and ``ema`` (old policy), times on the same batch:

    (a) a plain flow-matching LoRA step: forward with grad + MSE to ε - x0 + backward
    (b) a no-grad forward
    (c) an NFT step: v_old from the ``ema`` adapter without grad + forward/backward of ``default`` + ``nft_loss``
    (c') an NFT step with v_old given (``nft_xcur_source: rollout``, whose rollout computed v_old at the state it
         keeps): forward/backward of ``default`` + ``nft_loss``, no extra forward

and prints (c)/((a) + (b)), target ≤ 1.05 (the one extra forward is the only unavoidable cost), (c)/(a), and
(c')/(a), target ≤ 1.05 (what NFT adds to a flow-matching step besides v_old: the loss's elementwise work).
v_old comes from ``AdapterSwitch`` (below); the same step with peft's ``set_adapter`` is timed for reference.
Each timing is the median of interleaved repeats after warm-up, on two clocks: wall time, and this thread's CPU
time (torch runs on one thread here, so CPU time stays honest when other jobs share the cores; trust it over
wall time when the machine is loaded).

    .venv/bin/python bench/nft_step.py [--repeats 25] [--layers 4] [--batch 4]
    .venv/bin/python bench/nft_step.py --family all     # the same steps through each family's FlowModel.velocity
    .venv/bin/python bench/nft_step.py --quick          # seconds, tiny sizes: checks the script runs
                                                        # (tests/project/test_bench_scripts.py)

With ``--family``, (a), (b), (c) and (c') run through a model family's own ``FlowModel.velocity`` (its input packing,
timestep convention, embedded guidance, adapter switch) on the family's tiny random pipeline of the model tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from diffusers import SD3Transformer2DModel
from peft import LoraConfig
from peft.tuners.tuners_utils import BaseTunerLayer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing rlrunner
from rlrunner.algorithms.nft_loss import nft_loss
from rlrunner.algorithms.samplers import sample_xt
from rlrunner.models.lora import fast_switch

NUM_STEPS = 10  # sampler steps: the training t grid
TRAINED, OLD = "default", "ema"
#: --quick: the fewest layers, samples and repeats
QUICK = {"repeats": 1, "warmup": 0, "layers": 1, "batch": 1}
# the attention projections the official DiffusionNFT / flow_grpo SD3 recipes adapt
LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


class AdapterSwitch:
    """rlrunner's LoRA switch (:func:`rlrunner.models.lora.fast_switch`, what the actor uses for v_old and v_base)
    as a block that restores the trained adapter.

    peft/diffusers ``model.set_adapter(name)`` walks every module of the model and, on each LoRA layer, sets
    ``requires_grad`` on every adapter's weights before it rebinds the active adapter: a switch to ``ema`` and back
    is two full walks. ``fast_switch`` writes the two attributes a LoRA layer's forward reads into the layers
    collected once. Use under ``torch.no_grad()``, after all adapters are injected, with unmerged layers.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        if not self.layers:
            raise ValueError("model has no peft LoRA layers; add adapters before building an AdapterSwitch")

    @contextmanager
    def use(self, adapter: str | None) -> Iterator[None]:
        """Run the block with only ``adapter`` active (None: all adapters off, the base model)."""
        fast_switch(self.layers, adapter)
        try:
            yield
        finally:
            fast_switch(self.layers, TRAINED)


def build_model(layers: int, seed: int) -> SD3Transformer2DModel:
    torch.manual_seed(seed)
    model = SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=layers,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=128,
        caption_projection_dim=128,
        pooled_projection_dim=64,
        pos_embed_max_size=32,
    )
    model.requires_grad_(False)
    lora = LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS, lora_dropout=0.0)
    model.add_adapter(lora, adapter_name=OLD)
    with warnings.catch_warnings():  # peft warns that a second adapter is being added: intended
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        model.add_adapter(lora, adapter_name=TRAINED)
    with torch.no_grad():  # LoRA B starts at 0: make the two adapters (and the base) differ
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.set_adapter(TRAINED)  # ema weights: requires_grad False from here on
    return model


def make_batch(batch: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x0": torch.randn(batch, 16, 32, 32, generator=g),
        "prompt": torch.randn(batch, 16, 128, generator=g),
        "pooled": torch.randn(batch, 64, generator=g),
        "adv": torch.randn(batch, generator=g) * 2,
    }


def velocity(model, x_t, t, data) -> torch.Tensor:
    """v(x_t, t) = ε - x0 prediction; the transformer takes t on the 0..1000 scale."""
    return model(
        hidden_states=x_t,
        encoder_hidden_states=data["prompt"],
        pooled_projections=data["pooled"],
        timestep=t * 1000,
        return_dict=False,
    )[0]


def make_steps(model, data, switch: AdapterSwitch) -> dict[str, Callable[[], None]]:
    x0 = data["x0"]

    def noised():
        return sample_xt(x0, NUM_STEPS, generator=torch.Generator().manual_seed(0))  # same x_t in every step

    def fm_step():  # (a)
        x_t, t, noise = noised()
        loss = (velocity(model, x_t, t, data) - (noise - x0)).square().mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    def forward_no_grad():  # (b)
        x_t, t, _ = noised()
        with torch.no_grad():
            velocity(model, x_t, t, data)

    def nft_step(v_old_fn):
        def step():  # (c), and (c') with v_old_fn returning the rollout's v_old
            x_t, t, _ = noised()
            v_old = v_old_fn(x_t, t)
            loss, _ = nft_loss(velocity(model, x_t, t, data), v_old, x_t, x0, t, data["adv"], beta=0.1)
            loss.backward()
            model.zero_grad(set_to_none=True)

        return step

    @torch.no_grad()
    def v_old_switch(x_t, t):
        with switch.use(OLD):
            return velocity(model, x_t, t, data)

    @torch.no_grad()
    def v_old_set_adapter(x_t, t):
        model.set_adapter(OLD)
        try:
            return velocity(model, x_t, t, data)
        finally:
            model.set_adapter(TRAINED)

    x_t, t, _ = noised()
    v_old_from_rollout = v_old_switch(x_t, t)  # computed once: the rollout's velocity at the state it keeps

    return {
        "a_fm_step": fm_step,
        "b_forward_no_grad": forward_no_grad,
        "c_nft_step": nft_step(v_old_switch),
        "c_nft_step_set_adapter": nft_step(v_old_set_adapter),
        "c'_nft_step_v_old_given": nft_step(lambda x_t, t: v_old_from_rollout),
    }


def time_pair_costs(model, switch: AdapterSwitch, repeats: int = 50) -> dict[str, float]:
    """CPU milliseconds for one switch to ``ema`` and back (no forward), with each method."""

    def switch_pair():
        with switch.use(OLD):
            pass

    def set_adapter_pair():
        model.set_adapter(OLD)
        model.set_adapter(TRAINED)

    costs = {}
    for name, fn in (("AdapterSwitch", switch_pair), ("set_adapter", set_adapter_pair)):
        start = time.thread_time()
        for _ in range(repeats):
            fn()
        costs[name] = (time.thread_time() - start) / repeats * 1e3
    return costs


def check_switch(model, data, switch: AdapterSwitch) -> None:
    """The switch gives exactly the ema / base outputs and leaves the trained adapter active and trainable."""
    x_t, t, _ = sample_xt(data["x0"], NUM_STEPS, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        v_default = velocity(model, x_t, t, data)
        with switch.use(OLD):
            v_switch = velocity(model, x_t, t, data)
        with switch.use(None):
            v_base_switch = velocity(model, x_t, t, data)
        model.set_adapter(OLD)
        v_ref = velocity(model, x_t, t, data)
        model.set_adapter(TRAINED)
        model.disable_adapters()
        v_base_ref = velocity(model, x_t, t, data)
        model.enable_adapters()
        v_after = velocity(model, x_t, t, data)
    assert torch.equal(v_switch, v_ref) and torch.equal(v_base_switch, v_base_ref) and torch.equal(v_after, v_default)
    assert not torch.equal(v_switch, v_default) and not torch.equal(v_base_switch, v_default)
    for name, p in model.named_parameters():
        assert p.requires_grad == (f".{TRAINED}." in name and "lora_" in name), name


def run_interleaved(steps: dict[str, Callable[[], None]], repeats: int, warmup: int) -> dict[str, dict[str, float]]:
    """Median milliseconds per step on two clocks: wall time, and this thread's CPU time (with one torch thread
    all work runs on this thread, so CPU time ignores the time other processes take the core away)."""
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(repeats):  # interleaved rounds in rotating order: drift on a shared machine hits all alike
        for name in names[i % len(names) :] + names[: i % len(names)]:
            w0, c0 = time.perf_counter(), time.thread_time()
            steps[name]()
            cpu[name].append(time.thread_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    median_ms = {
        clock: {n: statistics.median(v) * 1e3 for n, v in d.items()} for clock, d in (("wall", wall), ("cpu", cpu))
    }
    return median_ms


def family_steps(model, batch: int) -> dict[str, Callable[[], None]]:
    """(a), (b), (c) and (c') through ``model.velocity`` (a loaded FlowModel with its ``default`` and ``ema``
    adapters, made to differ), on ``batch`` samples of 4 prompts."""
    sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from family_helpers import encode_prompt_batch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for adapter in (TRAINED, OLD):
            for p in model.adapter_parameters(adapter):
                p.add_(0.02 * torch.randn(p.shape, generator=g))
    cond = encode_prompt_batch(model, [f'a sign that says "{i % 4}"' for i in range(batch)])
    x0 = torch.randn((batch, *model.latent_shape), generator=g)
    adv = torch.randn(batch, generator=g) * 2

    def noised():
        return sample_xt(x0, NUM_STEPS, generator=torch.Generator().manual_seed(0))

    def zero_grad():
        for p in model.trainable_parameters():
            p.grad = None

    def fm_step():
        x_t, t, noise = noised()
        (model.velocity(x_t, t, cond) - (noise - x0)).square().mean().backward()
        zero_grad()

    @torch.no_grad()
    def forward_no_grad():
        x_t, t, _ = noised()
        model.velocity(x_t, t, cond)

    def nft_step(v_old_fn):
        def step():
            x_t, t, _ = noised()
            v_old = v_old_fn(x_t, t)
            nft_loss(model.velocity(x_t, t, cond), v_old, x_t, x0, t, adv, beta=0.1)[0].backward()
            zero_grad()

        return step

    @torch.no_grad()
    def v_old_ema(x_t, t):
        return model.velocity(x_t, t, cond, adapter=OLD)

    x_t, t, _ = noised()
    v_old_from_rollout = v_old_ema(x_t, t)
    return {"a_fm_step": fm_step, "b_forward_no_grad": forward_no_grad, "c_nft_step": nft_step(v_old_ema),
            "c'_nft_step_v_old_given": nft_step(lambda x_t, t: v_old_from_rollout)}


def bench_families(families: list[str], args: argparse.Namespace) -> None:
    """One line of ratios per family, through its FlowModel on its tiny pipeline (fp32, CPU)."""
    import importlib.util
    import tempfile

    spec = importlib.util.spec_from_file_location("rollout_overhead", Path(__file__).with_name("rollout_overhead.py"))
    overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overhead)
    build_args = argparse.Namespace(resolution=0, num_frames=0, device="cpu", precision="fp32")
    with tempfile.TemporaryDirectory() as workdir:
        for family in families:
            model = overhead.build(family, None, build_args, Path(workdir))
            ms = run_interleaved(family_steps(model, args.batch), args.repeats, args.warmup)["cpu"]
            a, b, c, cached = (ms[n] for n in ("a_fm_step", "b_forward_no_grad", "c_nft_step",
                                               "c'_nft_step_v_old_given"))
            print(f"{family:16s} batch {args.batch}, cpu ms: (a) {a:7.2f} (b) {b:7.2f} (c) {c:7.2f} (c') "
                  f"{cached:7.2f}   (c)/((a)+(b)) = {c / (a + b):.3f}   (c)/(a) = {c / a:.3f}   (c')/(a) = "
                  f"{cached / a:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--family", default="", help="a model family of the tiny pipelines, or all (default: the "
                                                     "bare SD3 transformer above)")
    parser.add_argument("--quick", action="store_true", help=f"seconds, tiny sizes {QUICK}: checks that the script "
                                                             "runs (flags given beside it still win)")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the CPU-time clock then sees all the work
    if args.family:
        from rlrunner.models import MODEL_FAMILIES

        families = [f for f in MODEL_FAMILIES if f != "tiny"] if args.family == "all" else [args.family]
        bench_families(families, args)
        return

    model = build_model(args.layers, seed=0)
    data = make_batch(args.batch, seed=1)
    switch = AdapterSwitch(model)
    check_switch(model, data, switch)
    ms = run_interleaved(make_steps(model, data, switch), args.repeats, args.warmup)

    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"tiny SD3 transformer: {args.layers} layers, {n_params / 1e6:.2f}M params, {len(switch.layers)} LoRA layers, "
        f"batch {args.batch}x16x32x32, 1 thread, median of {args.repeats} interleaved repeats after {args.warmup} warm-up"
    )
    print(f"  {'':<24s} {'wall ms':>9s} {'cpu ms':>9s}")
    for name in ms["wall"]:
        print(f"  {name:<24s} {ms['wall'][name]:9.2f} {ms['cpu'][name]:9.2f}")
    for name, value in time_pair_costs(model, switch).items():
        print(f"  switch to ema and back, {name:<14s} {value:.3f} ms cpu")
    for clock in ("wall", "cpu"):
        a, b, c = (ms[clock][n] for n in ("a_fm_step", "b_forward_no_grad", "c_nft_step"))
        naive, cached = ms[clock]["c_nft_step_set_adapter"], ms[clock]["c'_nft_step_v_old_given"]
        print(
            f"{clock:>4s}: (c)/((a)+(b)) = {c / (a + b):.3f} (target <= 1.05)   (c)/(a) = {c / a:.3f}   "
            f"(c')/(a) = {cached / a:.3f} (target <= 1.05)   [with peft set_adapter: (c)/((a)+(b)) = "
            f"{naive / (a + b):.3f}]"
        )


if __name__ == "__main__":
    main()

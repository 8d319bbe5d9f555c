"""The recipe schema: every key a recipe may set, with its type and default.

Key names follow RLinf's diffusion recipes (``cluster``, ``runner``, ``algorithm``, ``env``, ``actor``) so
that users can carry their recipes over. The schema is merged in OmegaConf struct mode, so a key that is not
declared here is an error (see :mod:`rlrunner.config.loader` for the messages). The model families' sections
(``actor.model.<model_type>``) are the types the families declare (rlrunner/models/settings.py); they are added to
this schema by :mod:`rlrunner.recipe`, so that this module imports no family and adding one needs no edit here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------- cluster


@dataclass
class ClusterConfig:
    num_nodes: int = 1  # nodes of the Ray cluster the placement spans
    # accelerators per node; 0 = detect (GPUs/NPUs of the Ray cluster, or 1 CPU "device" without any)
    num_devices_per_node: int = 0
    # RLinf syntax: {"actor,env,rollout": "all"} or {"actor": "0-3", "rollout": "4-5", "env": "6-7"}
    component_placement: dict[str, Any] = field(default_factory=lambda: {"actor,env,rollout": "all"})
    # "ray" places workers as Ray actors; "local" runs them in this process (tests, debugging)
    backend: str = "ray"
    # address of an existing cluster ("auto" or host:port); empty = RAY_ADDRESS or a new local cluster
    ray_address: str = ""
    # joining a cluster (ray_address / RAY_ADDRESS): ship the rlrunner package to the nodes with the job (Ray
    # runtime_env py_modules); false when every node has rlrunner installed (a cluster built from one image)
    ship_code: bool = True
    # CPUs each worker reserves in its placement bundle
    cpus_per_worker: float = 1.0
    # CPU threads of each env worker (torch, OpenMP, the OCR engines: reward.num_workers share them): reserved (its
    # cpus_per_worker) | node (the CPUs its node has left after the other workers' reservations, shared by the env
    # workers placed there: CPU OCR on a GPU node gets the cores the GPU workers do not use)
    env_threads: str = "reserved"
    # seconds to wait for a worker call before declaring the worker dead
    worker_timeout_s: float = 1800.0
    # after a lost worker or node (runner.max_restarts): seconds to wait for the cluster to hold the placement again
    # (the node back, or another in its place) before the run stops
    rejoin_timeout_s: float = 600.0
    # collocated components move idle models to host memory between phases (RLinf: actor/rollout/env.enable_offload)
    enable_offload: bool = False


# ---------------------------------------------------------------------------------------------- runner


@dataclass
class LoggerConfig:
    log_path: str = "logs"  # folder the run folders go in (the launcher uses logs/ or $RLRUNNER_LOG_ROOT)
    # the run's identity: runner.resume_dir=auto resumes only a checkpoint of the same experiment, and wandb, swanlab
    # and mlflow name the run after it ("" = the recipe's name); the run folder is still named by the recipe file
    experiment_name: str = ""
    # the project (wandb, swanlab) or experiment (mlflow) that the run is filed under
    project_name: str = "rlrunner"
    # metric trackers: tensorboard, wandb, swanlab, mlflow (metrics.jsonl is always written)
    logger_backends: list[str] = field(default_factory=lambda: ["tensorboard"])


@dataclass
class WatchConfig:
    """The reward-hacking watch (docs/reward_hacking.md): guards scored on every eval's samples, and an alarm."""

    enabled: bool = True  # score the guards at each eval and log watch/alarm; false: no guard, no alarm
    # extra guards, each a reward setting (the keys of env.<split>.reward) with a name: scored on the eval's samples
    # and logged as eval/guard/<name>, e.g. [{name: contrast, model: image_stats}]; the eval reward (when it differs
    # from the training reward) and sample diversity are watched without being listed
    guards: list[Any] = field(default_factory=list)
    diversity: bool = True  # watch eval/diversity (pixel distance between the eval's samples, relative to step 0)
    action: str = "warn"  # when the alarm fires: warn (one line, the samples saved) | stop (also a checkpoint, exit 5)
    # the alarm: a guard fell by at least this fraction of its value at the first eval ...
    max_drop: float = 0.5
    # ... while the training reward rose by at least this much (mean of its last `window` steps - its first `window`)
    min_reward_rise: float = 0.02
    window: int = 5  # training steps averaged at each end of the training reward's trend


@dataclass
class RunnerConfig:
    max_steps: int = -1  # training steps of the run (-1 = runner.max_epochs epochs)
    # with max_steps -1: passes over the training prompts (each step draws total_num_envs / group_size prompts)
    max_epochs: int = -1
    val_check_interval: int = 10  # evaluate on env.eval every N steps
    # also evaluate before the first step (the "before" number of a learning curve)
    val_before_train: bool = True
    save_interval: int = 20  # save a checkpoint every N steps (and at the last step)
    keep_last_n: int = 3  # checkpoints kept: older ones are deleted after each save
    # a checkpoint or run folder to resume from; auto = the newest of this experiment; "" = a fresh run
    resume_dir: str = ""
    # resume_dir=auto refuses a checkpoint whose recipe differs in more than run length, logging, evaluation,
    # checkpointing and placement keys; true accepts any difference, a list of dotted keys accepts those
    resume_allow_changes: Any = False
    # set by the launcher to the run's folder (config.yaml records where the run really wrote); a recipe leaves it ""
    log_dir: str = ""
    weight_sync_interval: int = 1  # send the trained adapter to the rollout workers every N steps
    # log sample grids every N steps (0 = never)
    sample_log_interval: int = 5
    num_logged_samples: int = 16  # images (or videos) in each logged sample grid
    # overlap reward scoring of batch k with the rollout of batch k+1
    async_reward: bool = True
    # roll out step k+1 (with the EMA policy of step k-1) while the actor trains on step k: for split placement,
    # where rollout and actor devices would otherwise wait for each other; one step more off-policy
    rollout_ahead: bool = False
    # this many non-finite losses in a row abort the run
    max_nonfinite_steps: int = 3
    # this many steps in a row in which no training sample could be scored (OCR engine failing on every image, a
    # required reward service down) stop the run with one line saying why
    max_reward_error_steps: int = 3
    # a lost worker or node, a worker call past cluster.worker_timeout_s or a failed collective: restart the workers
    # and go on from the last complete checkpoint, at most this many times per run (0 = stop at the first one); the
    # same step failing twice stops the run (docs/runs.md "Preemption and recovery")
    max_restarts: int = 3
    # SIGTERM/SIGINT: finish the current step, save a checkpoint and exit with status 4 (a second signal stops at
    # once); false: stop at once, as any process does
    save_on_signal: bool = True
    seed: int = 42  # the run's seed: prompt order, rollout noise and eval noise derive from it
    watch: WatchConfig = field(default_factory=WatchConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


# ------------------------------------------------------------------------------------------- algorithm


@dataclass
class AlgorithmConfig:
    # the policy update: nft (DiffusionNFT) | flow_grpo | awm (rlrunner/objectives/); RLinf: loss_type embodied_nft
    name: str = "nft"
    group_size: int = 8  # samples per prompt; advantages are taken within each group
    # the advantage's shape: grpo (one per sample) | grpo_video (one per latent-frame chunk of a video)
    adv_type: str = "grpo"
    # grpo: std normalisation "group" | "global" | "none"; grpo_video: "video" | "frame"
    advantage_mode: str = "global"
    adv_clip_max: float = 5.0  # advantages are clipped to [-adv_clip_max, adv_clip_max] (NFT's c)
    nft_beta: float = 0.1  # NFT's beta: how far the implicit positive/negative policies step from v_old
    nft_target_space: str = "x0"  # accepted for compatibility with RLinf recipes; x0 is the only value
    nft_weight_mode: str = "adaptive"  # adaptive | constant
    # NFT trust region: |delta v| at most this times |v_old| per sample (null = off)
    nft_clip_ratio: float | None = None
    # the EMA adapter of every algorithm (NFT's "old" policy, AWM's anchor; RLinf's name, hence nft_):
    # scalar tau or [start, end, s0, s1] (RLinf); ema <- (1 - tau) ema + tau theta
    nft_tau: Any = field(default_factory=lambda: [1.0, 0.01, 30, 70])
    # official-code spelling instead of nft_tau: copy | linear_to_0_5 | delayed_linear_to_0_999, evaluated (as the
    # official trainer does) at the optimizer steps taken so far, not the global step (see algorithms/ema.py)
    nft_decay_type: str = ""
    # training states (x_t, t): resample = fresh noise on the rollout's x0 at t from nft_train_timesteps (RLinf's
    # diffusion recipes, NVlabs); rollout = the rollout's own states x_i at its sigmas (RLinf's embodied default),
    # reusing the rollout's v_old when exact (no CFG, sampled by the actor's current EMA adapter): one forward less
    nft_xcur_source: str = "resample"
    # nft_xcur_source resample: uniform = linspace(1, 0, N+1)[:N] (RLinf) | sampler = the sampler's shifted sigmas
    # (NVlabs' trainer), N = num_steps; they coincide at shift 1
    nft_train_timesteps: str = "uniform"
    # training states per rollout sample in each update (flow_grpo/official code train on several timesteps of each
    # trajectory); more = more signal per rollout at the cost of update time; rollout: at most num_steps (distinct)
    nft_timesteps_per_sample: int = 1
    # KL anchor to the base model (adapters off); 0 disables it
    ref_kl_coef: float = 0.0
    # control runs: "reward" (normal) | "none" (r fixed at 0.5) | "shuffle" (rewards permuted)
    reward_signal: str = "reward"
    # flow_grpo (rlrunner/algorithms/flow_grpo_loss.py; defaults of the official SD3 trainer): the SDE's noise level a
    flow_grpo_noise_level: float = 0.7
    # PPO clip range of the probability ratio
    flow_grpo_clip_range: float = 1e-4
    # share of a sample's SDE steps trained (drawn per sample); each trained step is one forward and backward
    flow_grpo_timestep_fraction: float = 1.0
    # Flow-GRPO-Fast: SDE (and training) on this many consecutive steps placed at random per sample, ODE elsewhere;
    # 0 = every step is an SDE step (plain Flow-GRPO)
    flow_grpo_sde_window_size: int = 0
    # [first, end) steps the window lies in; null = the first half, [0, num_steps // 2], as the official configs
    flow_grpo_sde_window_range: Any = None
    # AWM (name: awm, rlrunner/algorithms/awm_loss.py); defaults as the official recipes but the EMA anchor. Time
    # weighting w(l, t) of each sample's flow-matching error l: none | t | t2 | huber | ghuber
    awm_weighting: str = "ghuber"
    awm_ghuber_power: float = 0.25  # p of the ghuber weighting t·((l + δ)^p - δ^p)/p
    # training noise levels: sampler (the rollout sampler's sigmas σ_k, 1 <= k < num_steps·awm_timestep_fraction,
    # stratified over the draws; official) | uniform (NFT's grid linspace(1, 0, N + 1)[k], k ~ U{0..N-1})
    awm_timesteps: str = "sampler"
    awm_timestep_fraction: float = 0.9  # share of the sampler's steps, from the noisy end, used by awm_timesteps=sampler
    awm_timesteps_per_sample: int = 6  # loss passes per rollout sample per optimizer step, each at its own t and ε
    # anchor to the EMA adapter: + coef·mean((v_θ - v_ema)²), 0 = off; the official recipes use 1.0 with an EMA of
    # decay min(0.3, 0.001·step), i.e. nft_tau [1.0, 0.7, 0, 300]
    awm_ema_kl_coef: float = 0.0
    # nft: the map of each clipped advantage a before r = (a + c)/(2c) (NVlabs' trainer's adv_mode): all (a itself)
    # | positive_only (max(a, 0)) | negative_only (min(a, 0)) | one_only (1 if a > 0 else 0) | binary (sign(a))
    nft_adv_mode: str = "all"


# ------------------------------------------------------------------------------------------------- env


@dataclass
class DatasetConfig:
    type: str = "ocr"  # text prompt files; accepted for compatibility with RLinf recipes, ocr is the only value
    # a directory with <split>.txt (or .jsonl / .parquet), or a .txt, .jsonl or .parquet file
    path: str = ""
    split: str = "train"  # the split's file stem in a dataset folder (<split>.txt, .jsonl or .parquet)
    # the prompt's key (.jsonl) or column (.parquet); the other keys are per-prompt metadata for the rewards
    prompt_key: str = "prompt"


@dataclass
class RewardConfig:
    type: str = "single"  # single (one reward, model) | multi (the weighted parts in rewards)
    # ocr | video_ocr | image_stats | jpeg_compressibility | remote | vlm_ocr | pickscore | clipscore | aesthetic | hpsv2
    # | unifiedreward | unifiedreward2 | vlm_yesno | geneval
    model: str = "ocr"
    key: str = "ocr"  # RLinf's name of the reward's output; accepted for compatibility, not read
    engine: str = "auto"  # the OCR engine: auto | rapidocr | paddleocr
    use_gpu: bool = False  # run the OCR engine on the env worker's GPU (rapidocr: needs onnxruntime-gpu)
    lang: str = "en"  # language of the OCR models (PaddleOCR's lang)
    # PP-OCR models of engine paddleocr: PP-OCRv4 (the generation the DiffusionNFT / flow_grpo scoring ran) or
    # PP-OCRv5 (PaddleOCR 3.x's own default); rapidocr runs the models its wheel ships
    ocr_version: str = "PP-OCRv4"
    rec_only: bool = False  # recognition-only OCR for single-line images
    frame_interval: int = 4  # video rewards: frames per chunk after frame 0; one reward per chunk (per latent frame)
    batch_size: int = 16  # images per scoring call of the reward model or OCR engine
    # scorer threads of each env worker, each with its own OCR engine (the env worker's CPU threads, cluster.env_threads,
    # / num_workers inference threads each); the driver cuts each rollout round once into num_workers slices per env
    # worker (rlrunner/step/shares.py)
    num_workers: int = 1
    weight: float = 1.0  # weight of this reward (a part of a multi reward: its weight in the sum)
    alphabet: str = ""  # keep only these characters of the recognised text before scoring
    rewards: list[Any] = field(default_factory=list)  # parts of a multi reward
    # type: multi -- weighted_sum (raw scores weighted, then group advantages) | per_reward_normalized (each part
    # z-scored within its group, weighted, summed, then normalised over the batch: GDPO, Flow-Factory's default)
    aggregation: str = "weighted_sum"
    # pickscore, clipscore, aesthetic, hpsv2 (rlrunner/rewards/clip): a local folder or hub id of the scorer's weights
    # (hpsv2: the HPS_v2.1_compressed.pt file, or the hub id xswu/HPSv2), its tokenizer/processor ("" = model_path),
    # the aesthetic MLP head (.pth), and the dtype on the env worker's device (bf16 falls back to fp32 on CPU)
    model_path: str = ""
    processor_path: str = ""  # the scorer's tokenizer/processor folder or hub id ("" = model_path)
    head_path: str = ""  # aesthetic: the MLP head's weights (.pth)
    precision: str = "fp32"  # the scorer's dtype on the env worker's device: fp32 | bf16 | fp16 (bf16 is fp32 on CPU)
    # model: remote -- a reward server (bin/rlrunner serve_reward), e.g. http://127.0.0.1:8000
    url: str = ""
    token_file: str = ""  # file with the server's bearer token ("" = none; the server needs one off loopback)
    # model: vlm_ocr -- an OpenAI-compatible endpoint (vLLM: http://HOST:PORT/v1) and its model name
    base_url: str = ""
    served_model: str = ""  # the model name the endpoint serves (its --served-model-name)
    api_key_file: str = ""  # file with the endpoint's API key ("" = none)
    # model: unifiedreward | unifiedreward2 | vlm_yesno (rlrunner/rewards/judges) -- the same endpoint keys;
    # judge_prompt overrides the judge's template ({prompt} = the caption); top_logprobs: tokens vlm_yesno reads
    judge_prompt: str = ""
    top_logprobs: int = 20  # vlm_yesno: top tokens whose log-probabilities are read for yes/no
    # remote and vlm_ocr: seconds per attempt, retries of transient failures (exponential backoff with jitter),
    # requests in flight; required: false scores failed samples 0 (counted in env/reward_errors) and trains on.
    # ocr and video_ocr: seconds one engine call (batch_size images) may take; past it those images score 0
    timeout_s: float = 60.0
    # ocr and video_ocr: engines built to replace ones stuck in calls past timeout_s; one more stops the run
    max_engine_rebuilds: int = 8
    max_retries: int = 3  # remote and vlm_ocr: retries of a transient failure
    max_concurrency: int = 4  # remote and vlm_ocr: requests in flight per env worker
    required: bool = True  # remote and vlm_ocr: true stops the run on a server down at start; false scores failures 0


@dataclass
class VideoConfig:
    save_video: bool = False  # also write logged videos as files (mp4) beside TensorBoard's
    video_base_dir: str = ""  # folder of the saved videos ("" = <log_dir>/videos)
    fps: int = 8  # frame rate of logged and saved videos


@dataclass
class EnvSplitConfig:
    # samples per rollout round: total_num_envs / group_size prompts (eval: prompts sampled once each)
    total_num_envs: int = 16
    rollout_epoch: int = 1  # rollout rounds per step: a step trains on total_num_envs x rollout_epoch samples
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    video_cfg: VideoConfig = field(default_factory=VideoConfig)


@dataclass
class EnvConfig:
    train: EnvSplitConfig = field(default_factory=EnvSplitConfig)
    eval: EnvSplitConfig = field(default_factory=lambda: EnvSplitConfig(dataset=DatasetConfig(split="test")))


# ----------------------------------------------------------------------------------------------- actor


@dataclass
class ModelKeys:
    """The keys of ``actor.model`` besides the family sections (:data:`rlrunner.recipe.ModelConfig` adds those)."""

    model_path: str = ""  # the base model: a local diffusers folder or a hub id (org/name)
    # the model family (rlrunner/models/): tiny, sd3, flux1, wan22_ti2v_5b, ...; its section holds its settings
    model_type: str = "tiny"
    # dtype of the base model's weights (LoRA weights train in fp32), for the actor and the rollout alike: bf16 |
    # fp32 (fp16 is refused: no loss scaling, so its gradients underflow) (RLinf:
    # actor.fsdp_config.mixed_precision.param_dtype)
    precision: str = "bf16"
    # true: bf16 / fp16 stay as asked on a CPU device too (slow; shows dtype mistakes without a GPU), else fp32
    half_precision_on_cpu: bool = False
    device: str = "auto"  # the workers' device: auto (an accelerator if there is one) | cpu | cuda | npu


@dataclass
class OptimConfig:
    optimizer: str = "adamw"  # accepted for compatibility with RLinf recipes; adamw is the only value
    lr: float = 3e-4  # AdamW learning rate of the LoRA weights
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    adam_beta1: float = 0.9  # AdamW beta1 (first-moment decay)
    adam_beta2: float = 0.999  # AdamW beta2 (second-moment decay)
    adam_eps: float = 1e-8  # AdamW epsilon
    clip_grad: float = 1.0  # gradients are clipped to this global norm
    lr_scheduler: str = "constant"  # the learning rate after warm-up, over runner.max_steps: constant | cosine | linear
    lr_warmup_steps: int = 0  # optimizer steps of linear warm-up from 0 to lr


@dataclass
class ActorConfig:
    micro_batch_size: int = 4  # samples per forward/backward pass of each actor rank (gradients accumulate)
    global_batch_size: int = 64  # samples per optimizer step over all actor ranks
    seed: int = 42  # seed of the LoRA init and the training noise (x_t, t draws)
    # data-parallel engine of the actor ranks: ddp (one replica per rank) | fsdp2 (base weights sharded per block)
    # (RLinf: actor.fsdp_config.strategy and sharding_strategy)
    strategy: str = "ddp"
    # with one actor rank, still form a process group (of one) and wrap the model in actor.strategy's engine, so that
    # fsdp2 shards into DTensors over a one-rank mesh: the device check exercises FSDP2 on one GPU (slower otherwise)
    one_rank_group: bool = False
    # actor ranks that split one sample's token sequence (context parallelism through diffusers' _cp_plan hooks;
    # docs/clusters.md "Long sequences"): the ranks form dp x cp groups, a group trains the same samples;
    # global_batch_size still counts samples
    context_parallel_size: int = 1
    # ulysses (the attention heads are split over the group: heads % cp == 0) | ring (needs an attention backend
    # that returns the log-sum-exp; not the default native one)
    context_parallel_mode: str = "ulysses"
    # the actor workers hold only what they train (denoiser + LoRA adapters + optimizer state): text encoders and
    # VAE are freed when they start, since no actor feature needs them (they train on the rollout's latents and
    # its text conditioning, sent once per prompt); the rollout workers keep them
    model: ModelKeys = field(default_factory=ModelKeys)  # and the family sections (rlrunner.recipe.ActorConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class RolloutConfig:
    # rollout devices that sample one image or video together (Ulysses context parallelism, inference only); the
    # rollout workers form groups of this many, each group one rollout shard
    context_parallel_size: int = 1


@dataclass
class RecipeConfig:
    """Every section of a recipe; :data:`rlrunner.recipe.RecipeConfig` is this with the model family sections."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

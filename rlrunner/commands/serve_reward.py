"""Serve any registered reward over HTTP: ``bin/rlrunner serve_reward --reward ocr [options]``.

    bin/rlrunner serve_reward --reward ocr --engine rapidocr --set rec_only=true --set alphabet=23456789
    bin/rlrunner serve_reward --reward ocr --host 0.0.0.0 --port 8000 --token-file reward.token --workers 4

Recipes use it with ``reward.model: remote`` (``url``) or, for its OCR engine as a chat model, ``vlm_ocr``
(``base_url: http://HOST:PORT/v1``). Security defaults: it listens on 127.0.0.1; any other address needs
``--token-file`` (every request then needs ``Authorization: Bearer <token>``); JSON only, never pickle; limits
on body bytes, images, pixels per image and per request (413), on the time a request, head and body, may take
(408), and on open connections (503). Videos are
sent as frame lists and scored frame by frame, so serve an image reward (``ocr``, not ``video_ocr``). See
rlrunner/rewards/serving/server.py for the routes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rlrunner.rewards import Reward

LOOPBACK = ("127.0.0.1", "localhost", "::1")
EXIT_USER_ERROR = 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    from rlrunner.rewards.serving.limits import Limits, add_limit_options

    parser = argparse.ArgumentParser(prog="bin/rlrunner serve_reward", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--reward", default="ocr", help="a registered reward.model that scores images")
    parser.add_argument("--engine", default="auto", help="OCR engine: auto | rapidocr | paddleocr")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any other reward key, e.g. --set rec_only=true --set alphabet=23456789")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; not loopback needs --token-file")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-file", default="", help="file holding the bearer token every request must send")
    parser.add_argument("--workers", type=int, default=1, help="scoring threads, each with its own OCR engine")
    add_limit_options(parser, Limits())
    parser.add_argument("--served-model-name", default="rlrunner-ocr", help="model name of /v1/chat/completions")
    return parser.parse_args(argv)


def reward_config(args: argparse.Namespace) -> dict:
    """``--reward``, ``--engine``, ``--workers`` and ``--set`` as a reward sub-config (values typed by the recipe
    schema's ``RewardConfig``)."""
    from rlrunner.config.schema import RewardConfig

    fields = {f.name: f for f in dataclasses.fields(RewardConfig)}
    cfg: dict = {"model": args.reward, "engine": args.engine, "num_workers": args.workers}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in fields or key in ("type", "rewards"):
            raise ValueError(f"--set {item!r} is not KEY=VALUE with a reward key; valid keys: "
                             f"{sorted(set(fields) - {'type', 'rewards'})}")
        kind = type(fields[key].default)
        if kind is bool:
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--set {item!r}: {key} is true or false")
            cfg[key] = value.lower() == "true"
        else:
            try:
                cfg[key] = kind(value)
            except ValueError:
                raise ValueError(f"--set {item!r}: {key} must be a {kind.__name__}") from None
    return cfg


def check_scores_images(reward: Reward) -> None:
    """The server scores videos frame by frame, so it needs a reward of images ``[B, H, W, 3]`` -> ``[B]``."""
    try:
        out = reward(np.zeros((1, 8, 8, 3), dtype=np.uint8), ["probe"])  # blank: no engine call
    except ValueError as err:
        out, detail = None, str(err)
    if out is None or out.avg.shape != (1,):
        detail = detail if out is None else f"it returned scores shaped {out.avg.shape}"
        raise ValueError(f"--reward {reward.spec.model} does not score images ({detail}); serve an image reward such "
                         f"as ocr: clients send videos as frames and chunk the frame scores themselves")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from rlrunner.rewards.serving.client import read_secret

        token = read_secret(args.token_file, "--token-file")
        if args.host not in LOOPBACK and not token:
            raise ValueError(f"--host {args.host} accepts connections from other machines: give a --token-file "
                             f"(e.g. `openssl rand -hex 32 > reward.token`), or keep the default 127.0.0.1")
        if args.workers < 1:
            raise ValueError(f"--workers {args.workers} must be positive")
        from rlrunner.rewards.serving.limits import limits_from_options

        limits = limits_from_options(args)
        from rlrunner.rewards import build_reward

        reward = build_reward(reward_config(args))
        check_scores_images(reward)
    except (ValueError, ImportError, OSError) as err:
        print(f"serve_reward: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    from rlrunner.rewards.serving.server import build_app, serve

    app = build_app(reward, limits, args.workers, token, args.served_model_name)
    print(f"serve_reward: {args.reward} reward on http://{args.host}:{args.port} (token: {'yes' if token else 'no'}, "
          f"workers: {args.workers})", flush=True)
    serve(app, args.host, args.port, limits)
    return 0


if __name__ == "__main__":
    sys.exit(main())

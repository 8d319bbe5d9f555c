"""Write the tiny OCR prompt files (``train.txt`` / ``test.txt``) with fixed seeds.

Same format as the real OCR dataset: one prompt per line, the target text in the first pair of double quotes,
e.g. ``a sign that says "4827"``. Targets are 3-6 characters from the tiny model's alphabet (digits 2-9 by
default: 0/1 are left out because the OCR engine confuses them with O/I). Test targets are all distinct and
never appear in the train split; ``scripts/pretrain_tiny.py`` also keeps them out of pretraining.

    python scripts/make_tiny_prompts.py --out examples/diffusion/data/tiny_ocr
"""

from __future__ import annotations

import argparse
import os
import random

TEMPLATES = (
    'a sign that says "{}"',
    'a street sign with the number "{}"',
    'a receipt showing the total "{}"',
    'a license plate reading "{}"',
    'a price tag that reads "{}"',
    'a scoreboard displaying "{}"',
    'a handwritten note with the code "{}"',
    'a door with the house number "{}"',
    'a digital clock showing "{}"',
    'a ticket stub printed with "{}"',
    'a chalkboard with "{}" written on it',
    'a poster with the big number "{}"',
)
DEFAULT_ALPHABET = "23456789"


def random_target(rng: random.Random, alphabet: str, min_len: int, max_len: int) -> str:
    """A random string of ``min_len..max_len`` characters from ``alphabet`` (lengths uniform)."""
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len)))


def make_prompts(num: int, seed: int, alphabet: str, min_len: int, max_len: int,
                 exclude: set[str] | None = None, unique: bool = False) -> list[str]:
    """``num`` prompts; targets in ``exclude`` are skipped, ``unique`` makes every target distinct."""
    rng = random.Random(seed)
    seen: set[str] = set(exclude or ())
    prompts = []
    while len(prompts) < num:
        target = random_target(rng, alphabet, min_len, max_len)
        if target in (exclude or ()) or (unique and target in seen):
            continue
        seen.add(target)
        prompts.append(rng.choice(TEMPLATES).format(target))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="examples/diffusion/data/tiny_ocr")
    parser.add_argument("--alphabet", default=DEFAULT_ALPHABET)
    parser.add_argument("--min-len", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=6)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-test", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    test = make_prompts(args.num_test, args.seed + 1, args.alphabet, args.min_len, args.max_len, unique=True)
    test_targets = {p.split('"')[1] for p in test}
    train = make_prompts(args.num_train, args.seed, args.alphabet, args.min_len, args.max_len, exclude=test_targets)
    os.makedirs(args.out, exist_ok=True)
    for name, prompts in (("train.txt", train), ("test.txt", test)):
        with open(os.path.join(args.out, name), "w") as f:
            f.write("\n".join(prompts) + "\n")
    print(f"wrote {len(train)} train and {len(test)} test prompts to {args.out}")


if __name__ == "__main__":
    main()

"""The scoring rule (docs/design.md, "The OCR reward") as a pure function, checked by hand and against the reference
formula."""

from __future__ import annotations

import random
import unicodedata

import Levenshtein
import pytest

from rlrunner.rewards import extract_target, ocr_score
from rlrunner.rewards.ocr.reward import filter_alphabet, join_lines, normalize_text


def reference_score(recognized: str, prompt: str) -> float:
    """flow_grpo / DiffusionNFT's OcrScorer arithmetic, for prompts that contain a quoted span."""
    target = prompt.split('"')[1].replace(" ", "").lower()
    text = recognized.replace(" ", "").lower()
    dist = 0 if target in text else Levenshtein.distance(text, target)
    dist = min(dist, len(target))
    return 1 - dist / len(target)


@pytest.mark.parametrize(
    ("prompt", "target"),
    [
        ('a neon sign that says "Open Late" above a door', "Open Late"),
        ('first "one" then "two"', "one"),
        ("no quotes at all", "no quotes at all"),
        ('unclosed "quote here', "quote here"),
        ('empty "" quotes', ""),
    ],
)
def test_extract_target(prompt: str, target: str) -> None:
    assert extract_target(prompt) == target


def test_exact_and_case_and_spaces() -> None:
    assert ocr_score("Hello World", 'a sign "hello world"') == 1.0
    assert ocr_score("HELLOWORLD", 'a sign "Hello World"') == 1.0
    assert ocr_score("H e l l o  W o r l d", 'a sign "Hello World"') == 1.0


def test_substring_gets_full_score() -> None:
    assert ocr_score("Welcome to the Hello World cafe", 'poster with "hello world"') == 1.0
    assert ocr_score("xxHELLOWORLDyy", '"hello world"') == 1.0


def test_levenshtein_fraction() -> None:
    assert ocr_score("hallo", '"hello"') == pytest.approx(0.8)  # one substitution out of 5
    assert ocr_score("helo", '"hello"') == pytest.approx(0.8)  # one deletion
    assert ocr_score("hello!!", '"hellp"') == pytest.approx(1 - 3 / 5)


def test_distance_is_capped_so_reward_is_never_negative() -> None:
    assert ocr_score("a completely different and much longer text", '"cat"') == 0.0
    assert ocr_score("", '"cat"') == 0.0


def test_empty_target_scores_zero() -> None:
    assert ocr_score("anything", 'quotes "" empty') == 0.0
    assert ocr_score("anything", '"   "') == 0.0


def test_whole_prompt_is_target_without_quotes() -> None:
    assert ocr_score("STOP", "stop") == 1.0
    assert ocr_score("STOP", "stop sign") == pytest.approx(1 - 4 / 8)


def test_unicode_targets() -> None:
    assert ocr_score("GRÖSSE", '"größe"') == pytest.approx(1 - 2 / 5)  # "ß".lower() stays "ß"
    assert ocr_score("Größe", '"GRÖßE"') == 1.0
    assert ocr_score("你好世界", '一个写着"你好 世界"的招牌') == 1.0
    assert ocr_score("Привет", '"привет мир"') == pytest.approx(1 - 3 / 9)
    decomposed = unicodedata.normalize("NFD", "café")
    assert ocr_score(decomposed, '"Café"') == 1.0  # NFC on both sides


def test_matches_reference_formula_on_random_strings() -> None:
    rng = random.Random(0)
    alphabet = "abcdeABCDE  12é"
    for _ in range(500):
        target = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        if not target.replace(" ", ""):
            continue
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        prompt = f'a photo of "{target}" on a wall'
        assert ocr_score(text, prompt) == pytest.approx(reference_score(text, prompt))


def test_normalize_filter_and_join() -> None:
    assert normalize_text(" A b C ") == "abc"
    assert filter_alphabet("H3llo, W0rld!", "abcdefghijklmnopqrstuvwxyz") == "HlloWrld"
    assert filter_alphabet("H3llo", "") == "H3llo"
    assert filter_alphabet("ABC", "ab") == "AB"  # case-insensitive
    assert join_lines([("Hello", 0.9), ("noise", 0.2), ("World", 0.5)]) == "HelloWorld"

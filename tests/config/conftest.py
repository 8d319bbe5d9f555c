"""The recipe folder fixture shared by the loader and key-check tests."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipe_dir(tmp_path: Path, monkeypatch) -> Path:
    """A config dir with a copy of the default recipe whose paths point at real files in tmp_path."""
    (tmp_path / "model").mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text('a sign that says "2345"\n')
    (data / "test.txt").write_text('a sign that says "6789"\n')
    recipe = yaml.safe_load((ROOT / "examples/diffusion/config/tiny_nft_ocr.yaml").read_text())
    recipe["actor"]["model"]["model_path"] = str(tmp_path / "model")
    for split in ("train", "eval"):
        recipe["env"][split]["dataset"]["path"] = str(data)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "base.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.chdir(tmp_path)
    return config_dir

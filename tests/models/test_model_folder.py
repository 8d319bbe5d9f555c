"""A model folder's JSON files (``model_index.json``, each component's ``config.json``) have one reader,
:func:`rlrunner.models.meta.read_config_file`, whose errors name the file and why it is needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlrunner.models.loading import read_model_index
from rlrunner.models.meta import ModelFolderError, read_components

PACKAGE = Path(__file__).resolve().parents[2] / "rlrunner"
READS = re.compile(r"json\.loads?\(|read_text\(|open\(")
WRITES = re.compile(r"[\"']w[b+]?[\"']")
FOLDER_FILES = re.compile(r"model_index|config\.json|MODEL_INDEX|CONFIG_FILE|index_file", re.IGNORECASE)


def _reads_a_folder_file(line: str) -> bool:
    return bool(READS.search(line) and FOLDER_FILES.search(line) and not WRITES.search(line))


def test_one_reader_of_a_model_folders_json_files():
    readers = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
               for path in sorted(PACKAGE.rglob("*.py")) if path.name != "meta.py" or path.parent.name != "models"
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if _reads_a_folder_file(line)]
    assert readers == [], "read these through rlrunner.models.meta.read_config_file:\n" + "\n".join(readers)
    assert _reads_a_folder_file('    index = json.loads((folder / "model_index.json").read_text())')  # it sees one
    assert not _reads_a_folder_file('    with open(os.path.join(path, MODEL_INDEX), "w") as f:')  # writing is none


def test_a_folder_without_or_with_a_broken_index_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model_index.json is missing: actor.model.model_path '.*' is not a "
                                                r"diffusers pipeline folder"):
        read_model_index(str(tmp_path))
    (tmp_path / "model_index.json").write_text("{not json")
    for read in (lambda: read_model_index(str(tmp_path)), lambda: read_components(tmp_path)):
        with pytest.raises(ModelFolderError, match=rf"^{re.escape(str(tmp_path))}/model_index.json cannot be read as "
                                                   r"JSON \("):
            read()

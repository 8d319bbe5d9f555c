"""Which family entry points are accepted: a FlowModel subclass whose model_type is the entry point's name, with a
FamilyConfig settings type, under a name no in-tree family has; each refusal is one line naming the entry point."""

from __future__ import annotations

from pathlib import Path

from rlrunner.models import MODEL_FAMILIES, model_class
from rlrunner.models.families import _accept_family
from rlrunner.models.tiny import TinyFlowModel
from rlrunner.utils.plugins import load_entry_points

GROUP = "rlrunner.model_families"
MODULE = '''
from rlrunner.models.tiny import TinyFlowModel


class Renamed(TinyFlowModel):
    model_type = "renamed"


class WrongName(TinyFlowModel):
    pass  # keeps model_type "tiny"


class NoSettings(TinyFlowModel):
    model_type = "no_settings"
    settings_type = dict


class NotAFamily:
    pass
'''
ENTRY_POINTS = {
    "renamed": "Renamed",
    "tiny": "Renamed",  # an in-tree name
    "wrong_name": "WrongName",
    "no_settings": "NoSettings",
    "not_a_family": "NotAFamily",
}


def test_only_well_formed_family_entry_points_load(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "famplug.py").write_text(MODULE)
    info = tmp_path / "famplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: famplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n" + "".join(f"{name} = famplug:{cls}\n"
                                                                   for name, cls in ENTRY_POINTS.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded, failed = load_entry_points(GROUP, _accept_family)
    assert list(loaded) == ["renamed"] and loaded["renamed"].__name__ == "Renamed"
    assert failed == {
        "tiny": f"rlrunner: plugin entry point {GROUP} 'tiny = famplug:Renamed' failed to load: ValueError: 'tiny' is "
                "an in-tree family (rlrunner.models.tiny:TinyFlowModel); choose another name",
        "wrong_name": f"rlrunner: plugin entry point {GROUP} 'wrong_name = famplug:WrongName' failed to load: "
                      "ValueError: WrongName.model_type is 'tiny'; set it to the entry point's name 'wrong_name'",
        "no_settings": f"rlrunner: plugin entry point {GROUP} 'no_settings = famplug:NoSettings' failed to load: "
                       "TypeError: NoSettings.settings_type must be a dataclass subclassing "
                       "rlrunner.models.settings.FamilyConfig, got <class 'dict'>",
        "not_a_family": f"rlrunner: plugin entry point {GROUP} 'not_a_family = famplug:NotAFamily' failed to load: "
                        "TypeError: expected a FlowModel subclass, got <class 'famplug.NotAFamily'>",
    }
    assert capsys.readouterr().err.splitlines() == list(failed.values())  # one line each, no traceback
    assert model_class("tiny") is TinyFlowModel and "renamed" not in MODEL_FAMILIES  # this process's registry


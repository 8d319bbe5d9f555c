"""Which model families exist: the in-tree ones and those that other packages declare as entry points.

Each family is a name (``actor.model.model_type``) and a ``"module:Class"`` naming its
:class:`~rlrunner.models.base.FlowModel` subclass. The in-tree families are listed in :data:`IN_TREE` in that form
(the form of an entry point's value), because a source checkout is not an installed distribution whose entry points
Python could read. A package of one's own adds families without editing rlrunner, in its pyproject.toml:

    [project.entry-points."rlrunner.model_families"]
    my_family = "my_package.family:MyFlowModel"

Plugins are imported when this module is, so that one that fails is reported at start-up, in one line on stderr
(:mod:`rlrunner.utils.plugins`), and is listed in :data:`BROKEN_FAMILIES`; the in-tree families are unaffected. A
family's class names its recipe section's type (``settings_type``, :mod:`rlrunner.models.settings`), which
:func:`family_settings` collects for the recipe schema.
"""

from __future__ import annotations

from typing import Any

from rlrunner.models.base import FlowModel
from rlrunner.models.settings import FamilyConfig
from rlrunner.utils.plugins import load_entry_points
from rlrunner.utils.registry import lazy_class

GROUP = "rlrunner.model_families"

IN_TREE: dict[str, str] = {
    "tiny": "rlrunner.models.tiny:TinyFlowModel",
    "sd3": "rlrunner.models.sd3:SD3FlowModel",
    "wan22_ti2v_5b": "rlrunner.models.wan:WanFlowModel",
    "wan21_t2v": "rlrunner.models.wan:Wan21FlowModel",
    "wan22_t2v_a14b": "rlrunner.models.wan_a14b:WanA14BFlowModel",
    "qwen_image": "rlrunner.models.qwen_image:QwenImageFlowModel",
    "zimage": "rlrunner.models.zimage:ZImageFlowModel",
    "flux2_klein": "rlrunner.models.flux2_klein:Flux2KleinFlowModel",
    "flux1": "rlrunner.models.flux1:Flux1FlowModel",
}


def _accept_family(name: str, obj: Any) -> None:
    """Refuse an entry point that takes an in-tree name or names no FlowModel subclass of that ``model_type`` with a
    settings type."""
    if name in IN_TREE:
        raise ValueError(f"{name!r} is an in-tree family ({IN_TREE[name]}); choose another name")
    if not (isinstance(obj, type) and issubclass(obj, FlowModel)):
        raise TypeError(f"expected a FlowModel subclass, got {obj!r}")
    if obj.model_type != name:  # the family's messages name actor.model.<model_type>, its section
        raise ValueError(f"{obj.__name__}.model_type is {obj.model_type!r}; set it to the entry point's name {name!r}")
    settings = obj.settings_type
    if not (isinstance(settings, type) and issubclass(settings, FamilyConfig)):
        raise TypeError(f"{obj.__name__}.settings_type must be a dataclass subclassing "
                        f"rlrunner.models.settings.FamilyConfig, got {settings!r}")


_PLUGINS, BROKEN_FAMILIES = load_entry_points(GROUP, _accept_family)
#: ``actor.model.model_type`` -> ``"module:Class"``: the in-tree families, then the plugins that loaded
MODEL_FAMILIES: dict[str, str] = {**IN_TREE, **{name: f"{cls.__module__}:{cls.__qualname__}"
                                                for name, cls in _PLUGINS.items()}}


def plugin_failure(model_type: str) -> str | None:
    """The one line refusing ``model_type`` when it names a plugin that failed to load (its entry point and error),
    else None (a plugin refused for taking an in-tree name leaves that name to the in-tree family)."""
    if model_type not in BROKEN_FAMILIES or model_type in MODEL_FAMILIES:
        return None
    return (f"actor.model.model_type={model_type!r} is a plugin that failed to load: "
            f"{BROKEN_FAMILIES[model_type].removeprefix('rlrunner: plugin ')}")


def model_class(model_type: str) -> type[FlowModel]:
    """The family class of ``model_type``; an unknown one is a ValueError listing the valid names."""
    if (why := plugin_failure(model_type)) is not None:
        raise ValueError(why)
    return lazy_class(MODEL_FAMILIES, model_type, "actor.model.model_type")


def family_settings() -> dict[str, type[FamilyConfig]]:
    """``actor.model.<name>`` -> its section's settings type, for every family (imports each family's module)."""
    return {name: model_class(name).settings_type for name in MODEL_FAMILIES}

"""GenEval's scoring as pure functions over an object detector's output (no model, no I/O).

Follows the official evaluation (djghosh13/geneval ``evaluation/evaluate_images.py``) and the training reward the
anchors use (flow_grpo's GenEval reward server, ``evaluate_reward``):

- keep a class's detections above ``THRESHOLD`` (0.3; ``COUNTING_THRESHOLD`` 0.9 for ``tag: counting``), most
  confident first, at most ``MAX_OBJECTS`` (16) per class; ``MAX_OVERLAP`` 1.0 turns the official NMS off;
- :func:`correct` (eval, GenEval accuracy): every ``include`` clause holds (at least ``count`` objects of its class;
  of the first ``count``, ``count`` have its ``color``; each of them is ``position`` of every object of the clause
  it refers to) and no ``exclude`` clause does (fewer than ``count`` objects of its class);
- :func:`partial_score` (training, partial credit): the mean over clause checks of ``1 − |count − n| / count``
  for the number ``n`` of objects found, the same with the number of the right colour, 1/0 for the position; a
  check that cannot run because the count is wrong scores 0; ``strict`` is True when every count is exact and
  every colour and position holds. ``exclude`` clauses are not scored, as in the anchors. One difference: when a
  position fails, the anchors' code appends 0 and then 1 for it (its loop's ``break`` skips only the inner loop);
  here a failed position scores 0 alone.

Colour labels come from the detector side (the official code classifies each object's crop with CLIP ViT-L/14
zero-shot over ``COLORS``); a detection is ``{"label": str, "box": [x0, y0, x1, y1], "score": float,
"color": str | None}`` in pixels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlrunner.utils.numbers import is_finite_number

THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
MAX_OVERLAP = 1.0
POSITION_THRESHOLD = 0.1
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


@dataclass(frozen=True)
class Detection:
    """One kept object: its box ``[x0, y0, x1, y1]`` (pixels), confidence and colour label (or None)."""

    box: tuple[float, float, float, float]
    score: float
    color: str | None = None


Objects = dict[str, list[Detection]]


def parse_detections(body: object, count: int) -> list[list[Mapping[str, Any]]]:
    """The ``detections`` of a detector server's answer for ``count`` images, each checked (a label, a finite
    score, four finite box coordinates, a colour or null), so that scoring cannot fail on what a server sent.

    Raises:
        ValueError: the answer is not of that shape; the message quotes the first bad part.
    """
    detections = body.get("detections") if isinstance(body, dict) else None
    if not isinstance(detections, list) or len(detections) != count:
        raise ValueError(f"without a 'detections' list of {count} entries")
    for per_image in detections:
        if not isinstance(per_image, list) or not all(_is_detection(d) for d in per_image):
            raise ValueError(f"a malformed detection list: {str(per_image)[:120]} (expected [{{label, box: "
                             f"[x0, y0, x1, y1], score, color}}] with finite numbers)")
    return detections


def _is_detection(d: object) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("label"), str) and is_finite_number(d.get("score"))
            and isinstance(d.get("box"), list) and len(d["box"]) == 4 and all(is_finite_number(v) for v in d["box"])
            and (d.get("color") is None or isinstance(d["color"], str)))


def iou(box_a: Sequence[float], box_b: Sequence[float]) -> float:
    """Intersection over union with GenEval's inclusive pixel convention (width = x1 − x0 + 1)."""
    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0.0


def select_objects(detections: Sequence[Mapping[str, Any]], tag: str, threshold: float = THRESHOLD,
                   counting_threshold: float = COUNTING_THRESHOLD, max_objects: int = MAX_OBJECTS,
                   max_overlap: float = MAX_OVERLAP) -> Objects:
    """Per class, the detections kept for scoring, most confident first (see the module docstring)."""
    cutoff = counting_threshold if tag == "counting" else threshold
    by_class: dict[str, list[Detection]] = {}
    for d in detections:
        if float(d["score"]) > cutoff:
            box = tuple(float(v) for v in d["box"])
            by_class.setdefault(str(d["label"]), []).append(Detection(box, float(d["score"]), d.get("color")))
    objects: Objects = {}
    for label, found in by_class.items():
        ranked = sorted(found, key=lambda d: -d.score)[:max_objects]
        kept: list[Detection] = []
        while ranked:
            best = ranked.pop(0)
            kept.append(best)
            if max_overlap < 1:
                ranked = [d for d in ranked if iou(best.box, d.box) < max_overlap]
        objects[label] = kept
    return objects


def relative_position(a: Detection, b: Detection, threshold: float = POSITION_THRESHOLD) -> set[str]:
    """Where ``a`` is relative to ``b``: the centre offset shrunk by ``threshold`` times the summed box sizes per
    axis, then a relation where its direction holds over half of the offset's length (image y points down)."""
    box_a, box_b = np.asarray(a.box, dtype=float), np.asarray(b.box, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):  # boxes near 1e308 (a hostile detector): no relation
        offset = (box_a[:2] + box_a[2:]) / 2 - (box_b[:2] + box_b[2:]) / 2
        dims = np.abs(box_a[2:] - box_a[:2]) + np.abs(box_b[2:] - box_b[:2])
        revised = np.maximum(np.abs(offset) - threshold * dims, 0) * np.sign(offset)
        if np.all(np.abs(revised) < 1e-3):
            return set()
        dx, dy = revised / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def _position_holds(found: list[Detection], targets: list[Detection] | None, relation: str) -> bool:
    return targets is not None and all(relation in relative_position(o, t) for o in found for t in targets)


def correct(objects: Objects, metadata: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """GenEval's accuracy of one image: ``(all clauses hold, reasons for those that do not)``."""
    reasons: list[str] = []
    matched: list[list[Detection] | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"], int(req["count"])
        found = objects.get(name, [])[:count]
        ok = len(found) >= count
        if not ok:
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        if ok and "color" in req and [o.color for o in found].count(req["color"]) < count:
            ok = False
            reasons.append(f"expected {req['color']} {name}>={count}, found {[o.color for o in found]}")
        if ok and "position" in req:
            relation, target = req["position"]
            ok = _position_holds(found, matched[target], relation)
            if not ok:
                reasons.append(f"expected {name} {relation} the {metadata['include'][target]['class']}")
        matched.append(found if ok else None)
    for req in metadata.get("exclude", []):
        if len(objects.get(req["class"], [])) >= int(req["count"]):
            reasons.append(f"expected {req['class']}<{req['count']}, found {len(objects[req['class']])}")
    return not reasons, reasons


def partial_score(objects: Objects, metadata: Mapping[str, Any]) -> tuple[float, bool]:
    """The training reward of one image: ``(mean of the clause checks' credits, strict)`` (module docstring)."""
    credits: list[float] = []
    strict = True
    matched: list[list[Detection] | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"], int(req["count"])
        found = objects.get(name, [])
        credits.append(1 - abs(count - len(found)) / count)
        ok = len(found) == count
        if not ok and ("color" in req or "position" in req):
            credits.append(0.0)
        if ok and "color" in req:
            right = [o.color for o in found].count(req["color"])
            credits.append(1 - abs(count - right) / count)
            ok = right == count
        if ok and "position" in req:
            relation, target = req["position"]
            ok = _position_holds(found, matched[target], relation)
            credits.append(float(ok))
        strict = strict and ok
        matched.append(found if ok else None)
    return (sum(credits) / len(credits) if credits else 0.0), strict


def check_metadata(metadata: Mapping[str, Any]) -> str | None:
    """Why ``metadata`` is not a GenEval record (``tag`` and a non-empty ``include`` of ``{class, count}``), or None."""
    if metadata.get("tag") not in TAGS:
        return f"GenEval tag {metadata.get('tag')!r} is not one of {list(TAGS)}"
    include = metadata.get("include")
    if not isinstance(include, list) or not include:
        return "GenEval record has no 'include' list"
    for i, req in enumerate(include + list(metadata.get("exclude", []))):
        if not isinstance(req, Mapping) or not isinstance(req.get("class"), str) or not (
                isinstance(req.get("count"), int) and req["count"] >= 1):
            return f"GenEval clause {req!r} needs a 'class' name and a 'count' >= 1"
        position = req.get("position")
        if position is not None and not (isinstance(position, list) and len(position) == 2
                                         and position[0] in RELATIONS and isinstance(position[1], int)
                                         and 0 <= position[1] < min(i, len(include))):
            return f"GenEval clause {req!r}: 'position' must be [relation in {list(RELATIONS)}, earlier clause index]"
    return None

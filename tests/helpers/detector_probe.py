"""The GenEval detector server's HTTP side (``detector_server.make_server``) in a process of its own, so that tests
can measure it (peak memory) and abuse it without risking the test process.

Mask2Former needs an environment of its own, so a pixel-statistics detector stands in for it: two cats in a dark
image, none in a bright one. An image whose first pixel is ``FAULT`` makes it raise: the injected server fault that
must come back as a 500 JSON answer. Usage: ``python tests/helpers/detector_probe.py '<Limits as JSON>' [token]``; prints
``port N`` once listening.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

# loaded from its file, as it runs in the detector's own environment: without the rlrunner package (and its torch)
_spec = importlib.util.spec_from_file_location(
    "detector_server", Path(__file__).resolve().parents[2] / "rlrunner/rewards/geneval/detector_server.py")
detector_server = sys.modules["detector_server"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(detector_server)

FAULT = (13, 13, 13)
CATS = [{"label": "cat", "box": [0, 0, 9, 9], "score": 0.95, "color": None},
        {"label": "cat", "box": [20, 0, 29, 9], "score": 0.95, "color": None}]


def detect(images: list[np.ndarray]) -> list[list[dict]]:
    if any(tuple(im[0, 0]) == FAULT for im in images):
        raise RuntimeError("injected detector fault")
    return [CATS if im.mean() < 128 else [] for im in images]


if __name__ == "__main__":
    server = detector_server.make_server(detect, "127.0.0.1", 0, sys.argv[2] if len(sys.argv) > 2 else "",
                                         detector_server.Limits(**json.loads(sys.argv[1])))
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()

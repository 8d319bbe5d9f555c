"""OCR engines behind one interface, in a registry chosen by ``reward.engine`` (``auto|rapidocr|paddleocr``).

Both engines run the PP-OCR detector + recogniser with the settings of the reference code (PaddleOCR 2.x, as
used by flow_grpo / DiffusionNFT): no text-line orientation classifier, detector input limited to a longest
side of 960 px (``limit_type: max``; a 512 px image is not upscaled), lines below confidence 0.5 dropped.

- ``paddleocr``: the engine the published DiffusionNFT / flow_grpo curves were scored with. PaddleOCR 3.x API, and
  the 2.x API, with the models of ``reward.ocr_version`` named explicitly (:data:`PADDLE_MODELS`; PaddleOCR 3.x alone
  would pick PP-OCRv5). It downloads its models on first use, so it needs network access or a warm model cache. No
  requirement set installs it: Paddle's GPU builds pin CUDA libraries other than torch's (``requirements/gpu.txt``
  says how to install it in an environment of its own).
- ``rapidocr``: RapidOCR 3.x: the same PP-OCR models as ONNX, shipped inside the wheel, so it runs offline. On ONNX
  Runtime's CPU build (``requirements/core.txt``, ``npu.txt``) or its CUDA build (``requirements/gpu.txt``:
  ``onnxruntime-gpu``, used with ``reward.use_gpu: true``; its CUDA provider links the CUDA 13 and cuDNN 9 libraries
  that torch, imported before any engine is built, has loaded). We use ``rapidocr`` (with ``opencv-python-headless``),
  not ``rapidocr-onnxruntime``, which pulls ``opencv-python`` and clashes with the headless build.
- ``auto``: PaddleOCR when it is installed and builds, else RapidOCR (so RapidOCR with every requirement set).

Heavy imports happen only inside the engine constructors. All engines take RGB uint8 ``[H, W, 3]`` arrays.
"""

from __future__ import annotations

import importlib.util
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from rlrunner.utils.threads import worker_cpus

logger = logging.getLogger(__name__)

#: Recognised lines below this confidence are dropped (PaddleOCR 2.x ``drop_score``; RapidOCR ``text_score``).
MIN_TEXT_SCORE = 0.5
#: Detector input size limit (longest side), as PaddleOCR 2.x ``det_limit_side_len`` / ``det_limit_type: max``.
DET_LIMIT_SIDE = 960

#: One recognised line: (text, confidence in [0, 1]).
Line = tuple[str, float]

#: ``reward.ocr_version`` -> ``reward.lang`` -> PaddleOCR 3.x (detection, recognition) model names: the ones
#: PaddleOCR 3.x itself maps that version and language to. The reference scoring (flow_grpo / DiffusionNFT:
#: paddleocr 2.9.1, ``lang="en"``, its default PP-OCRv4) ran en_PP-OCRv4_rec, the recogniser named here for
#: PP-OCRv4 / en, behind 2.x's en_PP-OCRv3_det, a detector PaddleOCR 3.x no longer ships.
PADDLE_MODELS: dict[str, dict[str, tuple[str, str]]] = {
    "PP-OCRv4": {"en": ("PP-OCRv4_mobile_det", "en_PP-OCRv4_mobile_rec"),
                 "ch": ("PP-OCRv4_mobile_det", "PP-OCRv4_mobile_rec")},
    "PP-OCRv5": {"en": ("PP-OCRv5_server_det", "en_PP-OCRv5_mobile_rec"),
                 "ch": ("PP-OCRv5_server_det", "PP-OCRv5_server_rec")},
}
#: PaddleOCR 2.x knows PP-OCRv4 and older by ``ocr_version`` (it picks the models itself)
PADDLE_2X_VERSIONS = ("PP-OCRv4",)


class OcrEngine(ABC):
    """Reads text from images. Instances are used by one thread at a time (the reward keeps a pool)."""

    name: str = ""

    @abstractmethod
    def read(self, images: list[np.ndarray]) -> list[list[Line]]:
        """Detect and recognise all text lines.

        Args:
            images: RGB uint8 arrays ``[H, W, 3]`` (sizes may differ).

        Returns:
            One list of ``(text, score)`` lines per image, in reading order (top to bottom, left to right).
        """

    @abstractmethod
    def read_lines(self, images: list[np.ndarray]) -> list[Line]:
        """Recognition only: each image is taken to be one text line (no detector; much faster).

        Returns:
            One ``(text, score)`` per image.
        """


EngineBuilder = Callable[..., OcrEngine]
ENGINES: dict[str, EngineBuilder] = {}
#: Packages whose presence makes an engine a candidate for ``engine: auto``, best first.
AUTO_ORDER: tuple[tuple[str, str], ...] = (("paddleocr", "paddleocr"), ("rapidocr", "rapidocr"))
INSTALL_HINT = {
    "rapidocr": "pip install rapidocr onnxruntime opencv-python-headless  (requirements/core.txt; on a GPU "
                "onnxruntime-gpu instead of onnxruntime: requirements/gpu.txt)",
    "paddleocr": "pip install paddleocr paddlepaddle  (CPU; Paddle's GPU build, in an environment of its own: "
                 "requirements/gpu.txt)",
}


def register_engine(name: str) -> Callable[[EngineBuilder], EngineBuilder]:
    """Decorator: make ``reward.engine: <name>`` build this engine class."""

    def wrap(builder: EngineBuilder) -> EngineBuilder:
        ENGINES[name] = builder
        return builder

    return wrap


def missing_engine_error(name: str, err: Exception | None = None) -> ImportError:
    detail = f" ({err})" if err else ""
    return ImportError(f"OCR engine {name!r} is not installed{detail}. Install it with: {INSTALL_HINT[name]}")


def import_engine(name: str, module: str) -> Any:
    """``module`` of OCR engine ``name``'s package, imported when the engine is built; an ImportError that says how
    to install it otherwise."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_engine_error(name, err) from err


def installed_engines() -> list[str]:
    """Registered engines whose package is importable, in ``auto`` preference order."""
    return [name for name, package in AUTO_ORDER if name in ENGINES and _is_installed(package)]


def _is_installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError, AttributeError):  # a broken install or a module blocked in sys.modules
        return False


def build_engine(name: str, *, lang: str = "en", use_gpu: bool = False, num_threads: int = 0, batch_size: int = 16,
                 ocr_version: str = "PP-OCRv4"):
    """Build the engine called ``name`` (``auto`` picks the best installed one that builds).

    Args:
        num_threads: CPU threads for inference; 0 = all available cores.
        ocr_version: PP-OCR generation of the ``paddleocr`` engine's models (a key of :data:`PADDLE_MODELS`).

    Returns:
        ``(engine, resolved_name)``.

    Raises:
        ValueError: unknown name (lists the valid ones). ImportError: the engine is not installed (says how to
        install it).
    """
    kwargs: dict[str, Any] = {"lang": lang, "use_gpu": use_gpu, "num_threads": num_threads, "batch_size": batch_size,
                              "ocr_version": ocr_version}
    if name != "auto":
        if name not in ENGINES:
            raise ValueError(f"Unknown reward.engine {name!r}; valid names: {['auto', *sorted(ENGINES)]}")
        return ENGINES[name](**kwargs), name
    failures = []
    for candidate in installed_engines():
        try:
            return ENGINES[candidate](**kwargs), candidate
        except Exception as err:  # noqa: BLE001  e.g. PaddleOCR installed but cannot download its models offline
            failures.append(f"{candidate}: {type(err).__name__}: {err}")
            logger.warning("reward.engine=auto: %s failed to start (%s); trying the next engine", candidate, err)
    hints = "; ".join(INSTALL_HINT.values())
    tried = f" Tried: {failures}." if failures else ""
    raise ImportError(f"No OCR engine is usable.{tried} Install one: {hints}")


def default_num_threads(num_workers: int) -> int:
    """Inference threads per engine so that ``num_workers`` concurrent engines share the worker's CPUs (what the
    cluster sized it for: ``cluster.cpus_per_worker``, or with ``cluster.env_threads: node`` its share of its node's
    CPUs; else this machine's cores) without oversubscribing."""
    return max(1, worker_cpus() // max(1, num_workers))


@register_engine("rapidocr")
class RapidOcrEngine(OcrEngine):
    """RapidOCR 3.x (ONNX Runtime). Models ship inside the wheel: works offline.

    RapidOCR keeps per-call keyword arguments (``use_det``...) for later calls, so every call passes all of them.
    It runs the models its wheel ships: ``ocr_version`` (the ``paddleocr`` engine's models) is accepted so that
    every engine takes the same arguments, and not read.
    """

    name = "rapidocr"

    def __init__(self, lang: str = "en", use_gpu: bool = False, num_threads: int = 0, batch_size: int = 16,
                 ocr_version: str = "PP-OCRv4") -> None:
        rapidocr = import_engine("rapidocr", "rapidocr")
        self._crop = import_engine("rapidocr", "rapidocr.utils.process_img").get_rotate_crop_image
        params: dict[str, Any] = {
            "Global.log_level": "error",
            "Global.use_cls": False,
            "Global.text_score": MIN_TEXT_SCORE,
            "Det.limit_type": "max",
            "Det.limit_side_len": DET_LIMIT_SIDE,
            "Rec.lang_type": lang,
            "Rec.rec_batch_num": max(1, batch_size),
        }
        if num_threads > 0:
            params["EngineConfig.onnxruntime.intra_op_num_threads"] = num_threads
            params["EngineConfig.onnxruntime.inter_op_num_threads"] = 1
        if use_gpu:
            params["EngineConfig.onnxruntime.use_cuda"] = _onnx_cuda_available()
        try:
            self._ocr = rapidocr.RapidOCR(params=params)
        except ValueError as err:  # unsupported lang_type and the like
            raise ValueError(f"RapidOCR cannot be built for lang={lang!r}: {err}") from err

    def _call(self, bgr: np.ndarray, use_det: bool, use_rec: bool) -> Any:
        return self._ocr(bgr, use_det=use_det, use_cls=False, use_rec=use_rec)

    def read(self, images: list[np.ndarray]) -> list[list[Line]]:
        """Detection per image, then one batched recognition over the text boxes of all images."""
        crops: list[np.ndarray] = []
        owners: list[int] = []
        for i, image in enumerate(images):
            bgr = _bgr(image)
            det = self._call(bgr, use_det=True, use_rec=False)
            boxes = getattr(det, "boxes", None)
            for box in [] if boxes is None else boxes:
                box = np.asarray(box, dtype=np.float32)
                if min(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[0] - box[3])) < 2:
                    continue  # degenerate box: nothing to read, and it would break the crop
                crops.append(self._crop(bgr, box))
                owners.append(i)
        lines: list[list[Line]] = [[] for _ in images]
        for owner, line in zip(owners, self._recognize(crops)):
            lines[owner].append(line)
        return lines

    def read_lines(self, images: list[np.ndarray]) -> list[Line]:
        return self._recognize([_bgr(image) for image in images])

    def _recognize(self, crops: list[np.ndarray]) -> list[Line]:
        """Batched recognition of BGR line crops."""
        if not crops:
            return []
        recognizer = getattr(self._ocr, "_load_rec_model", None)
        if recognizer is None:  # a RapidOCR without the internal loader: one public call per crop
            outs = [self._call(c, use_det=False, use_rec=True) for c in crops]
            return [(o.txts[0], float(o.scores[0])) if o.txts else ("", 0.0) for o in outs]
        from rapidocr.ch_ppocr_rec import TextRecInput

        out = recognizer()(TextRecInput(img=crops))
        return [(str(t), float(s)) for t, s in zip(out.txts, out.scores)]


def _bgr(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image[..., ::-1])


def _onnx_cuda_available() -> bool:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return True
    logger.warning("reward.use_gpu=true but onnxruntime has no CUDA provider (install onnxruntime-gpu); OCR on CPU")
    return False


@register_engine("paddleocr")
class PaddleOcrEngine(OcrEngine):
    """PaddleOCR, the reference engine: 3.x API (``predict``), or the 2.x API (``ocr``) on PaddleOCR < 3.

    3.x gets the detection and recognition models of ``ocr_version`` / ``lang`` by name (:data:`PADDLE_MODELS`),
    and recognition-only reading builds the public ``TextRecognition`` with that recognition model; 2.x gets
    ``ocr_version`` and picks the models itself, as the reference scoring did.
    """

    name = "paddleocr"

    def __init__(self, lang: str = "en", use_gpu: bool = False, num_threads: int = 0, batch_size: int = 16,
                 ocr_version: str = "PP-OCRv4") -> None:
        paddleocr = import_engine("paddleocr", "paddleocr")
        self._module = paddleocr
        version = str(getattr(paddleocr, "__version__", "3"))
        self._v3 = int(version.split(".")[0]) >= 3
        self._lang, self._use_gpu, self._batch_size = lang, use_gpu, max(1, batch_size)
        self._ocr_version = ocr_version
        self._threads = num_threads if num_threads > 0 else default_num_threads(1)
        self._recognizer: Any = None
        if self._v3:
            self._det_model, self._rec_model = paddle_model_names(ocr_version, lang)
            self._ocr = self._build_v3()
        elif ocr_version not in PADDLE_2X_VERSIONS:
            raise ValueError(f"reward.ocr_version {ocr_version!r} needs PaddleOCR 3.x, but {version} is installed; "
                             f"use one of {list(PADDLE_2X_VERSIONS)} or pip install 'paddleocr>=3'")
        else:
            self._ocr = self._build_v2()

    def _device(self) -> str:
        return "gpu" if self._use_gpu else "cpu"

    def _build_v3(self) -> Any:
        return self._module.PaddleOCR(
            text_detection_model_name=self._det_model,
            text_recognition_model_name=self._rec_model,
            device=self._device(),
            cpu_threads=self._threads,
            use_doc_orientation_classify=False,
            use_doc_unwarping=False,
            use_textline_orientation=False,
            text_det_limit_type="max",
            text_det_limit_side_len=DET_LIMIT_SIDE,
            text_rec_score_thresh=0.0,
            text_recognition_batch_size=self._batch_size,
        )

    def _build_v2(self) -> Any:
        return self._module.PaddleOCR(
            use_angle_cls=False,
            lang=self._lang,
            ocr_version=self._ocr_version,
            use_gpu=self._use_gpu,
            show_log=False,
            det_limit_type="max",
            det_limit_side_len=DET_LIMIT_SIDE,
            drop_score=0.0,
            rec_batch_num=self._batch_size,
            cpu_threads=self._threads,
        )

    def read(self, images: list[np.ndarray]) -> list[list[Line]]:
        if self._v3:
            results = self._ocr.predict([_bgr(image) for image in images])
            return [list(zip(map(str, r["rec_texts"]), map(float, r["rec_scores"]))) for r in results]
        lines = []
        for image in images:
            result = self._ocr.ocr(_bgr(image), det=True, rec=True, cls=False)
            page = result[0] if result else None
            lines.append([(str(text), float(score)) for _box, (text, score) in page or []])
        return lines

    def read_lines(self, images: list[np.ndarray]) -> list[Line]:
        if self._v3:
            results = self._rec_only_model().predict([_bgr(image) for image in images], batch_size=self._batch_size)
            return [(str(r["rec_text"]), float(r["rec_score"])) for r in results]
        lines = []
        for image in images:
            result = self._ocr.ocr(_bgr(image), det=False, rec=True, cls=False)
            page = result[0] if result else None
            lines.append((str(page[0][0]), float(page[0][1])) if page else ("", 0.0))
        return lines

    def _rec_only_model(self) -> Any:
        """PaddleOCR 3.x: the pipeline's recognition model alone, public ``TextRecognition`` (built on first use)."""
        if self._recognizer is None:
            self._recognizer = self._module.TextRecognition(
                model_name=self._rec_model, device=self._device(), cpu_threads=self._threads
            )
        return self._recognizer


def paddle_model_names(ocr_version: str, lang: str) -> tuple[str, str]:
    """PaddleOCR 3.x (detection, recognition) model names of ``reward.ocr_version`` and ``reward.lang``.

    Raises ``ValueError`` naming both keys and the supported values for a pair outside :data:`PADDLE_MODELS`.
    """
    if ocr_version not in PADDLE_MODELS:
        raise ValueError(f"reward.ocr_version {ocr_version!r} is not one of {list(PADDLE_MODELS)}")
    by_lang = PADDLE_MODELS[ocr_version]
    if lang not in by_lang:
        raise ValueError(f"reward.lang {lang!r} has no PaddleOCR {ocr_version} models here; supported: "
                         f"{list(by_lang)} (add the model names to rlrunner/rewards/ocr/engines.py PADDLE_MODELS)")
    return by_lang[lang]

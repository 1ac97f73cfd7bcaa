"""Every workaround that avalanche-lib 0.6.0 needs beside a CPU build of torch 2.13, in one place.

Import this module before anything from ``avalanche`` or ``torchmetrics`` (streams and strategies do;
nothing in ``ovq_cl`` itself imports it):

- torchvision (imported by Avalanche at import time) registers fake kernels for its compiled ops
  ``torchvision::nms`` and ``torchvision::qnms``; when its compiled library does not load beside a
  CPU torch, those schemas do not exist and the import fails ("operator torchvision::nms does not
  exist"). We define the two schemas (no kernels: detection ops stay unusable, nothing here uses
  them) and import torchvision again.
- Avalanche checkpoints with dill, which under torch 2.13 needs ``dill.settings["byref"] = True``.
- Avalanche imports qpsolvers (for GEM), which warns at import when no QP solver is installed; we use
  no QP-based strategy, so that one warning is silenced; so is "No loggers specified" (runs without
  tracking read their metrics from the evaluator).

torchmetrics imports torchvision as well: import this module before torchmetrics too.
"""
from __future__ import annotations

import sys
import warnings

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # keeps the torch.library.Library alive (dropping it would unregister the schemas)


def _import_torchvision() -> None:
    global _library
    try:
        import torchvision  # noqa: F401
        return
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _library = torch.library.Library("torchvision", "FRAGMENT")
    for op, schema in _SCHEMAS.items():
        try:
            _library.define(schema)
        except RuntimeError:
            pass  # already defined by a partial load
    import torchvision  # noqa: F401


def _patch_dill() -> None:
    try:
        import dill          # Avalanche's dependency, not ovq_cl's: nothing to patch without it
    except ImportError:
        return
    dill.settings["byref"] = True


_import_torchvision()
_patch_dill()
warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning)
# Runs without MLflow build an EvaluationPlugin with no loggers on purpose (metrics are read from it).
warnings.filterwarnings("ignore", message="No loggers specified", category=UserWarning)

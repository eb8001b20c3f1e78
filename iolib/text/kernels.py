"""The loops that pack and cut token windows, chosen once per process: the compiled
extension (`iolib.text.loops`, from iolib/text/loops.c) where it was built, else its
NumPy statement (`iolib.text.loops_numpy`), which gives the same batches bit for bit.

Why a fallback: an install without a C compiler (setup.py builds the extension
optionally) must still load token data, only slower. IOLIB_NO_EXTENSION=1 selects the
NumPy loops even where the extension exists (CI runs the token tests both ways). The
choice is logged once: at INFO when asked for, as a WARNING when the extension is
missing.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)
ENV_SWITCH = "IOLIB_NO_EXTENSION"


def _choose() -> tuple[ModuleType, str]:
    """(the loops module, what it is) for this process."""
    if os.environ.get(ENV_SWITCH, "").strip() not in ("", "0"):
        from iolib.text import loops_numpy

        log.info("iolib.text: packing tokens with the NumPy loops (%s is set).", ENV_SWITCH)
        return loops_numpy, "numpy"
    try:
        from iolib.text import loops as compiled
    except ImportError as exc:
        from iolib.text import loops_numpy

        log.warning(
            "iolib.text: the compiled loops (iolib.text.loops) are not installed (%s): packed "
            "token windows use their NumPy statement, the same batches, more CPU a batch. "
            "Reinstall iolib where a C compiler is found for the compiled ones.",
            exc,
        )
        return loops_numpy, "numpy"
    return compiled, "compiled"


loops, KIND = _choose()

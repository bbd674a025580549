"""The ``torch.backends`` entry point of the forge device: ``import torch`` alone enables it.

It must never break ``import torch``: where this opforge has no forge library, or one built for
another torch, it does nothing; any other failure becomes a warning. TORCH_DEVICE_BACKEND_AUTOLOAD=0
(torch's switch) or OPFORGE_FORGE_AUTOLOAD=0 skips it; ``import opforge.forge`` still works then.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def load() -> None:
    if os.environ.get("OPFORGE_FORGE_AUTOLOAD", "1") == "0":
        return
    try:
        version_file = Path(__file__).with_name("libopforge_forge.version")
        if not version_file.exists():
            return
        import torch

        if version_file.read_text().strip() != torch.__version__:
            return  # built for another torch: opforge.forge would refuse it with an ImportError
        import opforge.forge  # noqa: F401
    except Exception as e:  # noqa: BLE001  (anything at all: import torch must go on)
        warnings.warn(f"opforge: the forge device was not enabled ({type(e).__name__}: {e}); "
                      "import opforge.forge for the full error", RuntimeWarning, stacklevel=2)

"""The ``torch.backends`` entry point of the forge device: ``import torch`` alone enables it.

It must never break ``import torch``: where this opforge has no forge library, or one built for
another torch, it does nothing; any other failure, a broken ``opforge`` package included, becomes
a warning. That is why it lives outside the ``opforge`` package: an entry point inside it would
run ``opforge/__init__.py`` before any guard here could catch what that raises, and torch turns an
entry point's exception into a failed ``import torch``. TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch's
switch) or OPFORGE_FORGE_AUTOLOAD=0 skips it; ``import opforge.forge`` still works then.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def load() -> None:
    if os.environ.get("OPFORGE_FORGE_AUTOLOAD", "1") == "0":
        return
    try:
        import importlib.util

        spec = importlib.util.find_spec("opforge")  # locates the package without running it
        if spec is None or not spec.submodule_search_locations:
            return
        version_file = Path(next(iter(spec.submodule_search_locations))) / "libopforge_forge.version"
        if not version_file.exists():
            return
        import torch

        if version_file.read_text().strip() != torch.__version__:
            return  # built for another torch: opforge.forge would refuse it with an ImportError
        import opforge.forge  # noqa: F401
    except Exception as e:  # noqa: BLE001  (anything at all: import torch must go on)
        warnings.warn(f"opforge: the forge device was not enabled ({type(e).__name__}: {e}); "
                      "import opforge.forge for the full error", RuntimeWarning, stacklevel=2)

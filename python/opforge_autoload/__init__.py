"""The ``torch.backends`` entry point of the forge device: ``import torch`` alone enables it.

It must never break ``import torch``: where this opforge has no forge library, or one built for
another torch, it does nothing; any other failure, a broken ``opforge`` package included, becomes
a warning. That is why it lives outside the ``opforge`` package: an entry point inside it would
run ``opforge/__init__.py`` before any guard here could catch what that raises, and torch turns an
entry point's exception into a failed ``import torch``.

OPFORGE_FORGE_AUTOLOAD=0 (or torch's TORCH_DEVICE_BACKEND_AUTOLOAD=0) skips it; =1 loads forge
even beside a GPU; unset, it loads forge unless torch has a GPU to use (``gpu_in_use_by_torch``):
torch takes a registered PrivateUse1 backend for *the* accelerator, after which every backward
pass over CUDA tensors fails in torch's autograd engine (``opt_ready_stream && opt_parent_stream
INTERNAL ASSERT FAILED``, pytorch/pytorch#161129). ``import opforge.forge`` still works then.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def gpu_in_use_by_torch() -> bool:
    """Whether this torch has a GPU backend with a device present, without initializing CUDA
    (torch.cuda.is_available() would: a CUDA runtime started before fork() fails in the child).
    CUDA devices are counted through NVML (missing where no NVIDIA driver is, so no CUDA either);
    ROCm and XPU builds count as present."""
    import torch

    if getattr(torch.version, "hip", None) or getattr(torch.version, "xpu", None):
        return True
    if not getattr(torch.version, "cuda", None):
        return False
    try:
        return torch.cuda._device_count_nvml() > 0  # -1: no NVML library, so no driver
    except Exception:  # noqa: BLE001  (a private helper: assume a GPU rather than break its autograd)
        return True


def load() -> None:
    setting = os.environ.get("OPFORGE_FORGE_AUTOLOAD", "")
    if setting == "0":
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
        if setting != "1" and gpu_in_use_by_torch():
            return  # see the module docstring: forge would break CUDA autograd in this process
        import opforge.forge  # noqa: F401
    except Exception as e:  # noqa: BLE001  (anything at all: import torch must go on)
        warnings.warn(f"opforge: the forge device was not enabled ({type(e).__name__}: {e}); "
                      "import opforge.forge for the full error", RuntimeWarning, stacklevel=2)

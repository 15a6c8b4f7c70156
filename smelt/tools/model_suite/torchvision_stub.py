"""Lets timm import where torchvision cannot be installed.

timm's model code does not use torchvision, but `import timm` does: its norm layers import
FrozenBatchNorm2d from torchvision.ops.misc and its data package imports torchvision.transforms
and datasets at import time. PyPI's torchvision is built against another torch (installing it
would replace the local torch), so where torchvision does not import, this puts placeholder
modules in sys.modules before timm is imported: FrozenBatchNorm2d is a real (small) module, and
everything else is a placeholder that raises if a model ever calls it. No model in the zoo does.
"""
from __future__ import annotations

import importlib.util
import sys
import types

import torch


class FrozenBatchNorm2d(torch.nn.Module):
    """Batch norm with fixed statistics and affine parameters (buffers, not parameters)."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        for name, value in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            self.register_buffer(name, torch.full((num_features,), value))

    def forward(self, x):
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


class _Placeholder:
    """Stands for any torchvision attribute timm touches at import time; calling it raises."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a placeholder: torchvision is not installed "
                           "(smelt.tools.model_suite.torchvision_stub)")

    def __mro_entries__(self, bases):  # `class X(transforms.Something)` at import time
        return (object,)


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


_SUBMODULES = ("ops", "ops.misc", "transforms", "transforms.functional", "transforms.v2",
               "datasets", "utils", "io", "models")


def install_if_missing() -> bool:
    """Puts the placeholder torchvision in sys.modules when the real one is not importable.
    Returns True when the placeholder is in use."""
    if "torchvision" in sys.modules:
        return isinstance(sys.modules["torchvision"], _PlaceholderModule)
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401
            return False
        except Exception:  # a torchvision built for another torch: use the placeholder
            for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
                del sys.modules[name]
    if importlib.util.find_spec("transformers") is not None:
        # transformers asks for torchvision's import spec at its own import, which the placeholder
        # lacks (ValueError): imported first, it finds torchvision absent, which is the truth.
        import transformers  # noqa: F401
    root = _PlaceholderModule("torchvision")
    root.__path__ = []
    root.__version__ = "0.0.0+smelt-placeholder"
    sys.modules["torchvision"] = root
    for sub in _SUBMODULES:
        module = _PlaceholderModule(f"torchvision.{sub}")
        module.__path__ = []
        sys.modules[module.__name__] = module
        parent, _, leaf = module.__name__.rpartition(".")
        setattr(sys.modules[parent], leaf, module)
    sys.modules["torchvision.ops.misc"].FrozenBatchNorm2d = FrozenBatchNorm2d
    return True

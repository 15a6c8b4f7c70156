"""The model zoo: every family's models, registered in spec.ZOO when their module is imported."""
from __future__ import annotations

from . import zoo_text, zoo_torch, zoo_vision  # noqa: F401  (they register their models)
from .spec import ZOO, ModelSpec


def all_specs() -> dict[str, ModelSpec]:
    return ZOO

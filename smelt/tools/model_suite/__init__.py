"""smelt's model suite: real models built from configs with random weights, run in several modes
(inference fp32/bf16, a training step, dynamic shapes, one-token decode) and judged against eager
and a float64 reference by smelt.tools.accuracy. `python -m smelt.tools.model_suite --help`."""
from .modes import MODES, applies, cases
from .runner import CaseResult, run_case
from .spec import SIZES, ModelSpec
from .zoo import all_specs

__all__ = ["MODES", "SIZES", "CaseResult", "ModelSpec", "all_specs", "applies", "cases", "run_case"]

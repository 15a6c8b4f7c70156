"""The GPU's memory plan for a model-suite case, made on the CPU (issue 22's peaks, worked where the GPU
is not lent): the case compiled with SMELT_CPU_BACKEND=triton, whose Target is the H100's, stopped at
its first kernel launch; each graph's wrapper (SMELT_DEBUG_DIR) gives its PLANNED_PEAK_BYTES line.

    python -m benchmarks.probes.gpu_plan_peak densenet:infer_bf16 multihead_attention:infer_bf16
"""
from __future__ import annotations

import glob
import os
import re
import sys
import tempfile


def main(argv=None) -> None:
    cases = (argv if argv is not None else sys.argv[1:]) or ["densenet:infer_bf16"]
    os.environ["SMELT_CPU_BACKEND"] = "triton"
    os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
    import torch

    import smelt  # noqa: F401
    from smelt.runtime import launcher
    from smelt.tools.model_suite import torchvision_stub
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    torchvision_stub.install_if_missing()

    class _Planned(Exception):
        pass

    def stop(*args, **kwargs):
        raise _Planned
    launcher.TritonLauncher.__call__ = stop  # a real size through the interpreter would take minutes
    for case in cases:
        model, mode = case.split(":")
        folder = tempfile.mkdtemp(prefix="smelt-plan-")
        os.environ["SMELT_DEBUG_DIR"] = folder
        torch._dynamo.reset()
        try:
            case_callable(all_specs()[model], mode, "real", "cpu", 0, "smelt")()
        except Exception as e:  # Dynamo wraps what the launch raised
            if not any(isinstance(x, _Planned) for x in (e, e.__cause__, e.__context__)):
                raise
        for wrapper in sorted(glob.glob(f"{folder}/*/wrapper.py")):
            source = open(wrapper).read()
            peak = re.search(r"PLANNED_PEAK_BYTES = .*", source)
            launches = len(re.findall(r"^    triton_\w+\(", source, re.M))
            calls = len(re.findall(r"^    \w+ = torch\.\w+\(", source, re.M))
            print(f"{case} {os.path.basename(os.path.dirname(wrapper))}: {launches} kernels, {calls} library calls; "
                  f"{peak.group(0) if peak else 'no plan'}", flush=True)


if __name__ == "__main__":
    main()

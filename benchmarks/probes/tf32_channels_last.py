"""A float32 model suite case on CUDA judged against eager with cuDNN's TF32 on (torch's default) and
off, for smelt and Inductor, then smelt with channels-last layouts off: whether a failure is cuDNN
taking TF32 algorithms for NHWC convolutions it did not take for eager's NCHW ones (tiny DenseNet on
the H200: rmse 2.29e-4 against eager's 3.03e-7 under both compilers with TF32 on; both pass with it
off, and smelt passes with SMELT_CHANNELS_LAST=0).

    python -m benchmarks.probes.tf32_channels_last densenet [--mode infer_fp32]
"""
from __future__ import annotations

import argparse
import contextlib

import torch

import smelt.config
from smelt.tools.model_suite import all_specs
from smelt.tools.model_suite import runner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--mode", default="infer_fp32")
    args = parser.parse_args()
    spec = all_specs()[args.model]
    # The suite's own check turns TF32 off; here each side's setting is the probe's.
    runner._without_tf32 = contextlib.nullcontext
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32
        for backend in ("smelt", "inductor"):
            result = runner.run_case(spec, args.mode, size="tiny", device="cuda", backend=backend)
            print(f"cudnn.allow_tf32={tf32} {backend}: {result.status} {result.message(4)}", flush=True)
    torch.backends.cudnn.allow_tf32 = True
    with smelt.config.override(channels_last="off"):
        result = runner.run_case(spec, args.mode, size="tiny", device="cuda", backend="smelt")
    print(f"cudnn.allow_tf32=True smelt, channels_last off: {result.status} {result.message(4)}")


if __name__ == "__main__":
    main()

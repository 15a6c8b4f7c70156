"""smelt's GELU kernel (BERT's, `triton_poi_fused_gelu`) against an Inductor-style one (`libdevice.erf`, no
mask), each compiled for an H100 (sm_90) without a GPU, with and without `enable_fp_fusion` (smelt's
kernels compile without it): SASS instruction counts by opcode. Needs the ptxas and nvdisasm Triton ships.

    python -m benchmarks.probes.gelu_sass
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.language.extra import libdevice


@triton.jit
def smelt_form(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tmp0 = tl.load(in_ptr0 + xindex).to(tl.float32)
    tmp5 = tmp0 * 0.5 * (1.0 + tl.erf(tmp0 * 0.7071067811865475))
    tl.store(out_ptr0 + xindex, tmp5.to(tl.bfloat16).to(tl.float32).to(tl.bfloat16))


@triton.jit
def inductor_form(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_ptr0 + xindex, None).to(tl.float32)
    tmp8 = (tmp0 * 0.5) * (libdevice.erf(tmp0 * 0.7071067811865476) + 1.0)
    tl.store(out_ptr0 + xindex, tmp8, None)


def sass_counts(fn, fp_fusion: bool) -> collections.Counter:
    source = ASTSource(fn, signature={"in_ptr0": "*bf16", "out_ptr0": "*bf16", "xnumel": "i32", "XBLOCK": "constexpr"},
                       constexprs={"XBLOCK": 1024},
                       attrs={(k,): [["tt.divisibility", 16]] for k in range(3)})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "enable_fp_fusion": fp_fusion})
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout
    return collections.Counter(op.split(".")[0] for op in re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass))


def main() -> None:
    print(f"triton {triton.__version__}, sm_90")
    for fn in (smelt_form, inductor_form):
        for fusion in (False, True):
            counts = sass_counts(fn, fusion)
            print(f"{fn.__name__:14s} enable_fp_fusion={fusion!s:5s}: {sum(counts.values())} SASS instructions, "
                  + ", ".join(f"{op} {n}" for op, n in counts.most_common(6)))


if __name__ == "__main__":
    main()

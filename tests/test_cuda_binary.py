"""smelt's own GPU compile path (smelt/runtime/cuda_binary.py), checked on the CPU: a generated
kernel compiled by Triton for an H100 (sm_90) from smelt's description of the arguments, and what
launching it will take. The launch itself runs in tests/gpu/test_native_launch.py."""
import pytest
import torch
import triton

from smelt.runtime.cuda_binary import compile_binary, describe
from smelt.runtime.triton_cubin import entry_param_count, triton_signature
from smelt.runtime.loader import load_module, source_path

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def scaled_add(in_ptr0, in_ptr1, out_ptr0, ks0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x = tl.load(in_ptr0 + xindex, xmask) * ks0 + tl.load(in_ptr1 + xindex % 7, xmask)
    tl.store(out_ptr0 + xindex, x.to(tl.bfloat16), xmask)
'''


@pytest.fixture(scope="module")
def scaled_add(tmp_path_factory):
    module = load_module(source_path(str(tmp_path_factory.mktemp("src")), "scaled_add", KERNEL))
    return module.scaled_add


def _args(offset=0, size=1000):
    storage = torch.zeros(size + 16)
    return [storage[offset:offset + size], torch.zeros(7), torch.zeros(size, dtype=torch.bfloat16), 3, size]


def test_the_signature_follows_the_arguments(scaled_add):
    signature, constants, attrs = triton_signature(scaled_add, describe(_args()), {"XBLOCK": 256})
    assert signature == {"in_ptr0": "*fp32", "in_ptr1": "*fp32", "out_ptr0": "*bf16", "ks0": "i32",
                         "xnumel": "i32", "XBLOCK": "constexpr"}
    assert constants == {(5,): 256}
    # 16-byte aligned pointers and integers divisible by 16 are promised to the compiler, others not.
    assert (0,) in attrs and (2,) in attrs and (3,) not in attrs and (4,) not in attrs
    _, _, attrs = triton_signature(scaled_add, describe(_args(offset=1, size=1008)), {"XBLOCK": 256})
    assert (0,) not in attrs and (4,) in attrs


def test_a_kernel_compiles_for_the_h100_without_a_gpu(scaled_add, tmp_path):
    spec = describe(_args())
    binary = compile_binary(scaled_add, spec, {"XBLOCK": 256}, num_warps=4, capability=(9, 0))
    assert binary.name == "scaled_add" and binary.cubin[:4] == b"\x7fELF"
    assert binary.arg_kinds == ("ptr", "ptr", "ptr", "i32", "i32") and binary.num_warps == 4
    assert binary.extra_params >= 0  # Triton's scratch pointers, passed as NULL at launch
    binary.save(str(tmp_path / "kept"))
    again = type(binary).read(str(tmp_path / "kept"))
    assert again.cubin == binary.cubin and again.extra_params == binary.extra_params


def test_a_kernel_that_does_not_compile_says_so(tmp_path):
    broken = load_module(source_path(str(tmp_path), "broken", KERNEL.replace("tl.arange(0, XBLOCK)", "tl.arange(0, 3)")))
    with pytest.raises(triton.CompilationError):
        compile_binary(broken.scaled_add, describe(_args()), {"XBLOCK": 256}, num_warps=4, capability=(9, 0))


def test_entry_parameters_are_counted_from_the_ptx():
    ptx = ".visible .entry k(\n .param .u64 .ptr .global .align 1 k_param_0,\n .param .u32 k_param_1,\n" \
          " .param .u64 .ptr .global .align 1 k_param_2\n)\n{ ld.param.b64 %rd1, [k_param_0]; }"
    assert entry_param_count(ptx, "k") == 3

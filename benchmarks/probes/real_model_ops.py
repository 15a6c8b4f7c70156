"""Ops real vision, audio and mixture-of-experts models use, beyond the fuzzer's families: each case's
values and gradients under smelt against eager's, one compile per case, on the CPU backend that
SMELT_CPU_BACKEND names.

    python -m benchmarks.probes.real_model_ops [SEED] [case,case,...]

Each case is judged by the fuzzer's accuracy rule (smelt.tools.fuzz.runner.check_fn): against eager
and a float64 run of the same function, values and input gradients.
"""
import sys

import torch
import torch.nn.functional as F

import smelt  # noqa: F401
from smelt.tools.fuzz.runner import check_fn

torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)  # the cases' random inputs

def img(n=2, c=3, h=9, w=11, cl=False):
    x = torch.randn(n, c, h, w)
    return x.contiguous(memory_format=torch.channels_last) if cl else x

CASES = {
 "interp_bilinear": lambda: (lambda x: F.interpolate(x, size=(13, 7), mode="bilinear", align_corners=False).sin(), [img()]),
 "interp_bilinear_ac": lambda: (lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=True) * 2, [img()]),
 "interp_bicubic": lambda: (lambda x: F.interpolate(x, size=(15, 10), mode="bicubic", align_corners=False), [img()]),
 "interp_nearest_exact": lambda: (lambda x: F.interpolate(x, size=(20, 5), mode="nearest-exact") + 1, [img()]),
 "interp_nearest_down": lambda: (lambda x: F.interpolate(x, size=(4, 6), mode="nearest"), [img()]),
 "interp_linear1d": lambda: (lambda x: F.interpolate(x, size=17, mode="linear"), [torch.randn(2, 3, 10)]),
 "interp_trilinear": lambda: (lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), [torch.randn(1, 2, 3, 4, 5)]),
 "interp_bilinear_cl": lambda: (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear").relu(), [img(cl=True)]),
 "adaptive_avg_odd": lambda: (lambda x: F.adaptive_avg_pool2d(x, (4, 3)), [img(h=9, w=11)]),
 "adaptive_max_odd": lambda: (lambda x: F.adaptive_max_pool2d(x, (4, 3)), [img(h=9, w=11)]),
 "avg_pool_nopad": lambda: (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [img()]),
 "avg_pool_divisor": lambda: (lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5), [img()]),
 "max_pool_dil": lambda: (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2), [img(h=12, w=12)]),
 "max_pool_ceil": lambda: (lambda x: F.max_pool2d(x, 3, 2, 0, ceil_mode=True), [img()]),
 "max_pool1d": lambda: (lambda x: F.max_pool1d(x, 3, 2, 1), [torch.randn(2, 4, 15)]),
 "avg_pool3d": lambda: (lambda x: F.avg_pool3d(x, 2), [torch.randn(1, 2, 4, 6, 4)]),
 "pixel_shuffle": lambda: (lambda x: F.pixel_shuffle(x, 2).tanh(), [img(c=8)]),
 "pixel_unshuffle": lambda: (lambda x: F.pixel_unshuffle(x, 2) * 3, [img(h=8, w=10)]),
 "unfold": lambda: (lambda x: F.unfold(x, 3, padding=1, stride=2), [img()]),
 "fold": lambda: (lambda x: F.fold(x, (6, 6), 3, padding=1), [torch.randn(2, 27, 36)]),
 "grid_sample": lambda: (lambda x, g: F.grid_sample(x, g, align_corners=False), [img(), torch.rand(2, 5, 6, 2) * 2 - 1]),
 "grid_sample_nearest": lambda: (lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border", align_corners=True), [img(), torch.rand(2, 5, 6, 2) * 2.4 - 1.2]),
 "affine_grid": lambda: (lambda t: F.affine_grid(t, (2, 3, 5, 7), align_corners=False).sum(-1), [torch.randn(2, 2, 3)]),
 "conv_transpose": lambda: (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1), [img(c=4), torch.randn(4, 5, 3, 3)]),
 "conv1d": lambda: (lambda x, w: F.conv1d(x, w, padding=2, dilation=2).relu(), [torch.randn(2, 4, 20), torch.randn(6, 4, 3)]),
 "conv_groups": lambda: (lambda x, w: F.conv2d(x, w, groups=2, stride=2), [img(c=4), torch.randn(6, 2, 3, 3)]),
 "conv_depthwise_cl": lambda: (lambda x, w: F.hardswish(F.conv2d(x, w, padding=1, groups=4)), [img(c=4, cl=True), torch.randn(4, 1, 3, 3)]),
 "embedding_pad": lambda: (lambda w, i: F.embedding(i, w, padding_idx=0).sum(1), [torch.randn(10, 6), torch.randint(0, 10, (3, 7))]),
 "embedding_bag": lambda: (lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"), [torch.randn(10, 6), torch.randint(0, 10, (12,)), torch.tensor([0, 3, 3, 8])]),
 "topk": lambda: (lambda x: x.topk(3, dim=-1).values * 2, [torch.randn(4, 9)]),
 "topk_idx_gather": lambda: (lambda x, y: y.gather(-1, x.topk(2, dim=-1).indices).sum(-1), [torch.randn(5, 8), torch.randn(5, 8)]),
 "one_hot": lambda: (lambda i, x: (F.one_hot(i, 7).float() * x).sum(0), [torch.randint(0, 7, (5,)), torch.randn(5, 7)]),
 "moe_route": lambda: (lambda x, w: torch.softmax(x @ w, -1).topk(2, -1).values.sum(), [torch.randn(6, 8), torch.randn(8, 4)]),
 "group_norm_cl": lambda: (lambda x, w, b: F.group_norm(x, 2, w, b).relu(), [img(c=4, cl=True), torch.randn(4), torch.randn(4)]),
 "instance_norm": lambda: (lambda x: F.instance_norm(x), [img(c=4)]),
 "batch_norm_train": lambda: (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [img(c=4), torch.randn(4), torch.randn(4)]),
 "local_response": lambda: (lambda x: F.local_response_norm(x, 3), [img(c=5)]),
 "glu": lambda: (lambda x: F.glu(x, -1), [torch.randn(3, 8)]),
 "mish_selu": lambda: (lambda x: F.mish(x) + F.selu(x) + F.celu(x), [torch.randn(5, 6)]),
 "logsigmoid": lambda: (lambda x: F.logsigmoid(x * 30), [torch.randn(5, 6)]),
 "hardsigmoid": lambda: (lambda x: F.hardsigmoid(x * 4) * F.hardswish(x * 4), [torch.randn(5, 6)]),
 "pad_reflect": lambda: (lambda x: F.pad(x, (2, 1, 1, 3), mode="reflect"), [img()]),
 "pad_replicate": lambda: (lambda x: F.pad(x, (2, 1, 1, 3), mode="replicate"), [img()]),
 "pad_circular": lambda: (lambda x: F.pad(x, (2, 1, 1, 2), mode="circular"), [img()]),
 "cross_entropy_ls": lambda: (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=2), [torch.randn(6, 5), torch.randint(0, 5, (6,))]),
 "nll_weight": lambda: (lambda x, t: F.nll_loss(F.log_softmax(x, -1), t, weight=torch.linspace(0.5, 2, 5)), [torch.randn(6, 5), torch.randint(0, 5, (6,))]),
 "bce_logits": lambda: (lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=torch.full((4,), 2.0)), [torch.randn(3, 4), torch.rand(3, 4)]),
 "smooth_l1": lambda: (lambda x, t: F.smooth_l1_loss(x, t, beta=0.5) + F.huber_loss(x, t), [torch.randn(3, 4), torch.randn(3, 4)]),
 "kl_div": lambda: (lambda x, t: F.kl_div(F.log_softmax(x, -1), F.softmax(t, -1), reduction="batchmean"), [torch.randn(3, 4), torch.randn(3, 4)]),
 "cosine_sim": lambda: (lambda x, y: F.cosine_similarity(x, y, dim=-1), [torch.randn(4, 6), torch.randn(4, 6)]),
 "normalize": lambda: (lambda x: F.normalize(x, dim=1), [img()]),
 "cdist": lambda: (lambda x, y: torch.cdist(x, y), [torch.randn(5, 3), torch.randn(4, 3)]),
 "stft_like_unfold": lambda: (lambda x: x.unfold(-1, 4, 2).mean(-1), [torch.randn(3, 17)]),
 "diff_cumsum": lambda: (lambda x: torch.diff(x.cumsum(-1), dim=-1), [torch.randn(3, 9)]),
 "masked_scatter": lambda: (lambda x, m, s: x.masked_scatter(m, s), [torch.randn(4, 5), torch.rand(4, 5) > 0.5, torch.randn(20)]),
 "index_put_2d": lambda: (lambda x, v: x.index_put((torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1])), v, accumulate=True), [torch.randn(3, 4), torch.randn(3)]),
 "scatter_reduce": lambda: (lambda x, s: x.scatter_reduce(0, torch.tensor([[0, 1], [0, 1], [2, 0]]), s, "amax", include_self=False), [torch.randn(3, 2), torch.randn(3, 2)]),
 "rot_half": lambda: (lambda x, c, s: x * c + torch.cat((-x[..., 2:], x[..., :2]), -1) * s, [torch.randn(2, 3, 4), torch.randn(3, 4), torch.randn(3, 4)]),
 "bucketize": lambda: (lambda x, b: torch.bucketize(x, b).float() * x, [torch.randn(4, 5), torch.tensor([-1.0, 0.0, 0.5, 2.0])]),
 "searchsorted": lambda: (lambda s, v: torch.searchsorted(s, v).float() + v, [torch.sort(torch.randn(3, 6), -1).values, torch.randn(3, 4)]),
 "nan_to_num": lambda: (lambda x: torch.nan_to_num(torch.log(x), nan=0.0, neginf=-5.0), [torch.randn(4, 5)]),
 "clamp_tensor": lambda: (lambda x, lo, hi: torch.clamp(x, lo, hi), [torch.randn(4, 5), torch.randn(5) - 1, torch.randn(4, 1) + 1]),
 "atan2_pow": lambda: (lambda x, y: torch.atan2(x, y) + torch.pow(x.abs() + 0.1, y), [torch.randn(4, 5), torch.randn(4, 5)]),
 "std_unbiased": lambda: (lambda x: x.std(dim=(0, 2), keepdim=True) + x.var(1, correction=0).sum(), [torch.randn(3, 4, 5)]),
 "median": lambda: (lambda x: x.median(dim=-1).values, [torch.randn(4, 7)]),
 "logit_xlogy": lambda: (lambda x: torch.logit(x, eps=1e-3) + torch.xlogy(x, x + 0.5), [torch.rand(4, 5)]),
 "complex_free_rfft_mag": lambda: (lambda x: torch.fft.rfft(x).abs(), [torch.randn(3, 16)]),
 "einsum": lambda: (lambda a, b: torch.einsum("bij,bjk->bik", a, b).relu(), [torch.randn(2, 3, 4), torch.randn(2, 4, 5)]),
 "baddbmm": lambda: (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), [torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)]),
 "tril_mask_fill": lambda: (lambda x: x.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf")).softmax(-1), [torch.randn(2, 5, 5)]),
 "argsort": lambda: (lambda x: x.gather(-1, x.argsort(-1, descending=True)), [torch.randn(3, 6)]),
 "repeat_interleave": lambda: (lambda x: x.repeat_interleave(2, dim=1) * 1.5, [torch.randn(3, 4)]),
 "expand_copy_strided": lambda: (lambda x: x.t().contiguous().view(-1)[::3], [torch.randn(6, 5)]),
}

def main() -> None:
    wanted = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
    failed = []
    for name in wanted:
        fn, inputs = CASES[name]()
        inputs = [t.requires_grad_(t.is_floating_point()) for t in inputs]
        # The fuzzer's judge: smelt against eager and a float64 run, values and input gradients.
        problems = check_fn(lambda *args: (fn(*args),), inputs, backward=True)
        print(f"{name}: {'ok' if not problems else 'FAIL ' + problems[0][:300]}", flush=True)
        if problems:
            failed.append(name)
    print("failed:", failed)


if __name__ == "__main__":
    main()

"""Programs that write into their inputs (lowering/input_writes.py): each write reads the inputs'
contents as the program had them at that point, whatever order smelt's kernels run the writes in.
Sizes span several programs of a kernel (a read of another program's elements shows)."""
import pytest
import torch

N = 5000


def _mul_then_add(a, b):  # b's update reads a's new value, computed again from the old one
    a.mul_(0.5)
    b.add_(a)


def _add_then_mul(a, b):
    b.add_(a)
    a.mul_(0.5)


def _swap(a, b):
    t = a.clone()
    a.copy_(b)
    b.copy_(t)


def _rotate(a, b, c):
    t = a.clone()
    a.copy_(b)
    b.copy_(c)
    c.copy_(t)


def _flip_in_place(a):  # each element from another program's
    a.copy_(a.flip(0))


def _shift_in_place(a):
    a[1:] = a[:-1].clone()


def _transpose_in_place(m):  # eager refuses m.copy_(m.t()): the clone's reads are of the old contents
    m.copy_(m.t().clone())


def _clip_then_step(g, p):  # grad clipping in place, then an update that reads the clipped grad
    g.mul_(1.0 / (g.norm() + 1e-6))
    p.add_(g, alpha=-0.1)
    g.zero_()


def _normalize_then_add(a, b):
    a.div_(a.abs().sum())
    b.add_(a)


def _updates_then_rate(p0, g0, p1, g1, lr):  # the rate halved after the updates that read it
    p0.sub_(g0 * lr)
    p1.sub_(g1 * lr)
    lr.mul_(0.5)


CASES = {
    "mul_then_add": (_mul_then_add, [(N,), (N,)]),
    "add_then_mul": (_add_then_mul, [(N,), (N,)]),
    "swap": (_swap, [(N,), (N,)]),
    "rotate": (_rotate, [(N,), (N,), (N,)]),
    "flip_in_place": (_flip_in_place, [(N,)]),
    "shift_in_place": (_shift_in_place, [(N,)]),
    "transpose_in_place": (_transpose_in_place, [(96, 96)]),
    "clip_then_step": (_clip_then_step, [(N,), (N,)]),
    "normalize_then_add": (_normalize_then_add, [(N,), (N,)]),
    "updates_then_rate": (_updates_then_rate, [(N,), (N,), (N,), (N,), ()]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_writes_into_inputs_read_the_contents_eager_reads(compile_fn, device, case):
    fn, shapes = CASES[case]
    torch.manual_seed(0)
    # A 0-d input stays on the CPU, as a learning rate passed as a tensor does.
    expected = [torch.randn(s, device=device if s else "cpu") for s in shapes]
    actual = [x.clone() for x in expected]
    compiled = compile_fn(fn)
    for _ in range(2):  # the second call on what the first left
        fn(*expected)
        compiled(*actual)
        for k, (a, e) in enumerate(zip(actual, expected)):
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6, msg=lambda m, k=k: f"input {k}: {m}")


def test_a_value_reading_an_input_through_an_aten_view(compile_fn, device):
    # z.real of a complex input is a view ATen makes (smelt has no lowering for it): b's write reads
    # z through it, so it runs before z's, which comes first among the graph's inputs here.
    def fn(z, b):
        out = z.abs()
        b.add_(z.real)
        z.mul_(2)
        return out
    torch.manual_seed(0)
    expected = [torch.randn(N, dtype=torch.complex64, device=device), torch.randn(N, device=device)]
    actual = [x.clone() for x in expected]
    fn(*expected)
    compile_fn(fn)(*actual)
    torch.testing.assert_close(actual, expected)

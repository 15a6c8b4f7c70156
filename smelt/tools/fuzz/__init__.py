"""A differential fuzzer: random small programs of ATen-level torch ops, run eagerly, in float64 and
through smelt, judged by smelt's accuracy rule (smelt/tools/accuracy.py).

    python -m smelt.tools.fuzz --count 200 --seed 0 [--device cpu] [--no-backward] [--out findings.md]

- program.py: a program (inputs, ops, outputs) that prints as Python source someone can paste
- inputs.py: how an input is made (dtype, layout, index ranges), reproducibly from a seed
- ops.py: the op families the generator draws from
- generator.py: builds a program op by op, keeping only ops eager accepts
- runner.py: eager vs float64 vs torch.compile(backend="smelt"), forward and backward
- shrinker.py: makes a failing program smaller while it fails the same way
- cli.py: the command line
"""

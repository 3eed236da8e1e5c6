#!/usr/bin/env python3
"""Which kernels differ between two PTX files of the same .cu source (e.g. before and after a
refactoring that must not change device code).

  nvcc -ptx -arch=sm_90 -O3 -std=c++17 -Xcompiler -fPIC --expt-relaxed-constexpr \
       -Icustom_ops/include -Icustom_ops/core custom_ops/core/joint_cuda.cu -o after.ptx
  python custom_ops/tests/ptx_compare.py before.ptx after.ptx

Symbols are demangled (c++filt) with the per-file anonymous-namespace hash dropped and
`tf_rnnt::Activation` spelled `int`, and basic-block labels are numbered per kernel, so a kernel
counts as changed only where its instructions changed. Exit status 1 if any kernel differs.
"""

import re
import subprocess
import sys


def kernels(path):
    """{demangled kernel name: canonical PTX body}."""
    text = open(path).read()
    symbols = sorted(set(re.findall(r"_ZZ?N\w+", text)), key=len, reverse=True)
    demangled = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True,
                               text=True, check=True).stdout.split("\n")
    for symbol, name in zip(symbols, demangled):
        name = name.replace("(anonymous namespace)::", "").replace("tf_rnnt::Activation", "int")
        text = text.replace(symbol, "<" + re.sub(r"\s+", "", name) + ">")
    out = {}
    for block in re.split(r"\n(?=\.(?:visible )?\.?entry )", text):
        match = re.match(r"(?:\.visible )?\.?entry <(.*)>\(", block)
        if match:
            out[match.group(1)] = re.sub(r"\$L__BB\d+_", "$L__BB_", block)
    return out


def main(before_path, after_path):
    before, after = kernels(before_path), kernels(after_path)
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    for title, names in (("only before", sorted(before.keys() - after.keys())),
                         ("only after", sorted(after.keys() - before.keys())),
                         ("changed", changed)):
        for name in names:
            print(f"{title}: {name}")
    same = len(before.keys() & after.keys()) - len(changed)
    print(f"{same} of {len(before)} kernels identical")
    return 0 if same == len(before) == len(after) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

"""Checks that every spin loop of the device ring kernel keeps its system-scope acquire load inside the loop.

A spin loop is a backward branch whose body [target, branch] holds a NANOSLEEP (the wait's back-off,
csrc/device/ring_proto.h); it passes when that body also holds a 64-bit strong system-scope load
(LD/LDG ... .64 ... STRONG.SYS: the head or tail word; the abort word and the status claim are 32-bit).
Usage: python sass_check.py FILE.cubin|FILE.o ...   (exit 0: every spin loop of every kernel passes)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRA = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")
FLAG_LOAD = re.compile(r"\bLDG?\.[A-Z0-9.]*64[A-Z0-9.]*STRONG\.SYS\b|\bLDG?\.[A-Z0-9.]*STRONG\.SYS[A-Z0-9.]*\.64\b")


def tool(name):
    """cuobjdump / nvdisasm: from the toolkit, or from the pip packages nvidia-cuda-cuobjdump and
    nvidia-cuda-nvdisasm (the test extra)."""
    for d in [Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" /
              "nvidia" / "cu13" / "bin", Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin"]:
        if (d / name).exists():
            return d / name
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return Path(found)


def sass(path):
    cuobjdump = tool("cuobjdump")
    env = dict(os.environ, PATH=f"{tool('nvdisasm').parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(cuobjdump), "-sass", str(path)], check=True, capture_output=True, text=True,
                          env=env).stdout


def functions(text):
    """{(arch, name): [(address, instruction)]}"""
    out, key, arch = {}, None, "?"
    for line in text.splitlines():
        m = re.search(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function : (\S+)", line)
        if m:
            key = (arch, m.group(1))
            out[key] = []
            continue
        m = INSN.search(line)
        if m and key:
            out[key].append((int(m.group(1), 16), m.group(2)))
    return out


def spin_loops(insns):
    """[(start, end, has_flag_load)] for each backward branch whose body holds a NANOSLEEP."""
    loops = []
    for addr, ins in insns:
        m = BRA.search(ins)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target > addr:
            continue
        body = [i for a, i in insns if target <= a <= addr]
        if any("NANOSLEEP" in i for i in body):
            loops.append((target, addr, any(FLAG_LOAD.search(i) for i in body)))
    return loops


def check(paths):
    """(number of kernels, number of spin loops, failures)"""
    kernels, nloops, fails = 0, 0, []
    for p in paths:
        for (arch, name), insns in functions(sass(p)).items():
            if "ring_kernel" not in name:
                continue
            kernels += 1
            loops = spin_loops(insns)
            nloops += len(loops)
            if not loops:
                fails.append(f"{arch} {name}: no spin loop found")
            for start, end, ok in loops:
                if not ok:
                    fails.append(f"{arch} {name}: spin loop {start:#x}-{end:#x} has no system-scope 64-bit load")
    return kernels, nloops, fails


if __name__ == "__main__":
    k, n, f = check(sys.argv[1:])
    print(f"kernels={k} spin_loops={n} failures={len(f)}")
    for x in f[:20]:
        print(x)
    sys.exit(0 if k and not f else 1)

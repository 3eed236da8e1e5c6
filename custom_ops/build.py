#!/usr/bin/env python3
"""Builds tf_rnnt's op library against the installed TensorFlow.

  python custom_ops/build.py [--out tf_rnnt/_tf_rnnt_ops.so]
  python custom_ops/build.py --tests   # build/tests/core_test: the core's tests, no TensorFlow
                                       # (and, with CUDA, build/tests/joint_timing)

CPU kernels always; CUDA kernels too when nvcc is found (CUDA_HOME/bin or PATH), unless
TF_RNNT_WITH_CUDA=0. XLA kernels (custom_ops/tf/xla_lowering.cc, xla_handlers.cc) when this
TensorFlow ships the XLA FFI headers and exports XLA_FFI_GetApi (TensorFlow 2.21: yes; 2.17:
no), unless TF_RNNT_WITH_XLA=0. TF_RNNT_CUDA_ARCHS (default "80;86;89;90") lists the SM
architectures; PTX for the newest is embedded too. cudart is linked statically (it then loads
under both `tensorflow` and `tensorflow-cpu`); cuBLAS is not linked: the op uses the one
TensorFlow loaded. Only the glue files (custom_ops/tf) see TensorFlow headers, to keep the
build short.

Host code targets a portable CPU baseline (x86-64-v2 with AVX on x86_64: TensorFlow's own x86
wheels need AVX); TF_RNNT_CPU_FLAGS replaces it, e.g. TF_RNNT_CPU_FLAGS="-march=native" for a
build that only runs on this machine's CPU type.
Writes _build_info.json next to the library: what tf_rnnt.build_info() reports.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "custom_ops")
DEFAULT_ARCHS = "80;86;89;90"


def find_nvcc():
    if os.environ.get("TF_RNNT_WITH_CUDA", "1") == "0":
        return None
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        return os.path.join(cuda_home, "bin", "nvcc")
    return shutil.which("nvcc")


def find_cuda_home(nvcc):
    """The toolkit root holding include/cuda_runtime.h (nvcc may be a wrapper script)."""
    for home in (
        os.environ.get("CUDA_HOME"),
        os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
        "/usr/local/cuda",
    ):
        if home and os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    raise RuntimeError(f"found {nvcc} but no CUDA toolkit headers; set CUDA_HOME")


def cpu_flags():
    """Instruction-set flags for host code: TF_RNNT_CPU_FLAGS, else a portable baseline."""
    if "TF_RNNT_CPU_FLAGS" in os.environ:
        return os.environ["TF_RNNT_CPU_FLAGS"].split()
    return ["-march=x86-64-v2", "-mavx", "-mtune=generic"] if platform.machine() == "x86_64" else []


def cuda_archs():
    return [
        a
        for a in os.environ.get("TF_RNNT_CUDA_ARCHS", DEFAULT_ARCHS).replace(",", ";").split(";")
        if a
    ]


def tool_version(cmd):
    """First line of `cmd --version` (for nvcc the `release ...` line), or None."""
    try:
        text = subprocess.run([cmd, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    release = [line for line in lines if "release" in line]
    return (release + lines + [None])[0]


def write_build_info(lib_dir, tf_version, nvcc, archs, cxx, host_flags, xla):
    """Records what the library was built with and for; tf_rnnt.build_info() returns it."""
    info = {
        "tensorflow": tf_version,
        "cuda": bool(nvcc),
        "cuda_archs": [f"sm_{a}" for a in archs] if nvcc else [],
        "cuda_ptx": f"compute_{archs[-1]}" if nvcc else None,
        "cuda_version": None,
        "cudart": "static" if nvcc else None,
        "nvcc": tool_version(nvcc) if nvcc else None,
        "cxx": cxx,
        "cxx_version": tool_version(cxx),
        "cpu_flags": host_flags,
        "platform": f"{platform.system().lower()}_{platform.machine()}",
        "xla": bool(xla),
    }
    if nvcc and info["nvcc"] and "release" in info["nvcc"]:
        # "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0.88"
        info["cuda_version"] = info["nvcc"].rsplit("V", 1)[-1]
    with open(os.path.join(lib_dir, "_build_info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    return info


def tf_flags():
    import tensorflow as tf  # deferred so --help works without TensorFlow

    return tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags(), tf.__version__


def xla_supported(tf_dir, tf_include):
    """True when this TensorFlow lets an op library add XLA kernels with FFI custom calls."""
    if os.environ.get("TF_RNNT_WITH_XLA", "1") == "0":
        return False
    headers = ("xla/ffi/api/ffi.h", "tensorflow/compiler/tf2xla/xla_op_kernel.h",
               "external/highwayhash/highwayhash/arch_specific.h")
    if not all(os.path.exists(os.path.join(tf_include, h)) for h in headers):
        return False
    import ctypes

    try:
        framework = ctypes.CDLL(os.path.join(tf_dir, "libtensorflow_framework.so.2"))
        framework.XLA_FFI_GetApi  # noqa: B018 (raises AttributeError when not exported)
    except (OSError, AttributeError):
        return False
    return os.path.exists(os.path.join(tf_dir, "libtensorflow_cc.so.2"))


def run(cmd):
    print(" ".join(cmd), flush=True)
    subprocess.check_call(cmd)


def build(out, jobs, tests=False):
    compile_flags, link_flags, tf_version = tf_flags()
    tf_include = [f[2:] for f in compile_flags if f.startswith("-I")][0]
    nvcc = find_nvcc()
    cuda_home = find_cuda_home(nvcc) if nvcc else None
    host_flags = cpu_flags()
    obj_dir = os.path.join(
        ROOT,
        "build",
        "obj-"
        + hashlib.sha1(
            (tf_version + str(nvcc) + sys.version + " ".join(host_flags + cuda_archs())).encode()
        ).hexdigest()[:10],
    )
    os.makedirs(obj_dir, exist_ok=True)
    include = ["-I" + os.path.join(SRC, "include"), "-I" + os.path.join(SRC, "core")]
    cxx = os.environ.get("CXX", "g++")
    base = [
        "-O3",
        "-std=c++17",
        "-fPIC",
        *host_flags,
        "-Wall",
        "-Wno-sign-compare",
        "-Wno-deprecated-declarations",
        "-Wno-unused-function",
        "-Wno-interference-size",
    ] + include
    core_flags = base + ["-I" + tf_include, "-DEIGEN_MAX_ALIGN_BYTES=64"]
    glue_flags = base + [f for f in compile_flags if f != "--std=c++17"] + ["-std=c++17"]
    jobs_list = []
    objects = []

    def add(src, cmd_fn):
        obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
        objects.append(obj)
        deps = [src] + [
            os.path.join(d, f)
            for d in (
                os.path.join(SRC, "include", "tf_rnnt"),
                os.path.join(SRC, "core"),
                os.path.join(SRC, "tf"),
            )
            for f in os.listdir(d)
            if f.endswith((".h", ".cuh"))
        ]
        if not os.path.exists(obj) or os.path.getmtime(obj) < max(map(os.path.getmtime, deps)):
            jobs_list.append(cmd_fn(src, obj))

    cuda_defs = []
    if nvcc:
        cuda_include = "-I" + os.path.join(cuda_home, "include")
        cuda_defs = ["-DTF_RNNT_WITH_CUDA=1", cuda_include]
        archs = cuda_archs()
        gencode = []
        for a in archs:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        gencode += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
        # The Hopper fused tile kernels use wgmma, which only sm_90a machine code has; without 90
        # in the list they compile empty and the cuBLAS path runs everywhere.
        sm90a = ["-DTF_RNNT_FUSED_SM90A=1"] if "90" in archs else []
        for f in ("lattice_cuda.cu", "joint_cuda.cu", "joint_fused.cu", "tdt_lattice_cuda.cu"):
            add(os.path.join(SRC, "core", f), lambda s, o: [
                nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
                *include, *gencode, *sm90a, "-c", s, "-o", o])
        if sm90a:
            fused_code = ["-gencode", "arch=compute_90a,code=sm_90a", *sm90a]
        else:
            fused_code = ["-gencode", f"arch=compute_{archs[0]},code=sm_{archs[0]}",
                          "-diag-suppress=177"]  # the unused device helpers
        add(os.path.join(SRC, "core", "joint_fused_sm90.cu"), lambda s, o: [
            nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
            *include, *fused_code, "-c", s, "-o", o])
        for f in ("cublas_loader.cc", "upload_cuda.cc"):
            add(os.path.join(SRC, "core", f),
                lambda s, o: [cxx, *base, cuda_include, "-c", s, "-o", o])
    core_files = ["lattice_cpu.cc", "joint_cpu.cc", "joint_plan.cc", "tdt_lattice_cpu.cc"]
    core_files += [] if nvcc else ["cuda_unavailable.cc"]
    for f in core_files:
        add(os.path.join(SRC, "core", f), lambda s, o: [cxx, *core_flags, "-c", s, "-o", o])
    if tests:
        return build_core_test(add, objects, jobs_list, jobs, cxx, core_flags, cuda_defs,
                               nvcc and cuda_home, include)
    for f in ("ops.cc", "kernels.cc", "tdt_ops.cc", "check_op.cc"):
        add(
            os.path.join(SRC, "tf", f),
            lambda s, o: [cxx, *glue_flags, *cuda_defs, "-c", s, "-o", o],
        )
    tf_dir = os.path.dirname(tf_include)
    with_xla = xla_supported(tf_dir, tf_include)
    if with_xla:
        xla_include = ["-I" + os.path.join(tf_include, "external", "highwayhash"),
                       "-I" + os.path.join(SRC, "include", "xla_compat")]
        for f in ("xla_lowering.cc", "xla_handlers.cc", "tdt_xla.cc", "check_xla.cc"):
            add(os.path.join(SRC, "tf", f),
                lambda s, o: [cxx, *glue_flags, *xla_include, *cuda_defs, "-c", s, "-o", o])

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(run, cmd) for cmd in jobs_list]:
            future.result()
    libs = link_flags + ["-ldl", "-lpthread"]
    if with_xla:
        libs += ["-L" + tf_dir, "-l:libtensorflow_cc.so.2"]
    if nvcc:
        libs += ["-L" + os.path.join(cuda_home, "lib64"), "-l:libcudart_static.a", "-lrt"]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    # GNU ld / lld on Linux: every tf_rnnt symbol must resolve inside the library or TensorFlow's
    # libtensorflow_framework (a missing one fails here, not at load time). Other linkers lack
    # the flag.
    strict = ["-Wl,--no-undefined"] if sys.platform.startswith("linux") else []
    run([cxx, "-shared", "-o", tmp, *objects, *libs, "-Wl,-O1", *strict])
    os.replace(tmp, out)
    write_build_info(os.path.dirname(out), tf_version, nvcc, cuda_archs() if nvcc else [], cxx,
                     host_flags, with_xla)
    print(f"built {out} (TensorFlow {tf_version}, CUDA {'on' if nvcc else 'off'}, "
          f"XLA kernels {'on' if with_xla else 'off'})")


def build_core_test(add, objects, jobs_list, jobs, cxx, core_flags, cuda_defs, cuda_home, include):
    """Links custom_ops/tests/core_test*.{cc,cu} with the core's objects into build/tests/core_test
    (the GPU half when CUDA is built)."""
    tests_dir = os.path.join(SRC, "tests")
    test_include = "-I" + tests_dir
    core_objects = list(objects)
    add(os.path.join(tests_dir, "core_test.cc"),
        lambda s, o: [cxx, *core_flags, *cuda_defs, test_include, "-c", s, "-o", o])
    if cuda_home:
        nvcc = find_nvcc()
        add(os.path.join(tests_dir, "core_test_gpu.cu"), lambda s, o: [
            nvcc, "-O2", "-std=c++17", "-Xcompiler", "-fPIC", *include, test_include,
            "-c", s, "-o", o])  # host code only: no architecture to choose
        add(os.path.join(tests_dir, "joint_timing.cc"),
            lambda s, o: [cxx, *core_flags, *cuda_defs, "-c", s, "-o", o])
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(run, cmd) for cmd in jobs_list]:
            future.result()
    out = os.path.join(ROOT, "build", "tests", "core_test")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    libs = ["-ldl", "-lpthread"]
    if cuda_home:
        libs += ["-L" + os.path.join(cuda_home, "lib64"), "-l:libcudart_static.a", "-lrt"]
    timing = os.path.join(os.path.dirname(out), "joint_timing")
    timing_obj = [o for o in objects if o.endswith("joint_timing.cc.o")]
    run([cxx, "-o", out, *[o for o in objects if o not in timing_obj], *libs])
    print(f"built {out}")
    if timing_obj:  # the CUDA launchers timed without TensorFlow
        run([cxx, "-o", timing, *core_objects, *timing_obj, *libs])
        print(f"built {timing}")
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.path.join(ROOT, "tf_rnnt", "_tf_rnnt_ops.so"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--tests",
        action="store_true",
        help="build the core test program build/tests/core_test instead of the library",
    )
    args = parser.parse_args()
    build(os.path.abspath(args.out), args.jobs, tests=args.tests)


if __name__ == "__main__":
    main()

"""Build of the baracuda_ops extension (`baracuda_ops._C`).

CPU kernels always build. CUDA kernels build when the installed torch has CUDA
(`torch.version.cuda`) and nvcc is found through CUDA_HOME, unless
BARACUDA_FORCE_CPU=1. TORCH_CUDA_ARCH_LIST (default "9.0") and MAX_JOBS are
honoured. Install with `pip install --no-build-isolation .` (or `-e .`) so the
build uses the torch that is already installed; the package then requires that
torch's minor release (torch==X.Y.*), the only one its compiled code links with.
"""

import glob
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    if os.environ.get("BARACUDA_FORCE_CPU", "0") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def _openmp_flags() -> list[str]:
    """["-fopenmp"] when the C++ compiler (CXX, else c++) builds and links an OpenMP
    program. ATen's at::parallel_for, inlined into our CPU kernels, spreads its loop
    over ATen's OpenMP threads only in code compiled with OpenMP; without it the loop
    runs on one thread. At run time the extension shares torch's libgomp (same soname)."""
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.cpp")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        try:
            probe = subprocess.run(cxx + ["-fopenmp", src, "-o", os.path.join(tmp, "omp")], capture_output=True)
            ok = probe.returncode == 0
        except OSError:  # no such compiler: the build proper will say so
            ok = False
    if not ok:
        print("baracuda_ops: the C++ compiler does not take -fopenmp; CPU kernels will run on one thread")
        return []
    return ["-fopenmp"]


def _extension():
    with_cuda = _want_cuda()
    sources = [os.path.join("csrc", "registration.cpp")] + sorted(
        glob.glob(os.path.join("csrc", "cpu", "*.cpp")) + glob.glob(os.path.join("csrc", "autograd", "*.cpp")))
    include_dirs = [os.path.join(ROOT, "csrc", "include")]
    define_macros: list = []
    openmp = _openmp_flags()
    # -ffp-contract=off: no multiply-add is fused, so the CPU loops built again for AVX2
    # and AVX-512 (cpu::run_vectorized) give the baseline build's bits
    cxx_flags = ["-O3", "-ffp-contract=off"] + openmp
    if not with_cuda:
        return CppExtension(
            "baracuda_ops._C",
            sources,
            include_dirs=include_dirs,
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=openmp,
        )

    archs = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    sources += sorted(glob.glob(os.path.join("csrc", "cuda", "**", "*.cu"), recursive=True))
    # CUDA 13 wheels keep cusparse.h etc. under site-packages/nvidia/cu13/include,
    # which ATen/cuda/CUDAContext.h needs.
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        extra = os.path.join(site, "nvidia", "cu13", "include")
        if os.path.isdir(extra):
            include_dirs.append(extra)
    define_macros += [
        ("BARACUDA_WITH_CUDA", "1"),
        ("BARACUDA_CUDA_ARCHS", '"' + archs + '"'),
    ]
    return CUDAExtension(
        "baracuda_ops._C",
        sources,
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_compile_args={
            "cxx": cxx_flags,
            "nvcc": ["-O3", "-lineinfo", "--expt-relaxed-constexpr"],
        },
        extra_link_args=openmp,
    )


def _torch_requirement() -> str:
    """torch==X.Y.* of the torch this build compiles against: the C++ ABI of
    torch's libraries is kept within a minor release only."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


if sys.version_info < (3, 10):
    raise RuntimeError("baracuda_ops needs Python >= 3.10")

setup(
    install_requires=[_torch_requirement()],
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)

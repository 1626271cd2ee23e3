"""Shared by the PyTorch peers (bench/peers/*.py): the environment line every peer prints
(the C++ benchmark relays it beside its own, bench_support.hpp) and the median with its
spread. The BLAS is the library actually loaded in this process (PyTorch 1.13 from Debian
links the system's libblas.so.3, an alternative that is OpenBLAS here), asked for its core
type through ctypes, as Phalanx asks OpenBLAS for its own."""
import ctypes
import os
import statistics

import torch


def blas():
    """'OpenBLAS 0.3.21 ... (core: Haswell)' for the BLAS mapped into this process."""
    try:
        torch.ones(8, 8) @ torch.ones(8, 8)  # BLAS is loaded lazily on some builds
        libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "blas" in line.lower()})
    except OSError:
        libs = []
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            config, core = lib.openblas_get_config, lib.openblas_get_corename
            config.restype = core.restype = ctypes.c_char_p
            return f"{config().decode()} (core: {core().decode()})"
        except (OSError, AttributeError):
            continue
    build = [s for s in torch.__config__.show().replace(",", "\n").split("\n") if "BLAS_INFO" in s]
    return (", ".join(os.path.basename(p) for p in libs) or "not loaded") + (f" ({build[0].strip()})" if build else "")


def environment():
    """The peer's line: PyTorch's version, its BLAS and core, its thread counts."""
    def var(name):
        return f"{name}={os.environ.get(name, 'unset')}"
    return (f"# peer: PyTorch {torch.__version__}; BLAS {blas()}; threads: torch {torch.get_num_threads()} "
            f"(interop {torch.get_num_interop_threads()}), {var('OPENBLAS_NUM_THREADS')}, {var('OMP_NUM_THREADS')}")


def print_environment():
    print(environment(), flush=True)


def summary(samples):
    """(median, fastest, slowest) of a list of run times."""
    return statistics.median(samples), min(samples), max(samples)

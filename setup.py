"""The compiled parts; everything else about the package is in pyproject.toml.

* the relay data plane's common cases (services/relay/_fastpath.c);
* two per-frame loops of the transceiver's media path (shared/_speedups.c: WebSocket
  masking and the quiet check; shared/speedups.py has numpy's versions for a build without);
* RNNoise for the transceiver's noise suppression (services/transceiver/media/rnnoise/, BSD-3,
  vendored: its README.firsthop says from where and what was added).

All are optional: where no C compiler or Python headers are found the build goes on without
them; the relay then runs its Python loop (it logs which; docs/capacity.md has both costs), the
per-frame loops are numpy's, and noise suppression is unavailable (a call that asks for it goes
on without it: logged and counted, `noise_reduction_unavailable`).
"""

import glob
import platform

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

RNNOISE = "services/transceiver/media/rnnoise"
RNNOISE_SOURCES = [
    f"{RNNOISE}/src/{name}.c"
    for name in (
        "denoise",
        "rnn",
        "pitch",
        "kiss_fft",
        "celt_lpc",
        "nnet",
        "nnet_default",
        "parse_lpcnet_weights",
        "rnnoise_tables",
        "rnnoise_data",
    )
] + [f"{RNNOISE}/firsthop.c"]


class MixedExtension(Extension):
    """An extension some of whose sources need flags of their own (`per_file`: source → extra
    compiler flags), as RNNoise's SIMD kernels do: compiled first, then linked in."""

    def __init__(self, *args, per_file=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.per_file = dict(per_file or {})


class BuildExt(build_ext):
    def build_extension(self, ext):
        per_file = getattr(ext, "per_file", {})
        objects = []
        for source, flags in per_file.items():
            objects += self.compiler.compile(
                [source],
                output_dir=self.build_temp,
                macros=ext.define_macros,
                include_dirs=ext.include_dirs,
                extra_postargs=ext.extra_compile_args + flags,
                depends=ext.depends,
            )
        given = ext.extra_objects
        ext.extra_objects = given + objects  # this build's objects only, never a past build's
        try:
            super().build_extension(ext)
        finally:
            ext.extra_objects = given


def rnnoise() -> Extension:
    macros = [("USE_WEIGHTS_FILE", "1"), ("RNNOISE_EXPORT", "")]
    per_file = {}
    if platform.machine().lower() in ("x86_64", "amd64"):
        # Upstream's run-time dispatch: one build, the fastest kernels the CPU has.
        macros += [("RNN_ENABLE_X86_RTCD", "1"), ("CPU_INFO_BY_ASM", "1")]
        per_file = {
            f"{RNNOISE}/src/x86/x86cpu.c": [],
            f"{RNNOISE}/src/x86/x86_dnn_map.c": [
                "-DOPUS_X86_MAY_HAVE_SSE4_1",
                "-DOPUS_X86_MAY_HAVE_AVX2",
            ],
            f"{RNNOISE}/src/x86/nnet_sse4_1.c": ["-msse4.1"],
            f"{RNNOISE}/src/x86/nnet_avx2.c": ["-mavx", "-mfma", "-mavx2"],
        }
    headers = glob.glob(f"{RNNOISE}/include/*.h") + glob.glob(
        f"{RNNOISE}/src/**/*.h", recursive=True
    )
    return MixedExtension(
        "firsthop.services.transceiver.media._rnnoise",
        RNNOISE_SOURCES,
        depends=sorted(headers) + sorted(per_file),  # a change to any of them relinks
        include_dirs=[f"{RNNOISE}/include", f"{RNNOISE}/src"],
        define_macros=macros,
        # -fno-wrapv undoes Python's own -fwrapv, which RNNoise does not need and which costs it
        # ~15 % (loops the compiler may no longer vectorise); -fopenmp-simd: only the `omp simd`
        # loops (pitch.h's sums) are vectorised, no OpenMP
        extra_compile_args=["-O3", "-fno-wrapv", "-fopenmp-simd", "-fvisibility=hidden", "-w"],
        libraries=["m"],
        per_file=per_file,
        optional=True,
    )


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "firsthop.services.relay._fastpath",
            ["services/relay/_fastpath.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"],
            optional=True,
        ),
        Extension(
            "firsthop.shared._speedups",
            ["shared/_speedups.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"],
            optional=True,
        ),
        rnnoise(),
    ],
)

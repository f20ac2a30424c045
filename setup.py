"""The one compiled part: the relay data plane's common cases (services/relay/_fastpath.c).

Optional: where no C compiler or Python headers are found the build goes on without it and
the relay runs its Python loop (it logs which; docs/capacity.md has both costs).
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "firsthop.services.relay._fastpath",
            ["services/relay/_fastpath.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"],
            optional=True,
        )
    ]
)

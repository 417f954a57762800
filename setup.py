"""Build the Cython kernels of bpe_core.

Every ``bpe_core/**/_*.pyx`` (e.g. ``bpe_core/engine/_engine.pyx`` -> ``bpe_core.engine._engine``) becomes one extension module (C++, so the kernels can use
``libcpp.vector``). A ``.pyx`` may ``include`` parts (``_engine_*.pxi``); ``cythonize`` follows
them, so a changed part rebuilds its module.
Environment toggles, as in scikit-learn's developer docs:

- ``BPE_CORE_CYTHON_DEBUG=1``  turn boundscheck/wraparound/initializedcheck back on.
- ``BPE_CORE_CYTHON_TRACE=1``  add ``linetrace`` and ``CYTHON_TRACE_NOGIL`` (coverage, profiling).
- ``BPE_CORE_ANNOTATE=1``      write Cython's ``.html`` annotation next to each ``.pyx``.
- ``BPE_CORE_MODULES=_a,_b``   build only these modules (handy while working on one kernel).

``python setup.py clean`` also removes the generated ``.cpp``, ``.so`` and ``.html`` files.
"""
import glob
import os
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _flag(name):
    return os.environ.get(name, "0") not in ("", "0", "false", "False")


# Dotted module names of the kernels, e.g. "bpe_core.engine._engine".
MOD_NAMES = sorted(
    os.path.relpath(os.path.splitext(p)[0], HERE).replace(os.sep, ".")
    for p in glob.glob(os.path.join(HERE, "bpe_core", "**", "_*.pyx"), recursive=True)
)
if os.environ.get("BPE_CORE_MODULES"):       # short names: BPE_CORE_MODULES=_engine,_pretok
    MOD_NAMES = [m for m in MOD_NAMES if m.rsplit(".", 1)[1] in os.environ["BPE_CORE_MODULES"].split(",")]
#: Folders of the kernels (their headers, e.g. ``pretok/_unicode_tables.h``, are found from any of them).
KERNEL_DIRS = sorted({os.path.join(HERE, *m.split(".")[:-1]) for m in MOD_NAMES})

DEBUG = _flag("BPE_CORE_CYTHON_DEBUG")
TRACE = _flag("BPE_CORE_CYTHON_TRACE")
COMPILER_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
    "linetrace": TRACE,
}


def _clean():
    for pattern in ("_*.cpp", "_*.c", "_*.so", "_*.html", "_*.pyd"):
        for path in glob.glob(os.path.join(HERE, "bpe_core", "**", pattern), recursive=True):
            print("removing", os.path.relpath(path, HERE))
            os.remove(path)


def _extensions():
    from Cython.Build import cythonize

    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    if TRACE:
        macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    if sys.platform == "win32":
        compile_args = ["/O2", "/std:c++17"]
    else:
        compile_args = ["-O3", "-std=c++17", "-Wno-unused-function", "-Wno-unreachable-code"]
    exts = [
        Extension(
            name,
            [name.replace(".", "/") + ".pyx"],
            language="c++",
            include_dirs=KERNEL_DIRS,
            define_macros=macros,
            extra_compile_args=compile_args,
        )
        for name in MOD_NAMES
    ]
    return cythonize(
        exts,
        compiler_directives=COMPILER_DIRECTIVES,
        annotate=_flag("BPE_CORE_ANNOTATE"),
        nthreads=0,
    )


if len(sys.argv) > 1 and sys.argv[1] == "clean":
    _clean()
    sys.argv = [sys.argv[0], "clean"] + sys.argv[2:]

setup(ext_modules=_extensions())

"""pip install . : builds kiln's Python module (python/, the CMake target kiln_python) and installs the
package `kiln`. Offline with Debian's tools: setuptools and wheel from python3-setuptools/python3-wheel,
the build from cmake, ninja, pybind11-dev and python3-dev (scripts/setup.sh installs them). There is
no pyproject.toml on purpose: pip then builds with the setuptools it finds instead of downloading one
into an isolated environment, so `pip install .` and `pip install --no-build-isolation .` both work
without a package index.

Environment:
  KILN_BUILD_DIR=DIR            build in DIR (an existing kiln build tree is reused; default: a
                                fresh tree under setuptools' build directory, with ccache when found)
  KILN_PREBUILT_EXTENSION=FILE  install this already built _kiln*.so instead of building
  KILN_BUILD_JOBS=N             parallel build jobs (default: the CPU count)
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def kiln_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(kiln VERSION"):
                return line.split("VERSION")[1].split()[0]
    return "0.0.0"


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        prebuilt = os.environ.get("KILN_PREBUILT_EXTENSION")
        if prebuilt:
            shutil.copyfile(prebuilt, dest)
            return
        build_dir = os.path.abspath(os.environ.get("KILN_BUILD_DIR") or os.path.join(self.build_temp, "cmake"))
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            os.makedirs(build_dir, exist_ok=True)
            cfg = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DKILN_PYTHON=ON",
                   "-DKILN_BUILD_TESTS=OFF", "-DPython_EXECUTABLE=" + sys.executable]
            if shutil.which("ninja"):
                cfg += ["-G", "Ninja"]
            subprocess.check_call(cfg)
        jobs = os.environ.get("KILN_BUILD_JOBS") or str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "kiln_python", "--parallel", jobs])
        built = glob.glob(os.path.join(build_dir, "python", "kiln", "_kiln*.so"))
        if not built:
            raise RuntimeError("the kiln_python target left no _kiln*.so in %s/python/kiln" % build_dir)
        shutil.copyfile(built[0], dest)


setup(
    name="kiln",
    version=kiln_version(),
    description="kiln: an ONNX inference compiler and runtime (Python API and ONNX Runtime drop-in)",
    packages=["kiln"],
    package_dir={"kiln": "python/kiln"},
    package_data={"kiln": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("kiln._kiln", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)

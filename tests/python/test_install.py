"""cmake --install --component python: the package in the prefix's site-packages imports from anywhere, with the
prefix's libsat.so and models and nothing from the build tree."""
import os
import subprocess
import sys
import sysconfig

import pytest

import sat

PROBE = """
import sat
print(sat.__file__)
print(sat.models_dir())
print([l.split()[-1] for l in open("/proc/self/maps") if "libsat.so" in l][0])
print(sat.Captioner(sat.models_dir() + "/synth.sat").caption(EXAMPLE).text)
"""


def test_installed_package(tmp_path, repo, synth):
    build = os.environ.get("SAT_BUILD_DIR")
    if not build:
        pytest.skip("SAT_BUILD_DIR (the build folder, set by ctest) is not set")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", build, "--component", "python", "--prefix", str(prefix)], check=True,
                   capture_output=True)
    site = prefix / "lib" / f"python{sysconfig.get_python_version()}" / "site-packages"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SAT_MODEL", "SAT_WEIGHTS")}
    env["PYTHONPATH"] = str(site)
    example = repo / "examples" / "scene.png"
    out = subprocess.run([sys.executable, "-c", f"EXAMPLE = {str(example)!r}" + PROBE], cwd=tmp_path, env=env,
                         check=True, capture_output=True, text=True).stdout.splitlines()
    assert out[0] == str(site / "sat" / "__init__.py")
    assert out[1] == str(prefix / "share" / "sat" / "models")
    assert out[2] == str(prefix / "lib" / "libsat.so")
    assert out[3] == synth.caption(example).text
    # negative control: the build tree's package, imported here, is not the installed one
    assert not sat.__file__.startswith(str(prefix))

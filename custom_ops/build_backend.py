"""PEP 517 backend: setuptools' own, after checking that TensorFlow is importable.

The op library is compiled against TensorFlow's headers and libtensorflow_framework and only
loads into that exact TensorFlow version. pip's build isolation hides the TensorFlow the user
runs, and building against another one would give a library that does not load, so wheel and
editable builds stop here with the command that works. sdists need no TensorFlow.
"""

import importlib.util

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (sdist hooks and the rest unchanged)

NO_TENSORFLOW = (
    "tf_rnnt compiles its op library against the TensorFlow you will run it with, and this build "
    "environment cannot import TensorFlow (pip's build isolation hides the installed one).\n"
    "Install TensorFlow 2.17-2.21 (`tensorflow` or `tensorflow-cpu`) first, then build without "
    "isolation:\n\n    pip install --no-build-isolation .\n\n"
    "(or install a prebuilt tf_rnnt wheel for your TensorFlow; see README, Install).")


class TensorFlowNotImportable(SystemExit):
    """The build needs TensorFlow and cannot import it (exits with NO_TENSORFLOW, no traceback)."""


def _require_tensorflow():
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except ImportError:
        found = False
    if not found:
        raise TensorFlowNotImportable(NO_TENSORFLOW)


def get_requires_for_build_wheel(config_settings=None):
    _require_tensorflow()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _require_tensorflow()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _require_tensorflow()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    _require_tensorflow()
    return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _require_tensorflow()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _require_tensorflow()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)

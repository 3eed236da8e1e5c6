"""Registers the tf_rnnt Keras classes with Keras as soon as both are imported.

A `.keras` file that holds `RNNTJoint`, `FlashRNNTLoss`, ... names them `tf_rnnt>RNNTJoint`;
Keras finds them only in its registry, which `tf_rnnt.keras` fills when it is imported. Importing
it from `import tf_rnnt` would load Keras and TensorFlow (seconds), so `tf_rnnt.keras` is
imported right after Keras instead: now if Keras is already loaded, else by a one-shot import
hook that runs when Keras' own import finishes.
"""

import importlib.abc
import importlib.util
import sys
import warnings


def _register():
    try:
        import tf_rnnt.keras  # noqa: F401  (its classes register themselves)
    except Exception as error:  # a broken tf_rnnt.keras must not break `import keras`
        warnings.warn(f"tf_rnnt: could not register its Keras classes: {error!r}")


class _AfterKerasImport(importlib.abc.MetaPathFinder):
    """Wraps Keras' loader so that `_register` runs once Keras is fully imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec


def install():
    if "keras" in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterKerasImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasImport())


install()

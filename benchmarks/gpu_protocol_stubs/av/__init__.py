"""A stand-in for PyAV (``av``) on the GPU protocol's device machine, where ComfyUI imports it at start.

ComfyUI 0.33.0 imports ``av`` in ``comfy_api`` (video types) although nothing in the protocol decodes or encodes
video; PyAV's wheel (36 MB) does not fit the device call's 64 MiB carry beside the other wheels. Every name
resolves to a placeholder class whose use raises, so an accidental video path fails loudly. Never installed
anywhere else: ``benchmarks/gpu_protocol_prepare.sh`` copies it next to the wheels; ``gpu_protocol.py`` records
that it was used (``pkg av``).
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0+steadfast.stand.in"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


class _Missing(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("PyAV is not installed on this machine (the GPU protocol's stand-in 'av' is loaded)")

    def __class_getitem__(cls, item):
        return cls


def _placeholder(name):
    return _Meta(name, (_Missing,), {})


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("av."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _Finder())

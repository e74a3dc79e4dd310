"""How decoders reach the decoder processes: by reference when the children can import them, else by value.

::

    process start (pickling the PipelineConfig)
                                 ship(decoders) -> Shipped(pickle's bytes: by reference, module.name)
                                                -> Shipped(cloudpickle's bytes of all of them together: one
                                                   defined in a notebook cell, python -c, a script piped to
                                                   python; a lambda, a closure)
    decoder process              unship(cfg.decoders) -> the decoders; if they do not load, the run ends at
                                 once with a PipelineError that says why

Pickle stores a function or class as "module.qualname", which a child resolves by importing the module.
That fails for the script, which the children never import (:func:`parrecio.pipeline.children.start`: a
script without a ``__main__`` guard would run again in each of them) -- ``__main__``, or ``__mp_main__``
in a process that spawn or forkserver started (``torch.multiprocessing.spawn``'s DDP workers) --, for a
module made at run time (``runpy.run_path``'s, any whose ``__spec__`` is None), and for lambdas and local
functions everywhere. cloudpickle -- what Ray, Dask and joblib/loky use -- stores those by value instead
(the modules other than ``__main__`` registered with it for the while). A reader's decoders are pickled
together (what they share stays shared), once per process start, never per sample: as they are when the
process starts (what ``__main__`` set after the reader was made included, as under ``fork`` and
``workers=0``). Either way they travel as bytes that only a decoder process loads, in its own code: a
module it cannot import is a clear error there (never a crash of the process's start-up, nor of the
reader process, which does not need them).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import pickle
import sys
import threading
import types
from typing import Any, Dict, Iterator, List, Sequence, Tuple

__all__ = ["Shipped", "ship", "unship"]


class Shipped:
    """A reader's decoders on their way: pickle's bytes (``by_value``: cloudpickle's), loaded in the decoder
    process."""

    __slots__ = ("blob", "text", "by_value")

    def __init__(self, blob: bytes, text: str, by_value: bool = True) -> None:
        self.blob, self.text, self.by_value = blob, text, by_value

    def load(self) -> Any:
        return pickle.loads(self.blob)

    def __repr__(self) -> str:
        return self.text


def ship(decoders: Sequence[Any], names: Sequence[str], method: str) -> Shipped:
    """A reader's ``decoders`` (its fields, named ``names``) as they travel to the children of start
    method ``method``: pickled by reference when pickle can and the children can import what they name,
    else by value; one :class:`Shipped` holding all of them either way.

    All in one cloudpickle blob, because what decoders share must stay shared: two ``__main__`` functions
    reading one module-level dict get one dict in the child (pickled apart, each would get a copy of its
    own, and a cache or a class table filled by one field would be empty in the other).  ``TypeError``
    (naming the field) when not even cloudpickle can pickle one."""
    decoders = tuple(decoders)
    try:
        data = pickle.dumps(decoders)
    except Exception:
        data = None
    try:
        scripts = _unimportable(decoders, data is not None)
    except Exception:  # (not even cloudpickle pickles them: said below)
        scripts = []
    if data is not None and not scripts:
        return Shipped(data, repr(decoders), by_value=False)
    import cloudpickle
    try:
        with _by_value(cloudpickle, scripts):
            blob = _dumps_by_value(cloudpickle, decoders)
    except Exception as whole:
        for decoder, name in zip(decoders, names):  # name the field that cannot travel
            try:
                cloudpickle.dumps(decoder)
            except Exception as exc:
                raise TypeError(f"field {name!r}: the decoder {decoder!r} cannot be pickled, not even by value "
                                f"(cloudpickle), so it cannot reach the decoder processes ({method} start "
                                f"method): {type(exc).__name__}: {exc}") from exc
        raise TypeError(f"the decoders {decoders!r} cannot be pickled together, not even by value (cloudpickle), "
                        f"so they cannot reach the decoder processes ({method} start method): "
                        f"{type(whole).__name__}: {whole}") from whole
    return Shipped(blob, repr(decoders))


def _dumps_by_value(cloudpickle: Any, obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, a class pickled by value keeping its ``__qualname__``: cloudpickle rebuilds
    it with its bare name, so a class nested in another (``Outer.Inner``) was ``Inner`` in the child, where
    its values pickled as ``__main__.Inner`` -- an error in the consumer, or another class of that name
    there, silently."""
    class Pickler(cloudpickle.CloudPickler):
        def reducer_override(self, obj: Any) -> Any:
            rv = super().reducer_override(obj)
            if isinstance(obj, type) and isinstance(rv, tuple) and len(rv) >= 3 and \
                    getattr(obj, "__qualname__", obj.__name__) != obj.__name__:
                state = rv[2]  # (cloudpickle's (class dict, slot state), set on the rebuilt class)
                if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
                    rv = (*rv[:2], ({**state[0], "__qualname__": obj.__qualname__}, state[1]), *rv[3:])
            return rv

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


_SCRIPT = ("__main__", "__mp_main__")


class _Definitions(pickle.Pickler):
    """Pickles to nowhere, noting the module of every class and Python function on the way: where each is
    defined (the types of plain objects, and C functions, are no concern: their modules are a package's,
    which a child imports); and each top-level one by module and name (what :func:`_bind_script` binds)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: Dict[str, None] = {}
        self.script: Dict[str, Dict[str, Any]] = {}  # module -> top-level name -> the class or function

    def persistent_id(self, obj: Any) -> None:
        if isinstance(obj, (type, types.FunctionType)):
            name = getattr(obj, "__module__", None)
            if isinstance(name, str):
                self.modules[name] = None
                qualname = getattr(obj, "__qualname__", "")
                if isinstance(qualname, str) and qualname.isidentifier():
                    self.script.setdefault(name, {}).setdefault(qualname, obj)
        return None


def _definitions(decoders: Tuple[Any, ...], plain: bool) -> _Definitions:
    """A :class:`_Definitions` that walked ``decoders``: as pickle pickles them (``plain``), else as
    cloudpickle does (a lambda's globals, a class of the script by value, too)."""
    from .children import _Nowhere
    if plain:
        lister = _Definitions(_Nowhere())
    else:
        import cloudpickle

        class _Listing(_Definitions, cloudpickle.CloudPickler):
            pass
        lister = _Listing(_Nowhere())
    lister.dump(decoders)
    return lister


def _unimportable(decoders: Tuple[Any, ...], plain: bool) -> List[str]:
    """The modules that define classes or functions of ``decoders`` and that a decoder process cannot
    import: the script's (``__main__``, ``__mp_main__``), and a top-level module made at run time that no
    file on ``sys.path`` provides (``runpy.run_path``'s ``<run_path>``, a ``types.ModuleType`` put in
    ``sys.modules``).  ``plain``: whether pickle pickles them; else they are walked as cloudpickle pickles
    them (a lambda's globals too)."""
    return [name for name in _definitions(decoders, plain).modules if not _importable(name)]


def _made_at_run_time(name: str) -> bool:
    """Whether top-level module ``name``, not imported in this process, is none a file on ``sys.path``
    provides (``<run_path>``): its classes and functions came by value, where it was made."""
    if "." in name or name in sys.modules:
        return False
    try:
        return importlib.util.find_spec(name) is None  # (every finder: built-in, frozen, sys.path)
    except (ImportError, ValueError):  # pragma: no cover
        return False


def _importable(name: str) -> bool:
    """Whether a new process can import module ``name`` (when unsure: yes, as pickle assumes)."""
    if name in ("__main__", "__mp_main__"):
        return False
    mod = sys.modules.get(name)
    if mod is None or getattr(mod, "__spec__", False) is not None or "." in name:
        return True  # (a submodule made at run time, torch._C._nn say, comes with its package's import)
    try:
        return importlib.machinery.PathFinder.find_spec(name) is not None
    except (ImportError, ValueError):  # pragma: no cover
        return True


_REGISTRY = threading.Lock()  # cloudpickle's registry of modules pickled by value is the process's


@contextlib.contextmanager
def _by_value(cloudpickle: Any, names: Sequence[str]) -> Iterator[None]:
    """cloudpickle pickles what the modules ``names`` hold by value for the while (it does so for
    ``__main__`` by itself; a module the user registered stays registered).  Under a lock: two readers
    shipping decoders of one such module from two threads would otherwise unregister it under each other."""
    with _REGISTRY:
        registered = set(cloudpickle.list_registry_pickle_by_value())
        added = []
        try:
            for name in names:
                mod = sys.modules.get(name)
                if name != "__main__" and name not in registered and getattr(mod, "__name__", None) == name:
                    cloudpickle.register_pickle_by_value(mod)
                    added.append(mod)
            yield
        finally:
            for mod in added:
                cloudpickle.unregister_pickle_by_value(mod)


def unship(shipped: Any) -> Tuple[Any, ...]:
    """The decoders themselves, in a decoder process (what :func:`ship` returned; the decoders as they
    are where nothing was pickled: a ``fork`` child).  Decoders that came by value have the script's
    classes and functions they use bound in this process's ``__main__`` too (:func:`_bind_script`)."""
    decoders = tuple(shipped.load() if isinstance(shipped, Shipped) else shipped)
    if isinstance(shipped, Shipped) and shipped.by_value:
        _bind_script(decoders)
    return decoders


def _bind_script(decoders: Tuple[Any, ...]) -> None:
    """Bind the classes and functions of the script (``__main__``, ``__mp_main__``, or a module made at run
    time that no file provides: ``runpy.run_path``'s ``<run_path>``) that ``decoders`` hold -- rebuilt by
    value here -- by their names in this process's module of that name, where none is bound yet: pickle
    stores a value of such a class (a dataclass a decoder returns, an exception it raises) as
    "__main__.Name", looked up here when it travels back and in the consumer's script when it arrives.
    Without this every such value failed to pickle (a DecodeError for each sample) under forkserver and
    spawn."""
    try:
        found = _definitions(decoders, plain=False).script
    except Exception:  # (they were pickled this way once already; nothing to bind then)
        return
    for module, objs in found.items():
        mod = sys.modules.get(module)
        if mod is None:
            if module not in _SCRIPT and not _made_at_run_time(module):
                continue  # (a module a child imports: never shadowed by one made here)
            # (__mp_main__ where this process's script is __main__; <run_path>)
            mod = sys.modules[module] = types.ModuleType(module)
        for name, obj in objs.items():
            if not hasattr(mod, name):
                setattr(mod, name, obj)

"""The public name of the callable a probed call actually ran, found from the object itself.

Static resolution cannot know what `loss` or `output` is (a method on the result of a call is
named after that call, `torch.nn.functional.nll_loss/backward`); the running program does. On a
site's sized calls the probe names the callee from `type(bound.__self__)`, `__module__` and
`__qualname__`, and maps it to the framework's public alias: the shortest path of public modules,
followed attribute by attribute from the top package, that holds the very same object
(`torch._tensor.Tensor` is `torch.Tensor`, `keras.src.models.sequential.Sequential` is
`keras.Sequential`). A method is named on the first public class of the receiver's MRO through
which the same definition is reached, so a user's `nn.Module` subclass `Net` called on data is
`torch.nn.Module.__call__`, and `Net` is kept beside it as the user's type. A framework's own
private class that overrides the method (the function `tf.function` returns,
`polymorphic_function.Function`; `torch.compile`'s `OptimizedModule`) is named on the first public
class of its MRO that has the method: its documented interface
(`tensorflow.types.experimental.PolymorphicFunction.__call__`, `torch.nn.Module.__call__`). Where
the framework has no public name for the method at all (an eager tensor's `numpy`: `tf.Tensor`
has none), it is named where the framework defines the receiver's class,
`tensorflow.python.framework.ops.EagerTensor.numpy`: not a public name, but one that exists.

Only modules the program already imported are looked in, through their `__dict__` (no lazy
loader runs, nothing is imported), and a name is given only when found: otherwise the static
name stands. Results are cached per (type, attribute), so a site costs a dict lookup after the
first time.
"""

from __future__ import annotations

import sys
import types
import weakref
from typing import Any

# Path components that mark an implementation module, not a public namespace.
_PRIVATE_COMPONENTS = frozenset({"src", "python"})
_CALLABLE_KINDS = (types.FunctionType, types.BuiltinFunctionType)
MAX_UNWRAP = 4  # `functools.wraps` layers looked through

# The packages whose public names count (the instrumenter's roots, from the manifest): a user's
# own importable module (`model.Net`) is never one.
_roots: frozenset[str] = frozenset({"tensorflow", "keras", "tf_keras", "torch", "numpy"})
_class_names: dict[type, str | None] = {}
_member_names: dict[tuple[type, str], tuple[str, str] | None] = {}


def set_roots(roots: Any) -> None:
    """Name callees under these API roots only (`numpy.linalg` counts as `numpy`)."""
    global _roots
    if isinstance(roots, list) and roots and all(isinstance(r, str) for r in roots):
        _roots = frozenset(r.split(".", 1)[0] for r in roots)
        _class_names.clear()
        _member_names.clear()


def runtime_name(fn: Any) -> dict[str, str] | None:
    """{"api": public name of what `fn(...)` runs, "callee": function | constructor | method |
    object, "type": the user's class it ran on, if any}; None when no public name is found."""
    for _ in range(MAX_UNWRAP):
        # a wrapper set on the instance (a scheduler's `optimizer.step`) names what it wraps,
        # on the receiver it closes over where it keeps one (`AdamW.step`, not `Adam.step`)
        wrapped = getattr(fn, "__wrapped__", None) if isinstance(fn, types.FunctionType) else None
        receiver = None if wrapped is None else _closed_over_receiver(fn, wrapped)
        if receiver is not None:
            return _name(types.MethodType(wrapped, receiver))
        named = _name(fn)
        if named is not None or wrapped is None:
            return named
        fn = wrapped
    return None


def is_framework(fn: Any) -> bool:
    """Whether calling `fn` runs a framework API: it has a public name under the roots, or what
    runs is defined in a module under them (a framework's private function or class). A dcall
    site asks this once per callee kind (`probe.dcall`)."""
    if runtime_name(fn) is not None:
        return True
    module = _defining_module(fn)
    return isinstance(module, str) and module.split(".", 1)[0] in _roots


def _defining_module(fn: Any) -> Any:
    """The module of the code `fn(...)` runs: the function, the method's function, the class (a
    constructor), or the `__call__` a callable object's class has."""
    if isinstance(fn, (types.MethodType, types.FunctionType, type)):
        return getattr(fn, "__module__", None)
    if isinstance(fn, types.BuiltinMethodType):
        owner = fn.__self__
        if owner is None or isinstance(owner, types.ModuleType):
            return getattr(fn, "__module__", None)
        cls = owner if isinstance(owner, type) else type(owner)
        definer = _definer(cls, fn.__name__)
        return getattr(definer or cls, "__module__", None)
    definer = _definer(type(fn), "__call__")
    return getattr(definer, "__module__", None)


def _closed_over_receiver(wrapper: types.FunctionType, wrapped: Any) -> Any:
    """The object a wrapper's closure holds (itself or by weak reference) whose class has
    `wrapped` as its method of that name: what the wrapper calls it on."""
    name = getattr(wrapped, "__name__", None)
    for cell in wrapper.__closure__ or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(held, weakref.ref):
            held = held()
        if held is not None and name and getattr(type(held), name, None) is wrapped:
            return held
    return None


def _name(fn: Any) -> dict[str, str] | None:
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, type):
        api = public_class_name(fn)
        return None if api is None else {"api": api, "callee": "constructor"}
    if isinstance(fn, (types.MethodType, types.BuiltinMethodType)) and not (
        owner is None or isinstance(owner, types.ModuleType)
    ):
        cls = owner if isinstance(owner, type) else type(owner)
        return _member(cls, fn.__name__, "method")
    if isinstance(fn, _CALLABLE_KINDS):
        module = getattr(fn, "__module__", None)
        api = _public_path(module, fn.__name__, fn)
        if api is not None:
            return {"api": api, "callee": "function"}
        cls = _defining_class(module, getattr(fn, "__qualname__", ""))
        return None if cls is None else _member(cls, fn.__name__, "method")
    return _member(type(fn), "__call__", "object")  # a callable object: a layer, a module, a loss


def adopted(site: dict[str, Any], found: dict[str, Any]) -> tuple[str, str] | None:
    """(api, written) a site takes from the name the probe found, None to keep its static ones.

    A function the user called by its public name whose object is callable keeps its static
    name (`numpy.add` is a `numpy.ufunc`: its static name says more). A call on the user's own
    subclass shows the class beside what was written: `model (Net)`.
    """
    api = found.get("api")
    if not isinstance(api, str) or not api:
        return None
    if site.get("kind", "") == "function" and found.get("callee") == "object":
        return None
    written = shown_written(site)
    user_type = found.get("type")
    if isinstance(user_type, str) and user_type and user_type not in written:
        written = f"{written} ({user_type})" if written else user_type
    return api, written


def shown_written(site: dict[str, Any]) -> str:
    """What per-site views show for a manifest site: what was written, and for a compiled unit
    the user's function or class and the compiler beside it (`train_step (tf.function)`)."""
    written = str(site.get("written", ""))
    compiler = site.get("compiler")
    if site.get("kind") != "compiled" or not isinstance(compiler, str) or not compiler:
        return written
    label = compiler.replace("tensorflow.", "tf.", 1)
    unit = str(site.get("unit", "")).rpartition(".")[2]  # `main.train_step`: `train_step`
    if unit and unit not in written:
        label = f"{unit}, {label}"
    return f"{written} ({label})" if written else label


def public_class_name(cls: type) -> str | None:
    """The shortest public dotted name that reaches `cls` itself, None if there is none."""
    if cls not in _class_names:
        _class_names[cls] = _public_path(cls.__module__, cls.__name__, cls)
    return _class_names[cls]


def _member(cls: type, name: str, callee: str) -> dict[str, str] | None:
    key = (cls, name)
    if key not in _member_names:
        _member_names[key] = _find_member(cls, name)
    found = _member_names[key]
    if found is None:
        return None
    api, user_type = found
    named = {"api": api, "callee": callee}
    if user_type:
        named["type"] = user_type
    return named


def _find_member(cls: type, name: str) -> tuple[str, str] | None:
    """(public `Class.name`, the user's class or "") for the attribute `name` of `cls`."""
    ran = _definer(cls, name)
    if ran is None:  # an attribute of the instance, not of its class: nothing to name it by
        return None
    for klass in cls.__mro__:
        public = public_class_name(klass)
        if public is not None and _definer(klass, name) is ran:
            package = public.split(".", 1)[0]
            user = cls.__module__.split(".", 1)[0] != package and klass is not cls
            return f"{public}.{name}", cls.__name__ if user else ""
    if cls.__module__.split(".", 1)[0] not in _roots:
        return None  # the user's override: its public base's method is not what ran
    for klass in cls.__mro__[1:]:  # a framework's private override: its public interface
        public = public_class_name(klass)
        if public is not None and _definer(klass, name) is not None:
            return f"{public}.{name}", ""
    own = _own_path(cls)  # no public name at all (an EagerTensor's `numpy`): where it lives
    return None if own is None else (f"{own}.{name}", "")


def _own_path(cls: type) -> str | None:
    """`module.Class` where the framework defines `cls`, if that path reaches it."""
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = _lookup(found, part)
    return f"{cls.__module__}.{cls.__qualname__}" if found is cls else None


def _defining_class(module: str | None, qualname: str) -> type | None:
    """The class `module.Class` a function's `__qualname__` (`Class.method`) names, if any."""
    owner, _, _ = qualname.rpartition(".")
    if not module or not owner or "<" in owner:
        return None
    found: Any = sys.modules.get(module)
    for part in owner.split("."):
        found = _lookup(found, part)
    return found if isinstance(found, type) else None


def _definer(cls: type, name: str) -> type | None:
    """The class of `cls`'s MRO whose own namespace holds `name` (what attribute lookup finds)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _public_path(module: str | None, name: str, obj: Any) -> str | None:
    """`package.a.b.name` for the shortest public prefix of `module` whose attribute `name` is
    `obj` itself, else the name TensorFlow exported it under (`_tf_api_names`: `DatasetV2` is
    `tensorflow.data.Dataset`); the top package must already be imported."""
    return _module_path(module, name, obj) or _tf_export(obj)


def _tf_export(obj: Any) -> str | None:
    exported = _lookup(obj, "_tf_api_names") if "tensorflow" in _roots else None
    for path in exported if isinstance(exported, tuple) else ():
        if not isinstance(path, str) or any(p.startswith("_") for p in path.split(".")):
            continue
        found: Any = sys.modules.get("tensorflow")
        for part in path.split("."):
            found = _lookup(found, part)
        if found is obj:
            return f"tensorflow.{path}"
    return None


def _module_path(module: str | None, name: str, obj: Any) -> str | None:
    if not module or not name or name.startswith("_"):
        return None
    parts = [p for p in module.split(".") if not p.startswith("_")]
    parts = parts[:1] + [p for p in parts[1:] if p not in _PRIVATE_COMPONENTS]
    if not parts or parts[0] != module.split(".", 1)[0] or parts[0] not in _roots:
        return None  # the user's own module, or a private top package (`_operator`)
    namespace = sys.modules.get(parts[0])
    for depth in range(1, len(parts) + 1):
        if namespace is None:
            return None
        if _lookup(namespace, name) is obj:
            return ".".join([*parts[:depth], name])
        if depth < len(parts):
            namespace = _lookup(namespace, parts[depth])
            if not isinstance(namespace, types.ModuleType):
                namespace = None
    return None


def _lookup(namespace: Any, name: str) -> Any:
    try:
        return vars(namespace).get(name)
    except TypeError:
        return None

"""Canonical API names: one name per API, however the user imported it.

Qualified names come from libcst's scope analysis (``tf.keras.layers.Dense`` →
``tensorflow.keras.layers.Dense``). The same API is reachable under several public paths, so
the name is then canonicalised with a short, documented table of the frameworks' own
re-exports:

* Keras: ``tensorflow.keras.*``, ``tensorflow.python.keras.*``, ``tf_keras.*``, ``keras.api.*``
  are all ``keras.*``; ``keras.models.Sequential``/``keras.models.Model`` are
  ``keras.Sequential``/``keras.Model``; ``keras.layers.Input`` is ``keras.Input``.
* TensorFlow: ``tensorflow.compat.v2.*`` is ``tensorflow.*``.
* PyTorch: ``torch.nn.modules.<module>.<Class>`` is ``torch.nn.<Class>``,
  ``torch.optim.<module>.<Class>`` is ``torch.optim.<Class>`` (not for ``lr_scheduler`` and
  ``swa_utils``, public modules of their own).

Names of objects that framework calls return (see ``resolve.py``):

* an object built by a constructor ``C(...)`` (a capitalised last component) is a ``C``: its
  methods are ``C.method`` and calling it is ``C.__call__``; an alternative constructor
  ``C.from_x(...)`` called on the class also gives a ``C``;
* any other framework call ``f(...)`` gives an object of a type unknown here: a method of it is
  named after the call, ``f/method`` (``tf.constant(1).numpy()`` is
  ``tensorflow.constant/numpy``; ``loss.backward()`` after ``loss = F.nll_loss(...)`` is
  ``torch.nn.functional.nll_loss/backward``). This says exactly what is known, never a guessed
  type, and is only the fallback: the probe names each call it sees from the callee that ran
  (``fecomlite.runtime.names``), so ``torch.Tensor.backward`` replaces it in a report;
* a graph-compiled unit is named after the public type of what the compiler returns, whose
  ``__call__`` runs it: ``tf.function(f)`` is a
  ``tensorflow.types.experimental.PolymorphicFunction`` (``….PolymorphicFunction.__call__``),
  ``torch.compile(module)`` an ``nn.Module`` that calls the
  original through ``torch.nn.Module.__call__``, ``torch.jit.script``/``trace`` a
  ``torch.jit.ScriptFunction`` or ``torch.jit.ScriptModule``. ``torch.compile(f)`` returns a plain
  function of no public type, so it is named by the public callable that made it,
  ``torch.compile``. The user's function or class and the compiler go beside what was written in
  per-site views: ``train_step (tf.function)``, ``compiled (Net, torch.compile)``.

No name has ``()`` in it: such a name reads as a chain of calls, and a label cut short then
names the wrong API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_ROOTS: tuple[str, ...] = ("tensorflow", "keras", "tf_keras", "torch")

_PREFIX_ALIASES: dict[str, str] = {
    "tensorflow.keras": "keras",
    "tensorflow.python.keras": "keras",
    "tensorflow.compat.v2": "tensorflow",
    "tf_keras": "keras",
    "keras.api": "keras",
    "keras.models.Sequential": "keras.Sequential",
    "keras.models.Model": "keras.Model",
    "keras.engine.sequential.Sequential": "keras.Sequential",
    "keras.engine.training.Model": "keras.Model",
    "keras.layers.Input": "keras.Input",
}
_PATTERN_ALIASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^torch\.nn\.modules\.\w+\.(?=[A-Z])"), "torch.nn."),
    # schedulers and SWA helpers live in their own public modules, not in torch.optim
    (re.compile(r"^torch\.optim\.(?!lr_scheduler\.|swa_utils\.)\w+\.(?=[A-Z])"), "torch.optim."),
)
RESULT = "/"  # joins a call whose result type is unknown to a member of that result

# Calls that compile a function or module into a graph: the body is measured as one unit.
COMPILERS: frozenset[str] = frozenset(
    {
        "tensorflow.function",
        "torch.compile",
        "torch.jit.script",
        "torch.jit.trace",
        "torch.jit.trace_module",
        "torch.jit.script_method",
        "jax.jit",
    }
)
# Compilers that run a function's Python with symbolic values to build a graph: a probe inside
# would run once per trace and time the tracing, so such a body is never instrumented, even where
# another module of the project compiles it. (PyTorch's compilers see through the probe at run
# time instead, `fecomlite/runtime/compilers.py`, so eager calls of those functions stay measured.)
TRACING_COMPILERS: frozenset[str] = frozenset({"tensorflow.function", "jax.jit"})
# Questions code asks to learn whether a compiler traces it (`if not torch.jit.is_scripting():`):
# never wrapped, so a guarded body compiles as written and the answer costs nothing.
COMPILER_GUARDS: frozenset[str] = frozenset(
    {
        "torch.jit.is_scripting",
        "torch.jit.is_tracing",
        "torch._C._get_tracing_state",
        "torch.compiler.is_compiling",
        "torch.compiler.is_dynamo_compiling",
        "torch.compiler.is_exporting",
        "torch._dynamo.is_compiling",
        "torch._dynamo.external_utils.is_compiling",
        "torch._utils.is_compiling",
        "torch.onnx.is_in_onnx_export",
        "tensorflow.executing_eagerly",
        "tensorflow.inside_function",
    }
)
# Methods Keras runs inside its own tf.function during fit/evaluate/predict.
KERAS_GRAPH_METHODS: frozenset[str] = frozenset({"call", "train_step", "test_step", "predict_step"})
_SCRIPT_TYPES = {"function": "torch.jit.ScriptFunction", "module": "torch.jit.ScriptModule"}


def canonical(name: str) -> str:
    """The canonical spelling of a fully qualified API name."""
    for _ in range(4):  # aliases chain (tensorflow.keras.models.Model → keras.Model): few steps
        new = _rewrite_once(name)
        if new == name:
            return name
        name = new
    return name


def _rewrite_once(name: str) -> str:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        target = _PREFIX_ALIASES.get(".".join(parts[:cut]))
        if target is not None:
            return ".".join([target, *parts[cut:]])
    for pattern, replacement in _PATTERN_ALIASES:
        name = pattern.sub(replacement, name)
    return name


def compiled_type(compiler: str, target: str) -> str | None:
    """The public type of what ``compiler`` returns for a ``target`` that is a ``function``, a
    ``module`` (a class or an instance) or ``""`` (unknown); None where it has no public type."""
    if compiler == "tensorflow.function":
        return "tensorflow.types.experimental.PolymorphicFunction"
    if compiler == "torch.compile":
        return "torch.nn.Module" if target == "module" else None
    if compiler in ("torch.jit.script", "torch.jit.trace", "torch.jit.trace_module"):
        kind = "module" if compiler == "torch.jit.trace_module" else target
        return _SCRIPT_TYPES.get(kind)
    return None


def compiled_api(compiler: str, public_type: str | None) -> str:
    """The canonical API of calling a compiled unit: its type's ``__call__``, else the compiler."""
    return f"{public_type}.__call__" if public_type else compiler


def is_class_name(name: str) -> bool:
    """Whether the last component names a class (by Python convention: Capitalised)."""
    last = name.rsplit(".", 1)[-1]
    return last[:1].isupper()


def factory_class(name: str) -> str | None:
    """``C`` for an alternative constructor ``C.from_x``-style call made on class ``C``."""
    owner, _, last = name.rpartition(".")
    if owner and is_class_name(owner) and not is_class_name(last) and not last.startswith("_"):
        return owner
    return None


class Roots:
    """The configured API roots (``tensorflow``, ``torch``, ``numpy``, ``numpy.linalg`` ...)."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.names: tuple[str, ...] = tuple(dict.fromkeys(r.strip() for r in roots if r.strip()))

    def covers(self, qualified: str) -> bool:
        """Whether a qualified name lies under a root (its calls are wrapped)."""
        return any(qualified == r or qualified.startswith(r + ".") for r in self.names)

    def leads_to(self, qualified: str) -> bool:
        """Whether attributes of this name may lie under a root (``numpy`` for ``numpy.linalg``)."""
        return self.covers(qualified) or any(r.startswith(qualified + ".") for r in self.names)

    def root_of(self, name: str) -> str:
        """The root reported for a canonical name: the longest matching root, else its package."""
        best = ""
        for r in self.names:
            if (name == r or name.startswith(r + ".")) and len(r) > len(best):
                best = r
        return best or name.split(".", 1)[0]

"""Registering ``"sagegen"`` in diffusers' attention-backend registry, now or when diffusers loads it.

diffusers' registry is private API: ``AttentionBackendName`` is a closed ``(str, Enum)`` that every entry point
(``ModelMixin.set_attention_backend``, ``AttentionModuleMixin.set_attention_backend``, the
``attention_backend`` context manager, ``dispatch_attention_fn``) coerces names through, and
``_AttentionBackendRegistry.register(member, constraints, supports_context_parallel)`` stores a backend under
a member. So registering adds a ``SAGEGEN = "sagegen"`` member to the Enum at run time (in its member maps,
as the Enum machinery itself would) and registers `diffusers_backend.sagegen_attention` under it, with context
parallelism advertised. Every piece is feature-detected first; a diffusers without them gets
`DiffusersBackendUnavailable`, naming its version and what is missing (tested: diffusers 0.36.0 to 0.42.1).

``import sagegen`` must not import diffusers (slow) and must work in either order, so `install` registers at
once when ``diffusers.models.attention_dispatch`` is already imported, and otherwise puts a one-shot finder on
``sys.meta_path`` that registers right after that module executes. A failure inside that hook is a warning,
never a failed diffusers import.

``DIFFUSERS_ATTN_BACKEND=sagegen`` cannot work: diffusers reads that variable while importing
``attention_dispatch``, before the hook can add the name.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings

TARGET = "diffusers.models.attention_dispatch"
MEMBER_NAME = "SAGEGEN"
TESTED_DIFFUSERS = "0.36.0 to 0.42.1"  # tests/support/diffusers_versions.py
_lock = threading.RLock()


class DiffusersBackendUnavailable(RuntimeError):
    """This diffusers version's private attention registry does not have what sagegen's backend needs."""


def register_diffusers_backend():
    """Register the ``"sagegen"`` backend in diffusers (imports diffusers' dispatcher if needed) and return its
    ``AttentionBackendName`` member. Idempotent. Raises `DiffusersBackendUnavailable` on a diffusers whose
    registry lacks what it needs, ImportError without diffusers."""
    import importlib

    import diffusers  # ImportError without diffusers, as documented

    try:
        module = importlib.import_module(TARGET)
    except ModuleNotFoundError as e:
        if e.name != TARGET:
            raise  # something the dispatcher itself imports is missing: not a version question
        raise DiffusersBackendUnavailable(
            f"sagegen cannot register its 'sagegen' attention backend in diffusers {diffusers.__version__}: this "
            f"version has no attention dispatcher ({TARGET}, which set_attention_backend needs). Upgrade diffusers "
            f"(sagegen's backend is tested with diffusers {TESTED_DIFFUSERS}); sagegen.patch(pipe) "
            f"still routes these models' SDPA calls.") from None
    return _register(module)


def _register(module):
    from sagegen.backend.attention import BACKEND_NAME, sagegen_attention

    with _lock:
        enum_cls, registry = _detect(module)
        member = enum_cls._value2member_map_.get(BACKEND_NAME)
        if member is None:
            member = _add_member(enum_cls, MEMBER_NAME, BACKEND_NAME)
        if registry._backends.get(member) is not sagegen_attention:
            registry.register(member, constraints=[_check_device_and_dtype],
                              supports_context_parallel=True)(sagegen_attention)
        return member


def _detect(module):
    """The Enum and registry class, after checking every private piece this module relies on."""
    missing = []
    enum_cls = getattr(module, "AttentionBackendName", None)
    registry = getattr(module, "_AttentionBackendRegistry", None)
    if enum_cls is None:
        missing.append("attention_dispatch.AttentionBackendName")
    else:
        for attr in ("_member_map_", "_value2member_map_", "_member_names_"):
            if not hasattr(enum_cls, attr):
                missing.append(f"AttentionBackendName.{attr}")
        if not (isinstance(enum_cls, type) and issubclass(enum_cls, str)):
            missing.append("AttentionBackendName as a str Enum")
    if registry is None:
        missing.append("attention_dispatch._AttentionBackendRegistry")
    else:
        # (no set_active_backend before diffusers 0.37: `set_global_backend` assigns _active_backend there)
        for attr in ("register", "_backends", "_constraints", "_supported_arg_names",
                     "_supports_context_parallel", "get_active_backend", "_active_backend"):
            if not hasattr(registry, attr):
                missing.append(f"_AttentionBackendRegistry.{attr}")
    if not callable(getattr(module, "dispatch_attention_fn", None)):
        missing.append("attention_dispatch.dispatch_attention_fn")
    if missing:
        raise DiffusersBackendUnavailable(
            f"sagegen cannot register its 'sagegen' attention backend in diffusers {_diffusers_version()}: its "
            f"private attention registry lacks {', '.join(missing)} (sagegen's backend is tested with diffusers "
            f"{TESTED_DIFFUSERS}). sagegen.patch(pipe) still routes these models' SDPA calls.")
    return enum_cls, registry


def _add_member(enum_cls, name: str, value: str):
    """A new member of a closed (str, Enum), entered where Enum lookups find members: by value
    (``AttentionBackendName("sagegen")``), by name and in ``__members__``/iteration."""
    new = getattr(enum_cls, "_new_member_", str.__new__)
    member = new(enum_cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    type.__setattr__(enum_cls, name, member)  # EnumType.__setattr__ refuses new members
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(name)
    return member


def _check_device_and_dtype(query=None, key=None, value=None, attn_mask=None, **kwargs) -> None:
    """Run by diffusers with DIFFUSERS_ATTN_CHECKS=1: the checks that apply to any sagegen call."""
    if query.device != key.device or query.device != value.device:
        raise ValueError(f"sagegen backend: query, key and value must be on one device, got {query.device}, "
                         f"{key.device}, {value.device}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"sagegen backend: query, key and value must share a dtype, got {query.dtype}, "
                         f"{key.dtype}, {value.dtype}")
    if attn_mask is not None and attn_mask.shape[-1] != key.shape[1]:
        raise ValueError(f"sagegen backend: attn_mask's last dim ({attn_mask.shape[-1]}) must be the key "
                         f"length ({key.shape[1]})")


def set_global_backend(registry, backend) -> None:
    """Make ``backend`` diffusers' process-global default again (its own setter where it has one)."""
    setter = getattr(registry, "set_active_backend", None)
    if setter is not None:
        setter(backend)
    else:
        registry._active_backend = backend


def _diffusers_version() -> str:
    diffusers = sys.modules.get("diffusers")
    return str(getattr(diffusers, "__version__", "(unknown version)"))


# -- registration on import ------------------------------------------------------------------------------------
class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``TARGET`` it asks the other finders for the spec and wraps its loader so
    that the module registers sagegen's backend right after it executes. Removes itself once used."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            _uninstall_finder()
            try:
                _register(module)
            except Exception as exc:  # never break diffusers' import over sagegen's optional backend
                warnings.warn(f"{exc}" if isinstance(exc, DiffusersBackendUnavailable) else
                              f"sagegen could not register its diffusers attention backend: {exc!r}",
                              RuntimeWarning, stacklevel=2)

        loader.exec_module = exec_module  # this loader instance serves only this module
        return spec


_finder = _RegisterOnImport()


def _uninstall_finder() -> None:
    with _lock:
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def install() -> None:
    """Called by ``import sagegen``: register now if diffusers' dispatcher is loaded, else when it loads."""
    module = sys.modules.get(TARGET)
    if module is not None:
        try:
            _register(module)
        except DiffusersBackendUnavailable as exc:
            warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
        return
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def hook_installed() -> bool:
    return _finder in sys.meta_path

"""Every private torch API Steadfast uses (``torch._dynamo``, ``torch._inductor``, ``torch._logging``, ``torch._C``),
in one package with one face: import ``core.torch_compat`` and call its functions; the submodules are its rooms.

* :mod:`.base`: :class:`TorchAPIMissing`, the on-demand import of one API, a patch shared by overlapping blocks;
* :mod:`.dynamo`: Dynamo's config (recompile limit, int specialisation, patches held only while compiling), its
  counters, cache entries and errors, the compile stack's import;
* :mod:`.inductor`: inductor's config (CPU ISA, deterministic, SIMD width, mode options), kernel loads, the config
  digest;
* :mod:`.aot`: AOT-compiled blocks (support, guards that serialise, traced modules, the artifact's guard check);
* :mod:`.logs`: the recompile log tap and the compile progress events;
* :mod:`.modules`: compiled-module wrappers, module hooks, operator names, tensor versions, fp32 precision;
* :mod:`.guard_tree`: the pack's per-call checks built into a tree of Dynamo's C++ guards;
* :mod:`.trace`: the switches a trace reads that torch neither guards nor keys its caches on, and the code objects
  a trace ran.

No other module of ``core/`` or ``nodes/`` names ``torch._`` (``tests/core/test_torch_compat.py`` greps for it),
so a torch upgrade that moves one of these APIs breaks here, with a :class:`TorchAPIMissing` that names the API,
the torch version and what needs it, instead of deep inside a node. Every API is feature-detected when it is
first used (no version checks); none is imported at module import time (``torch._dynamo`` and
``torch._inductor`` take seconds to import and this package must stay cheap to import).

Checked against torch 2.11 and 2.14. Config changes use torch's own ``config.patch`` context managers; the only
global changes this package makes on request are the recompile log tap (:func:`install_recompile_log_tap` /
:func:`remove_recompile_log_tap`) and Dynamo's compile callbacks of :func:`while_compiling`. No ComfyUI imports.
"""

from __future__ import annotations

from .aot import (
    PRECOMPILED_ENV,
    aot_compile_enabled,
    aot_compile_support,
    artifact_guard_manager,
    checked_once,
    duplicate_source,
    guard_arguments,
    guard_failure,
    guard_serialisable,
    portable_guard_state,
    traced_modules,
)
from .base import TorchAPIMissing
from .dynamo import (
    COMPILE_STACK_MODULES,
    RECOMPILE_LIMIT_SETTING,
    cache_entry_count,
    cache_entry_guards,
    compile_activity,
    dynamo_counters,
    dynamo_global_state,
    import_compile_stack,
    is_compile_error,
    is_graph_break,
    recompile_limit,
    specialize_int,
    supports_guard_filter_fn,
    while_compiling,
)
from .guard_tree import GuardTree, guard_tree_support, leaf_count
from .inductor import (
    INDUCTOR_DETERMINISTIC_SETTING,
    MACHINE_CONFIG_KEYS,
    PROBE_CPU_ISA_ENV,
    built_kernel_loads,
    clear_inductor_caches,
    compile_config_digest,
    fast_isa_probe_child,
    inductor_deterministic,
    inductor_mode_options,
    inductor_simdlen,
    libtorch_cpu,
    pick_cpu_isa,
    set_inductor_deterministic,
    set_inductor_simdlen,
    trusted_cpu_isa,
)
from .logs import (
    COMPILE_PHASES,
    CONVERT_FRAME_LOGGER,
    RECOMPILES_LOGGER,
    RecompileLogTap,
    compile_events,
    install_recompile_log_tap,
    remove_recompile_log_tap,
)
from .modules import (
    compiled_call,
    get_fp32_precision,
    has_compiled_call,
    has_fp32_precision_api,
    module_hook_dicts,
    operator_name,
    operator_python_kernels,
    orig_module,
    set_compiled_call,
    set_fp32_precision,
    tensor_version,
)
from .trace import trace_state, traced_code_objects

__all__ = [
    "TorchAPIMissing",
    "RECOMPILE_LIMIT_SETTING",
    "INDUCTOR_DETERMINISTIC_SETTING",
    "RECOMPILES_LOGGER",
    "CONVERT_FRAME_LOGGER",
    "recompile_limit",
    "specialize_int",
    "dynamo_counters",
    "dynamo_global_state",
    "cache_entry_count",
    "cache_entry_guards",
    "supports_guard_filter_fn",
    "inductor_mode_options",
    "is_compile_error",
    "clear_inductor_caches",
    "has_fp32_precision_api",
    "get_fp32_precision",
    "set_fp32_precision",
    "inductor_deterministic",
    "set_inductor_deterministic",
    "RecompileLogTap",
    "install_recompile_log_tap",
    "remove_recompile_log_tap",
    "compile_events",
    "COMPILE_PHASES",
    "compile_activity",
    "PROBE_CPU_ISA_ENV",
    "trusted_cpu_isa",
    "while_compiling",
    "fast_isa_probe_child",
    "COMPILE_STACK_MODULES",
    "import_compile_stack",
    "tensor_version",
    "orig_module",
    "has_compiled_call",
    "compiled_call",
    "set_compiled_call",
    "PRECOMPILED_ENV",
    "aot_compile_support",
    "aot_compile_enabled",
    "guard_serialisable",
    "portable_guard_state",
    "built_kernel_loads",
    "checked_once",
    "pick_cpu_isa",
    "traced_modules",
    "artifact_guard_manager",
    "guard_failure",
    "compile_config_digest",
    "module_hook_dicts",
    "operator_python_kernels",
    "trace_state",
    "GuardTree",
    "guard_tree_support",
    "leaf_count",
    "traced_code_objects",
    "MACHINE_CONFIG_KEYS",
    "duplicate_source",
    "guard_arguments",
    "operator_name",
    "is_graph_break",
    "inductor_simdlen",
    "set_inductor_simdlen",
    "libtorch_cpu",
]

"""ComfyUI glue for Steadfast's optimizations, one concern a module, built on ModelPatcher's official extension points.

Everything here works on a ``model.clone()`` and touches the shared ``nn.Module`` only through
ModelPatcher mechanisms that are undone by ComfyUI (object patches) or by our own keyed callbacks
(channels-last is restored in ``ON_CLEANUP``). Nothing monkeypatches ComfyUI or torch. Each public
``add_x(model, ...)`` returns a :class:`core.optimize.plan.StepReport`, the step report the pipeline path uses too;
Optimize Model runs them as one ordered plan (:mod:`core.optimize.plan`).

Keys used (``remove_*_with_key`` makes re-application idempotent):

=============================  ==========================================  ======================================
key                            extension point                             job (module)
=============================  ==========================================  ======================================
``steadfast.determinism``      ``WrappersMP.OUTER_SAMPLE``                 apply + restore the policy
                                                                           (:mod:`.determinism`)
``steadfast.batch_invariant``  ``WrappersMP.CALC_COND_BATCH``              one model call per row
                                                                           (:mod:`.batch_invariance`)
``steadfast.compile``          ``WrappersMP.APPLY_MODEL``                  swap compiled blocks in/out
                                                                           (:mod:`.compile`)
``steadfast.qkv``              object patches + ``CallbacksMP.ON_PRE_RUN``  fused q/k/v projections (:mod:`.qkv`)
``steadfast.layout``           ``ON_PRE_RUN`` / ``ON_CLEANUP``             channels-last for the run only
                                                                           (:mod:`.layout`)
``steadfast.quantize``         object patches + ``ON_PRE_RUN`` / ``ON_DETACH``  quantized Linears (:mod:`.quantize`)
=============================  ==========================================  ======================================

Also: :mod:`.attention` (the SDPA override in ``transformer_options``), :mod:`.precision` (ComfyUI's compute-dtype
patch), :mod:`.dynamic_vram` (Dynamic VRAM and the Comfy Compiler), :mod:`.options` (``SteadfastOptions``, at
``model_options["steadfast"]``).
Import the modules (``from .patches import qkv``); this package re-exports nothing.
"""

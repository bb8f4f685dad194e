"""Compiled code kept across processes: the persistent compile cache (:mod:`.cache`, where it may live:
:mod:`.cache_location`), the fleet's artifact of a cache folder (:mod:`.artifact`), the compile stack imported at
server start (:mod:`.preload`), and the precompiled route (:mod:`.precompiled`): torch's ``aot_compile`` artifacts of
regional blocks, each answering only the configuration its trace ran (the call's key, :mod:`.call_key`; its variants,
:mod:`.variants`; the code the trace ran, :mod:`.traced_code`; the guards the pack carries, :mod:`.carried_guards`;
the route's counters, :mod:`.route_state`).

:mod:`core.compile` keeps the in-process jit (options, blocks, swap, guard filters, registry, recompiles); this
package builds on it and is imported only by what keeps compiled code across processes. No ComfyUI imports.
"""

# The contract of gradcore/_core.pyx.
#
# No other extension module cimports the core: everything here is reached
# from Python, so this file declares no C-level names (a cdef class declared
# here would have to carry its attributes here too, and callers would bind
# to its layout). What the rest of gradcore may rely on is the Python-level
# surface below; anything else in _core.pyx (names starting with "_" that
# are not listed) is private and may change.
#
# Classes
#   Tensor            the array type; fields _data, _device, grad, _version
#                     are read and written by gradcore's Python modules
#   OpBase            compiled base of gradcore.op.Op (per-op caches)
#   OpFunction        F.xxx wrapper around one single-output op
#   GradKey           one recording (a tape): enter/exit/attach/backward,
#                     tracks, is_attached, recording, phase, owner_name,
#                     records_in_this_thread, entered_in_this_thread
#   CompiledBackward  a backward graph ready to run (filled by gradcore.graph)
#   GradRuleFallback, NotDifferentiableError
#
# Functions
#   apply, apply1, wrap_array, shape_carrier, broadcast_view
#   register_grad_rule, unregister_grad_rule, registered_grad_rule
#   _install_hooks       called once at import by the Python modules
#   _record_custom       records already computed outputs (Function paths)
#   _set_anomaly, _anomaly_enabled
#   _thread_state        the calling thread's recording state (see below)
#   _set_group_priority, _no_record_enter, _no_record_exit
#   _recording_keys, _debug_state, _clear_front_cache, _recorded_graph,
#   _bump_version, _rebuild_tensor (pickling)
#
# Threads (docs/core.md, "Threading model")
#   Per thread (_ThreadState, looked up by a cached thread-ident compare):
#   no-record depth, the visibility bound of the backward in progress, the
#   group priority while a GradManager group enters, the managers whose
#   backward runs in the thread. A GradKey records only ops run by the
#   thread that entered it (its owner); its backward may run in any thread.
#   Shared: the list of recording keys, the priority and node counters, the
#   backward-graph caches (_bw_front, OpBase._cb_cache/_last_key/_last_cb),
#   the rule registries, the small-array caches. Every shared read-modify-
#   write is C code with no point where the GIL can change hands in between,
#   or a cache whose racing fills store equal values.

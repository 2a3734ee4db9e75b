# The host caching allocator for NumPy array data (gradcore/_host_pool.pyx).
#
# Contract:
#   - ``install()`` makes the pool NumPy's data allocator (NEP 49 handler) in
#     the calling context (NumPy keeps the handler in a context variable, so
#     per thread); ``set_handler(h)`` puts back any handler; both return the
#     one replaced. ``is_active()`` says whether arrays made now use the pool.
#   - Every block the handler returns carries a header in front of its data,
#     so ``free`` and ``realloc`` never trust the size NumPy passes; blocks
#     made before ``install`` (NumPy's own) are never handed to this free.
#   - Large blocks (32 KiB and more) are rounded to 8 size classes per power
#     of two and kept when freed, up to ``set_limit(nbytes)`` bytes; a block
#     that would exceed the bound empties the cache first. Small blocks are
#     rounded to 16 bytes and a few per size are kept. ``empty_cache()``
#     frees the kept large blocks; ``stats()`` reports hits, misses, cached
#     bytes, the limit and flushes.
#   - The handler's functions hold no Python object and never take the GIL:
#     one spin lock guards the free lists for a few pointer moves, so the
#     pool is safe from any thread, with or without the GIL.
#   - Nothing here knows about tensors, devices or graphs
#     (gradcore/memory.py is its Python face).

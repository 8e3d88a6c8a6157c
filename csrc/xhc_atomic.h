/* SPDX-License-Identifier: BSD-3-Clause */
/* xhc_atomic.h: the few atomic operations the core synchronises with. */
#ifndef XHC_ATOMIC_H
#define XHC_ATOMIC_H

#include <stdatomic.h>
#include <stdint.h>

typedef _Atomic uint64_t xhc_flag_t;

/* Publish: every write before it is visible to a reader that sees V. */
#define xhc_store_release(p, v) \
    atomic_store_explicit((p), (v), memory_order_release)
/* Observe: every read after it sees what the writer did before its store. */
#define xhc_load_acquire(p) \
    atomic_load_explicit((p), memory_order_acquire)
#define xhc_load_relaxed(p) \
    atomic_load_explicit((p), memory_order_relaxed)
#define xhc_store_relaxed(p, v) \
    atomic_store_explicit((p), (v), memory_order_relaxed)

/* Sequence numbers are 64-bit and compared modulo 2^64, so a counter that
 * wraps still orders correctly while two ranks are less than 2^63 ops
 * apart (they are never more than a few ops apart). */
static inline int xhc_seq_reached(uint64_t have, uint64_t want)
{
    return (int64_t)(have - want) >= 0;
}

static inline void xhc_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif

"""Probes of what the host gives two threads right now, for benches whose 2-thread figures move with it.

- fma(): a loop of vector FMAs on registers only (8 independent chains), 2-thread time over 1-thread time: ~1.0
  where the two CPUs have their own FMA units, ~2.0 where they are two hardware threads of one core.
- stream(): 64 MiB read twice per thread, 2-thread bandwidth over 1-thread bandwidth: how far the two CPUs share one
  path to memory. On the 2-vCPU dev VM it reads ~1.4 while they share a last-level cache and ~1.9 while each has its
  own, and in the second state threads that hand data to each other slow down (bench/RESULTS.md): above
  STREAM_APART a 2-thread figure was taken with the CPUs apart.

The probes are C compiled through the runtime's kernel cache; the two threads start together at a barrier. The
stream buffers (128 MiB) are allocated and touched on the first stream() and freed by close().
"""
from __future__ import annotations

import ctypes

from runtime.cache import DEFAULT_KERNELS

STREAM_APART = 1.7

PROBE_SOURCE = r"""#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
typedef float vf __attribute__((vector_size(64)));
#define HP_STREAM ((64 << 20) / 64)   /* vectors per thread's buffer: 64 MiB */
static vf* hp_buf[2];
static pthread_barrier_t hp_bar;
static int hp_kind;
static double hp_took[2];
static double hp_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void* hp_one(void* p) {
  const int me = (int)(intptr_t)p;
  vf a = {0}, b = {0}, c = {0}, d = {0}, e = {0}, f = {0}, g = {0}, h = {0}, x, y;
  for (int j = 0; j < 16; j++) { x[j] = 1.0f + j * 1e-7f; y[j] = 0.999999f; }
  pthread_barrier_wait(&hp_bar);
  const double t = hp_now();
  if (hp_kind == 0) {
    for (int64_t i = 0; i < 2000000; i++) {
      __asm__ volatile("" : "+x"(x), "+x"(y));
      a = a * y + x; b = b * y + x; c = c * y + x; d = d * y + x; e = e * y + x; f = f * y + x; g = g * y + x; h = h * y + x;
    }
  } else {
    const vf* s = hp_buf[me];
    for (int r = 0; r < 2; r++)
      for (int64_t i = 0; i < HP_STREAM; i += 4) { a += s[i]; b += s[i + 1]; c += s[i + 2]; d += s[i + 3]; }
  }
  hp_took[me] = hp_now() - t;
  a += b + c + d + e + f + g + h;
  return (void*)(intptr_t)(a[0] > 1e30f);
}
/* Seconds the slower thread took; kind 0 fma, 1 stream; -1 where a buffer or a thread could not be had. */
double hp_probe(int kind, int threads) {
  for (int k = 0; k < 2 && kind == 1; k++) {
    if (hp_buf[k]) continue;
    if (!(hp_buf[k] = aligned_alloc(64, (size_t)HP_STREAM * 64))) return -1;
    for (int64_t i = 0; i < HP_STREAM; i++) hp_buf[k][i] = (vf){0};   /* touched once: no page faults in the timing */
  }
  hp_kind = kind;
  pthread_barrier_init(&hp_bar, 0, (unsigned)threads);
  pthread_t t;
  if (threads == 2 && pthread_create(&t, 0, hp_one, (void*)1) != 0) { pthread_barrier_destroy(&hp_bar); return -1; }
  hp_one((void*)0);
  if (threads == 2) pthread_join(t, 0);
  pthread_barrier_destroy(&hp_bar);
  return threads == 2 && hp_took[1] > hp_took[0] ? hp_took[1] : hp_took[0];
}
void hp_free(void) { for (int k = 0; k < 2; k++) { free(hp_buf[k]); hp_buf[k] = 0; } }
"""


class ProbeError(RuntimeError):
  """A probe could not start its second thread or allocate its buffer."""


class HostProbe:
  def __init__(self):
    (self._lk,), _ = DEFAULT_KERNELS.get_many([(PROBE_SOURCE, "hp_probe")], "host_probe")
    self._fn = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_int, ctypes.c_int)(self._lk.address)
    self._free = ctypes.CFUNCTYPE(None)(ctypes.cast(self._lk.lib.hp_free, ctypes.c_void_p).value)

  def _pair(self, kind: int) -> tuple[float, float]:
    one, two = self._fn(kind, 1), self._fn(kind, 2)
    if one <= 0 or two <= 0:
      raise ProbeError("a host probe could not start its second thread or allocate its 128 MiB")
    return one, two

  def fma(self) -> float:
    one, two = self._pair(0)
    return two / one

  def stream(self) -> float:
    one, two = self._pair(1)
    return 2 * one / two

  def close(self) -> None:
    self._free()

  def __enter__(self) -> HostProbe:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
